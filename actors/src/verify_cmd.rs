//! `msgexchange verify`: the pipeline's invariants (docs/operations.md, "Verifying the
//! stores") against the stores directly (no service needed). One line per invariant with its
//! scope; `--json` for machines. Exit code 0 when all hold, 1 on a violation, 2 when the check
//! could not run.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use msgx_core::inbox::Inbox;
use msgx_core::settings::Settings;
use msgx_core::store::Store;
use msgx_core::verify::{kafka::KafkaCheck, verify, Report, VerifyInput};

/// `verify` options.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Rows per page (every check reads in pages of this size; the result does not depend on
    /// it).
    #[arg(long, default_value_t = 5000)]
    pub batch: u32,
    /// Also read SENT events back from Kafka (`kafka.brokers`, `kafka.topic`).
    #[arg(long)]
    pub kafka: bool,
}

/// The inputs from the settings (the HTTP handler uses the same).
pub fn input(
    settings: &Settings,
    inbox: Inbox,
    store: Store,
    batch: u32,
    kafka: Option<String>,
) -> anyhow::Result<VerifyInput> {
    Ok(VerifyInput {
        inbox,
        names: settings.inbox_names().clone(),
        store,
        mark_value: settings.backfill.mark_value.clone(),
        batch,
        kafka: kafka.map(|bootstrap| KafkaCheck {
            bootstrap,
            kafka: settings.kafka.clone(),
            topic: settings.kafka.topic.clone(),
            poll_timeout: Duration::from_secs(10),
        }),
    })
}

/// Runs the check; `Ok(report)` whatever it found (the caller picks the exit code).
pub async fn run(settings: &Settings, args: &VerifyArgs) -> anyhow::Result<Report> {
    // Read only: never creates or migrates anything (Store::open).
    let store = Store::open(&settings.store)
        .await
        .context("verify: cannot open the store")?;
    let inbox = Inbox::new(
        &settings.inbox,
        settings.inbox_names(),
        settings.inbox_timezone(),
    )?;
    let kafka = if args.kafka {
        anyhow::ensure!(
            !settings.kafka.is_embedded(),
            "verify --kafka needs a real kafka.brokers (the embedded cluster lives in the service)"
        );
        Some(settings.kafka.brokers.trim().to_string())
    } else {
        None
    };
    let input = input(settings, inbox, store, args.batch, kafka)?;
    Ok(verify(&input).await?)
}

/// Prints the report; returns the exit code (0 ok, 1 violation).
pub fn print(report: &Report, json: bool) -> u8 {
    if json {
        match serde_json::to_string_pretty(report) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("msgexchange: verify: {e}"),
        }
    } else {
        for line in report.lines() {
            println!("{line}");
        }
        println!(
            "{}",
            if report.ok() {
                "verify: every invariant holds"
            } else {
                "verify: VIOLATIONS found"
            }
        );
    }
    if report.ok() {
        0
    } else {
        1
    }
}
