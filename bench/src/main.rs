//! The `msgx-bench` binary: the benchmarks, outside the production `msgexchange` binary. Each
//! prints its throughput or latency next to the bare limits measured in the same run.

use std::io::IsTerminal as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use msgx_core::settings::Settings;
use tracing_subscriber::EnvFilter;

/// msgx-bench: msgexchange benchmarks on fresh bench databases (same servers as configured).
#[derive(Debug, Parser)]
#[command(name = "msgx-bench", version, about)]
struct Cli {
    /// Base configuration file (then `--config-extra`, then MSGX_SECTION__KEY variables).
    #[arg(
        long,
        env = "MSGEXCHANGE_CONFIG",
        default_value = "config/default.toml",
        global = true
    )]
    config: PathBuf,
    /// Optional file layered over the base (site settings).
    #[arg(long, global = true)]
    config_extra: Option<PathBuf>,
    #[command(subcommand)]
    command: BenchCommand,
}

/// Benchmarks.
#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Enqueue throughput over a backlog vs the bare multi-row INSERT rate into PostgreSQL.
    Enqueue(msgx_bench::EnqueueBenchArgs),
    /// Pump throughput over a backlog vs the bare single-connection PostgreSQL commit rate.
    Pump(msgx_bench::PumpBenchArgs),
    /// Backfill marks per second vs the bare single-row UPDATE rate on the inbox; oldest
    /// unmarked row under steady load.
    Mark(msgx_bench::MarkBenchArgs),
    /// Events per second to Kafka vs a bare produce loop and a bare batched UPDATE; commit →
    /// ack latency under a steady rate, beside a bare produce-latency probe.
    Dispatch(msgx_bench::DispatchBenchArgs),
    /// The whole service drains an inbox backlog (enqueue, process, mark, deliver): throughput
    /// per stage per tenth, total time, peak RSS.
    E2e(msgx_bench::E2eBenchArgs),
    /// Discovery lag (commit → enqueued) under concurrent writers with rollbacks and held
    /// commits, per minute, next to the bound max_commit_delay + 2 × poll_interval.
    Discovery(msgx_bench::DiscoveryBenchArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let mut settings =
        match Settings::load_layered(Some(cli.config.as_path()), cli.config_extra.as_deref())
            .with_context(|| format!("loading {} (and MSGX_* environment)", cli.config.display()))
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("msgx-bench: {e:#}");
                return std::process::ExitCode::from(2);
            }
        };
    // A dev tool: an unset kafka.brokers means the in-process mock cluster here (the service
    // refuses to start without it).
    if settings.kafka.brokers.trim().is_empty() {
        settings.kafka.brokers = "embedded".into();
    }
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.log.level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // No colour codes when stderr is redirected to a file.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // `[traces]` as the service has it (MSGX_TRACES__ENABLED=true …): the message spans and the
    // export queue, for the cost of tracing (docs/performance.md); started before the runtime,
    // as the service does.
    let traces = match msgx_actors::traces::start(&settings) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("msgx-bench: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let system = actix_rt::System::new();
    let result = system.block_on(async move {
        match cli.command {
            BenchCommand::Enqueue(args) => msgx_bench::enqueue(&settings, &args).await,
            BenchCommand::Pump(args) => msgx_bench::pump(&settings, &args).await,
            BenchCommand::Mark(args) => msgx_bench::mark(&settings, &args).await,
            BenchCommand::Dispatch(args) => msgx_bench::dispatch(&settings, &args).await,
            BenchCommand::E2e(args) => msgx_bench::e2e(&settings, &args).await,
            BenchCommand::Discovery(args) => msgx_bench::discovery(&settings, &args).await,
        }
    });
    if let Some(t) = traces {
        t.shutdown(std::time::Duration::from_secs(5));
    }
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("msgx-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
