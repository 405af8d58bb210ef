//! The `msgexchange` binary: the only place errors become `anyhow` and exit codes.

use clap::Parser;
use msgx_actors::cli::{self, BenchCommand, Cli, Command, DevCommand};
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let settings = match cli::load_settings(&cli) {
        Ok(s) => s,
        Err(e) => {
            // One clear line naming the key (see Settings::validate).
            eprintln!("msgexchange: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    init_logging(&settings.log.level, &settings.log.format);
    let system = actix_rt::System::new();
    if let Some(Command::Verify(args)) = &cli.command {
        // Exit 1 on a violation, 2 when the check could not run.
        return match system.block_on(msgx_actors::verify_cmd::run(&settings, args)) {
            Ok(report) => {
                std::process::ExitCode::from(msgx_actors::verify_cmd::print(&report, args.json))
            }
            Err(e) => {
                eprintln!("msgexchange: {e:#}");
                std::process::ExitCode::from(2)
            }
        };
    }
    let result = system.block_on(async move {
        match cli.command.unwrap_or(Command::Run) {
            Command::Run => msgx_actors::app::run_service(settings).await,
            Command::CheckConfig => {
                println!("{settings:#?}");
                println!("configuration OK");
                Ok(())
            }
            Command::Dev(DevCommand::InboxFixture) => cli::inbox_fixture(&settings).await,
            Command::Dev(DevCommand::SimulateUpstream(args)) => {
                cli::simulate_upstream(&settings, &args).await
            }
            Command::Bench(BenchCommand::Enqueue(args)) => {
                msgx_actors::bench::enqueue(&settings, &args).await
            }
            Command::Bench(BenchCommand::Pump(args)) => {
                msgx_actors::bench::pump(&settings, &args).await
            }
            Command::Bench(BenchCommand::Mark(args)) => {
                msgx_actors::bench::mark(&settings, &args).await
            }
            Command::Bench(BenchCommand::Dispatch(args)) => {
                msgx_actors::bench::dispatch(&settings, &args).await
            }
            Command::Request(cmd) => msgx_actors::request::run(&settings, &cmd).await,
            Command::Verify(_) => Ok(()), // handled above (own exit codes)
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "msgexchange stopped with an error");
            eprintln!("msgexchange: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(level: &str, format: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}
