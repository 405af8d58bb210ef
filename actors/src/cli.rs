//! The `msgexchange` command line: run the service (default), check the configuration, and
//! the dev tools that act as the DB owner or as upstream (benchmarks: the `msgx-bench` binary).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use msgx_core::devtools::{fixture, simulator};
use msgx_core::settings::{redact_url, Settings};

/// msgexchange moves upstream flight messages from the shared MySQL inbox (CMINMSGS) into its
/// own PostgreSQL, processes them strictly in order into flight state, marks each processed
/// inbox row and delivers the resulting events to Kafka.
///
/// Without a subcommand it runs the service. The operator commands (status, inspect, replay,
/// recover-backfill, events, …) talk to the databases directly and work while the service is
/// down; every change they make is audited (who, why, ticket). They never create a database or
/// migrate a schema: the store must carry this binary's schema (`migrate`).
///
/// Configuration: the built-in defaults (config/default.toml, compiled in), then --config FILE,
/// then --config-extra FILE, then MSGX_<SECTION>__<KEY> environment variables, e.g.
/// MSGX_STORE__URL=postgres://user:pw@db/msgx. `msgexchange check-config` prints the result.
#[derive(Debug, Parser)]
#[command(name = "msgexchange", version)]
pub struct Cli {
    /// Configuration file layered over the built-in defaults (a full copy of
    /// config/default.toml or just the keys to change).
    #[arg(long, env = "MSGEXCHANGE_CONFIG", global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A second file layered over --config (site or secret settings).
    #[arg(long, global = true, value_name = "FILE")]
    pub config_extra: Option<PathBuf>,
    /// What to do; `run` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service (the default): poll the inbox, process, mark, deliver; serve /metrics,
    /// /healthz, /readyz and, with tokens configured, the admin API. Stops on SIGTERM/Ctrl-C.
    Run,
    /// Validate the configuration and print the effective settings as TOML, secrets redacted.
    /// Exit code 2 and one line naming the key when a value is wrong.
    CheckConfig,
    /// Bring the store's schema to this binary's: creates the database when
    /// store.create_database is on, applies the pending migrations and prints their versions.
    /// Idempotent; refuses a schema newer than this binary's. `run` does the same at start
    /// unless store.migrate_at_start is off; no other command ever migrates.
    Migrate,
    /// Tools acting as the DB owner or as upstream (dev, tests, demo). Never for production.
    #[command(subcommand)]
    Dev(DevCommand),
    /// Requests to upstream through the outbound table (reconciles leftovers first).
    #[command(subcommand)]
    Request(crate::request::RequestCommand),
    /// The pipeline at a glance: watermark, open hole, FIFO head, backlog, drain estimate,
    /// backfill, dispatch and who holds the lease. `--watch` refreshes it.
    Status(crate::cli_ops::StatusArgs),
    /// One message: its processing record, inbox row (metadata), events and audit trail.
    Inspect(crate::cli_ops::InspectArgs),
    /// Put DEAD/FAILED messages of a replayable class (CODEC_ERROR, UNSUPPORTED, INFRA,
    /// EXHAUSTED) back to PENDING, by ids (with the state you saw) or by class and id range.
    /// Use --dry-run first. Audited.
    Replay(crate::cli_ops::ReplayArgs),
    /// Reschedule the inbox marking of rows whose backfill was abandoned (MISSING_ROW,
    /// MAX_ATTEMPTS), e.g. after the DB owner restored the rows. Audited.
    RecoverBackfill(crate::cli_ops::RecoverArgs),
    /// Events that could not be delivered to Kafka (DEAD): list them, send them again.
    #[command(subcommand)]
    Events(crate::cli_ops::EventsCommand),
    /// Check the pipeline's invariants against the stores; each is listed with its exceptions
    /// in docs/operations.md, "Verifying the stores" (exit 0 ok, 1 violation, 2 error).
    Verify(crate::verify_cmd::VerifyArgs),
    /// Backlog survey (seed §5.3): id range, count, receive-time span and TYPE/STYP
    /// distribution of the unprocessed backlog, or of an id or receive-time range. Read only.
    Survey(crate::cli_ops::SurveyArgs),
    /// Approved skip (seed §5.3): unfinished rows (PENDING/FAILED) of an id range at or below W
    /// become SKIPPED(APPROVED_SKIP); the sweep then marks them. Needs approver, reason and
    /// ticket; use --dry-run first. Audited per batch. Never deletes.
    Skip(crate::cli_ops::SkipArgs),
    /// Purge readiness (seed §6): are all inbox rows of a range marked; the unmarked ones by
    /// reason; the purge boundary (highest id and time below which everything is marked).
    PurgeReadiness(crate::cli_ops::PurgeArgs),
    /// Cutover (seed §5.1): `plan` shows what a mode of pipeline.cutover_watermark would do —
    /// the W it seeds, the stock it skips or reads, the stock rows left unmarked. Read only.
    #[command(subcommand)]
    Cutover(crate::cli_ops::CutoverCommand),
}

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

/// Loads and validates the settings: built-in defaults, `--config`, `--config-extra`, env.
pub fn load_settings(cli: &Cli) -> anyhow::Result<Settings> {
    Settings::load_layered(cli.config.as_deref(), cli.config_extra.as_deref())
        .with_context(|| config_sources(cli))
}

/// The effective configuration as TOML with secrets redacted (`check-config`).
pub fn effective_config(cli: &Cli) -> anyhow::Result<String> {
    Settings::effective_toml(cli.config.as_deref(), cli.config_extra.as_deref(), None)
        .with_context(|| config_sources(cli))
}

fn config_sources(cli: &Cli) -> String {
    let mut sources = vec!["built-in defaults".to_string()];
    sources.extend(cli.config.iter().map(|p| p.display().to_string()));
    sources.extend(cli.config_extra.iter().map(|p| p.display().to_string()));
    format!("loading {} and MSGX_* environment", sources.join(", "))
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

/// Creates the inbox tables (configured names) in the inbox at `url`, as the DB owner (the
/// bench creates them in its own inbox database).
pub async fn create_inbox_fixture_at(url: &str, settings: &Settings) -> anyhow::Result<()> {
    fixture::create_inbox_fixture(url, settings.inbox_names(), settings.outbox_names())
        .await
        .with_context(|| format!("creating the inbox fixture at {}", redact_url(url)))
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

/// `msgexchange migrate`: prints each migration applied, or that the schema is current.
pub async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    let applied = msgx_core::store::Store::migrate(&settings.store)
        .await
        .with_context(|| {
            format!(
                "migrating the store at {}",
                redact_url(&settings.store.connect.url)
            )
        })?;
    let version = msgx_core::store::schema::binary_version();
    if applied.is_empty() {
        println!("store schema is current (version {version}); nothing to apply");
    } else {
        for v in &applied {
            println!("applied migration {v}");
        }
        println!(
            "store schema is now at version {version} ({} applied)",
            applied.len()
        );
    }
    Ok(())
}
