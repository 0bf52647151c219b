//! The `incus-hpa` binary: parse the command line, set up logging, dispatch.

use std::process::ExitCode;

use clap::Parser;
use incus_hpa::{app, cli::Cli, cli::Command, logging};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Validate { config } = &cli.command {
        return app::validate(config);
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
            Command::Validate { .. } => unreachable!("handled above"),
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
