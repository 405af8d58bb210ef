//! The `msgexchange` command line: run the service (default), check the configuration, and
//! the operator commands. The dev tools (the `dev-tools` feature) are in [`crate::dev_cli`];
//! benchmarks are the `msgx-bench` binary.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use msgx_core::devtools::fixture;
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
    CheckConfig(CheckConfigArgs),
    /// Bring the store's schema to this binary's: creates the database when
    /// store.create_database is on, applies the pending migrations and prints their versions.
    /// Idempotent; refuses a schema newer than this binary's. `run` does the same at start
    /// unless store.migrate_at_start is off; no other command ever migrates.
    Migrate,
    /// Tools acting as the DB owner or as upstream (dev, tests, demo). Only in a build with
    /// the `dev-tools` feature: the Debian package's binary has no `dev` command.
    #[cfg(feature = "dev-tools")]
    #[command(subcommand)]
    Dev(crate::dev_cli::DevCommand),
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

/// `check-config` options.
#[derive(Debug, clap::Args)]
pub struct CheckConfigArgs {
    /// Instead of the TOML, connect with the configured inbox and store accounts and print,
    /// one line each, the needed privileges they lack and those they hold beyond the need
    /// (docs/operations.md, "Database accounts"). Exit 2 when a needed one is missing.
    #[arg(long)]
    pub probe: bool,
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

/// Creates the inbox tables (configured names) in the inbox at `url`, as the DB owner (the
/// bench creates them in its own inbox database).
pub async fn create_inbox_fixture_at(url: &str, settings: &Settings) -> anyhow::Result<()> {
    fixture::create_inbox_fixture(url, settings.inbox_names(), settings.outbox_names())
        .await
        .with_context(|| format!("creating the inbox fixture at {}", redact_url(url)))
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
