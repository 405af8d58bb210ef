//! `msgexchange dev …`: tools acting as the DB owner or as upstream, for development, the
//! tests and the demo. They write into whatever inbox is configured, so they are compiled only
//! with the `dev-tools` feature (the tests' harness and `scripts/demo.sh` turn it on; the Debian
//! package is built without it).

use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use msgx_core::devtools::{fixture, simulator};
use msgx_core::settings::{redact_url, Settings};

/// Dev tools.
#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// Create CMINMSGS and COUTMSGS (configured names) in the inbox database, as the DB owner.
    InboxFixture,
    /// Write realistic upstream messages into the inbox (holds, rollbacks, malformed rows).
    SimulateUpstream(SimArgs),
}

/// Simulator knobs.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Messages per second over all connections (0 = as fast as possible).
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Concurrent MySQL connections writing (a held transaction blocks its connection).
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Stop after this many messages.
    #[arg(long)]
    pub total: Option<u64>,
    /// Stop after this long (e.g. "10m"); runs until Ctrl-C when neither limit is given.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Share of transactions held open for a random delay (late commits).
    #[arg(long, default_value_t = 0.05)]
    pub hold_fraction: f64,
    /// Longest hold.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    pub hold_max: Duration,
    /// Share of inserts rolled back (permanent holes).
    #[arg(long, default_value_t = 0.01)]
    pub rollback_fraction: f64,
    /// Share of rows with a NULL receive time.
    #[arg(long, default_value_t = 0.005)]
    pub null_received_fraction: f64,
    /// Share of malformed messages (DEAD on arrival).
    #[arg(long, default_value_t = 0.02)]
    pub malformed_fraction: f64,
    /// Share of well-formed messages of an unknown type (FAILED UNSUPPORTED: they hold the
    /// FIFO head until poison escalation).
    #[arg(long, default_value_t = 0.01)]
    pub unknown_type_fraction: f64,
    /// Share of huge messages (a big airport's full daily schedule, just over 1 MiB, thousands
    /// of flights: the FIFO waits while one is processed).
    #[arg(long, default_value_t = 0.001)]
    pub huge_fraction: f64,
    /// Random seed for repeatable runs; by default from the clock, so a second run against the
    /// same inbox does not repeat message identities (SEQN).
    #[arg(long)]
    pub seed: Option<u64>,
}

/// `dev inbox-fixture`.
pub async fn inbox_fixture(settings: &Settings) -> anyhow::Result<()> {
    let options = msgx_core::inbox::connect_options(&settings.inbox)?;
    fixture::create_inbox_fixture_with(options, settings.inbox_names(), settings.outbox_names())
        .await
        .with_context(|| {
            format!(
                "creating the inbox fixture at {}",
                redact_url(&settings.inbox.connect.url)
            )
        })?;
    println!(
        "inbox fixture ready: {} and {} in {}",
        settings.inbox.table,
        settings.inbox.out_table,
        redact_url(&settings.inbox.connect.url)
    );
    Ok(())
}

/// `dev simulate-upstream`.
pub async fn simulate_upstream(settings: &Settings, args: &SimArgs) -> anyhow::Result<()> {
    // Its own pool, one connection per writer: a held transaction keeps its connection.
    let options = msgx_core::inbox::connect_options(&settings.inbox)?;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(args.connections.max(1) as u32)
        .acquire_timeout(settings.inbox.connect_timeout)
        .connect_with(options)
        .await
        .with_context(|| format!("connecting to {}", redact_url(&settings.inbox.connect.url)))?;
    let mix = msgx_core::devtools::messages::Mix {
        malformed: args.malformed_fraction,
        unknown_type: args.unknown_type_fraction,
        ..msgx_core::devtools::messages::Mix::default()
    };
    let defaults = simulator::SimConfig::default();
    let cfg = simulator::SimConfig {
        rate_per_sec: args.rate,
        connections: args.connections.max(1),
        total: args.total,
        duration: args.duration,
        hold_fraction: args.hold_fraction,
        hold_max: args.hold_max,
        rollback_fraction: args.rollback_fraction,
        null_received_fraction: args.null_received_fraction,
        huge_fraction: args.huge_fraction,
        mix,
        seed: args.seed.unwrap_or(defaults.seed),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = stop_tx.send(true);
        }
    });
    let report = simulator::simulate(
        &pool,
        settings.inbox_names(),
        settings.inbox_timezone(),
        &cfg,
        stop_rx,
    )
    .await?;
    println!(
        "simulated upstream: {} committed, {} rolled back, {} held open, in {:.1}s",
        report.committed(),
        report.rolled_back(),
        report.held,
        report.elapsed.as_secs_f64()
    );
    Ok(())
}
