//! The `incus-hpa` binary: parse the command line, set up logging, dispatch.

use std::future::Future;
use std::process::ExitCode;

use clap::Parser;
use incus_hpa::{app, cli::Cli, cli::Command, logging, manual};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Validate {
            config,
            syntax_only,
        } => app::validate(config, *syntax_only),
        Command::GenerateAssets { dir } => match manual::generate_assets(dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("incus-hpa: cannot write to {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        },
        Command::Run { config } => block_on(app::run(cli.incus_socket.as_deref(), config)),
        Command::Simulate(args) => incus_hpa::simulate::command::run(args),
        Command::Advise(args) => incus_hpa::simulate::advise_cmd::run(args),
        Command::Hook { hook } => incus_hpa::hooks::run(hook),
        Command::Plan { config } => block_on(app::plan(cli.incus_socket.as_deref(), config)),
        Command::Status {
            group,
            json,
            control_socket,
            config,
            timeout,
        } => {
            let socket = control_socket
                .clone()
                .unwrap_or_else(|| app::control_socket_of(config));
            let asked = app::Asked {
                json: *json,
                group: group.as_deref(),
                dir: app::state_directory_of(config),
            };
            block_on(app::status(&socket, asked, *timeout))
        }
    }
}

/// Runs an async command on a single-threaded runtime, with logging set up; errors end up on
/// stderr (and so in the journal) as one line with their causes.
fn block_on(command: impl Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
    logging::init();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(command));
    result.unwrap_or_else(|e| {
        eprintln!("incus-hpa: {e:#}");
        ExitCode::FAILURE
    })
}
