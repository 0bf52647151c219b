//! The `incus-hpa` binary: parse the command line, set up logging, dispatch.

use std::process::ExitCode;

use clap::Parser;
use incus_hpa::{app, cli::Cli, cli::Command, logging};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Validate { config } => return app::validate(config),
        Command::GenerateAssets { dir } => {
            return match incus_hpa::cli::generate_assets(dir) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("incus-hpa: cannot write to {}: {e}", dir.display());
                    ExitCode::FAILURE
                }
            };
        }
        Command::Run { .. } | Command::Plan { .. } => {}
    }
    logging::init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("incus-hpa: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match &cli.command {
            Command::Run { config } => app::run(&cli.incus_socket, config)
                .await
                .map(|()| ExitCode::SUCCESS),
            Command::Plan { config } => app::plan(&cli.incus_socket, config).await,
            Command::Validate { .. } | Command::GenerateAssets { .. } => Ok(ExitCode::SUCCESS),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("incus-hpa: {e:#}");
            ExitCode::FAILURE
        }
    }
}
