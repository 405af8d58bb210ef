//! The `msgexchange` binary: the only place errors become `anyhow` and exit codes.

use clap::Parser;
use msgx_actors::cli::{self, Cli, Command};
use msgx_actors::cli_ops;
#[cfg(feature = "dev-tools")]
use msgx_actors::dev_cli::{self, DevCommand};
use msgx_actors::traces::{self, log_ids::WithTraceIds};
use msgx_core::settings::Settings;
use std::process::ExitCode;
use std::time::Duration;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match cli::load_settings(&cli) {
        Ok(s) => s,
        Err(e) => {
            // One clear line naming the key (see Settings::validate).
            eprintln!("msgexchange: {}", msgx_actors::refusal::error_line(&e));
            return ExitCode::from(2);
        }
    };
    // Traces only for the service itself (`run`), started before any runtime: the OTLP
    // exporter's blocking HTTP client runs its own.
    let serving = matches!(cli.command, None | Some(Command::Run));
    let traces = match serving.then(|| traces::start(&settings)).transpose() {
        Ok(t) => t.flatten(),
        Err(e) => {
            eprintln!("msgexchange: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(
        &settings.log.level,
        &settings.log.format,
        traces.as_ref().map(|p| p.tracer.clone()),
    );
    if traces.is_some() {
        let t = &settings.traces;
        tracing::info!(
            endpoint = %t.endpoint,
            protocol = %t.protocol,
            sampling_ratio = t.sampling_ratio,
            "exporting traces over OTLP"
        );
    }
    let system = actix_rt::System::new();
    let code = run(&system, cli, settings);
    shut_down(system, code);
    if let Some(t) = traces {
        t.shutdown(TRACES_FLUSH);
    }
    ExitCode::from(code)
}

/// How long the queued spans may take to reach the collector at exit.
const TRACES_FLUSH: Duration = Duration::from_secs(3);

/// How long the system's drop may take before the process exits anyway (see [`shut_down`]).
const EXIT_BOUND: Duration = Duration::from_secs(5);

/// Drops the actix system inside its Tokio runtime, whatever ended the run (a signal, a
/// fatal lease loss, an error). Actors still alive at that point — a poll round or a pump
/// step with a statement in flight — hold pooled store connections, and sqlx hands a dropped
/// connection back to its pool by spawning a task: outside a runtime that panics ("this
/// functionality requires a Tokio context") instead of exiting with the documented code.
///
/// The drop waits for every blocking task, and a librdkafka call may still be running in one:
/// a fenced transactional producer's abort retries its epoch bump for up to
/// `kafka.transaction_timeout`. Nothing such a call does is needed once the run ended (the store
/// holds every outcome; the next holder's `init_transactions` settles an open transaction, as
/// after a `kill -9`), so after [`EXIT_BOUND`] the process exits with its code regardless.
fn shut_down(system: actix_rt::SystemRunner, code: u8) {
    std::thread::spawn(move || {
        std::thread::sleep(EXIT_BOUND);
        tracing::warn!(
            bound = ?EXIT_BOUND,
            code,
            "shutdown still waiting on a blocking call; exiting without it"
        );
        std::process::exit(code.into());
    });
    let runtime = system.runtime().tokio_runtime().handle().clone();
    let _inside = runtime.enter();
    drop(system);
}

/// Runs the command on the system; the process's exit code.
fn run(system: &actix_rt::SystemRunner, mut cli: Cli, settings: Settings) -> u8 {
    if let Some(Command::Verify(args)) = &cli.command {
        // Exit 1 on a violation, 2 when the check could not run.
        return match system.block_on(msgx_actors::verify_cmd::run(&settings, args)) {
            Ok(report) => msgx_actors::verify_cmd::print(&report, args.json),
            Err(e) => {
                eprintln!("msgexchange: {}", msgx_actors::refusal::error_line(&e));
                2
            }
        };
    }
    let result = system.block_on(async move {
        let command = cli.command.take().unwrap_or(Command::Run);
        match command {
            Command::Run => msgx_actors::app::run_service(settings).await,
            Command::CheckConfig(args) if args.probe => msgx_actors::probe::run(&settings).await,
            Command::CheckConfig(_) => match cli::effective_config(&cli) {
                Ok(toml) => {
                    print!("{toml}");
                    if let Err(missing) = msgx_actors::first_start::require_brokers(&settings) {
                        // Operator commands run without it; `run` refuses (exit 2).
                        eprintln!("note: `msgexchange run` refuses to start: {missing}");
                    }
                    eprintln!("configuration OK");
                    Ok(())
                }
                Err(e) => Err(e),
            },
            Command::Migrate => cli::migrate(&settings).await,
            #[cfg(feature = "dev-tools")]
            Command::Dev(DevCommand::InboxFixture) => dev_cli::inbox_fixture(&settings).await,
            #[cfg(feature = "dev-tools")]
            Command::Dev(DevCommand::SimulateUpstream(args)) => {
                dev_cli::simulate_upstream(&settings, &args).await
            }
            Command::Request(cmd) => msgx_actors::request::run(&settings, &cmd).await,
            Command::Status(args) => cli_ops::status(&settings, &args).await,
            Command::Inspect(args) => cli_ops::inspect(&settings, &args).await,
            Command::Replay(args) => cli_ops::replay(&settings, &args).await,
            Command::RecoverBackfill(args) => cli_ops::recover_backfill(&settings, &args).await,
            Command::Events(cmd) => cli_ops::events(&settings, &cmd).await,
            Command::Survey(args) => cli_ops::survey(&settings, &args).await,
            Command::Skip(args) => cli_ops::skip(&settings, &args).await,
            Command::PurgeReadiness(args) => cli_ops::purge_readiness(&settings, &args).await,
            Command::Cutover(cmd) => cli_ops::cutover(&settings, &cmd).await,
            Command::Verify(_) => Ok(()), // handled above (own exit codes)
        }
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            let line = msgx_actors::refusal::error_line(&e);
            tracing::error!(error = %line, "msgexchange stopped with an error");
            eprintln!("msgexchange: {line}");
            // 2 and 3: refusals a restart cannot fix (the unit's RestartPreventExitStatus).
            msgx_actors::refusal::exit_code(&e)
        }
    }
}

/// The log (stderr, text or JSON) and, with traces on, the `tracing` bridge to OpenTelemetry;
/// a log line inside an exported span carries its trace_id and span_id.
fn init_logging(level: &str, format: &str, tracer: Option<opentelemetry_sdk::trace::SdkTracer>) {
    use tracing_subscriber::fmt::format as line_format;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;

    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // Colour only on a terminal: log files and journald get plain text.
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let lines = if format == "json" {
        lines
            .json()
            .event_format(WithTraceIds::json(line_format().json()))
            .boxed()
    } else {
        lines
            .event_format(WithTraceIds::text(line_format()))
            .boxed()
    };
    // The log level filters the log only: the bridge takes the service's INFO spans whatever
    // `log.level` says (a quiet log keeps its traces). The exporter's own HTTP stack never
    // traces itself (a span per export would feed the queue it drains).
    let bridge = tracer.map(|t| {
        use tracing::level_filters::LevelFilter;
        tracing_opentelemetry::layer().with_tracer(t).with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_default(LevelFilter::INFO)
                .with_target("hyper", LevelFilter::OFF)
                .with_target("hyper_util", LevelFilter::OFF)
                .with_target("reqwest", LevelFilter::OFF)
                .with_target("opentelemetry", LevelFilter::OFF)
                .with_target("opentelemetry_sdk", LevelFilter::OFF)
                .with_target("opentelemetry_otlp", LevelFilter::OFF),
        )
    });
    tracing_subscriber::registry()
        .with(lines.with_filter(filter))
        .with(bridge)
        .init();
}
