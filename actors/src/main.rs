//! The `msgexchange` binary: the only place errors become `anyhow` and exit codes.

use clap::Parser;
use msgx_actors::cli::{self, Cli, Command, DevCommand};
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
            Command::Request(cmd) => msgx_actors::request::run(&settings, &cmd).await,
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
