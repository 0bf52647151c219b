//! The command line (clap derive): `run`, `validate`, `plan`, `status`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::DEFAULT_PATH;
use crate::incus::client::DEFAULT_SOCKET;

/// Horizontal autoscaler for Incus containers: keeps each group of instances between min and
/// max, adding instances when their average memory use is above the group's threshold.
#[derive(Debug, Parser)]
#[command(name = "incus-hpa", version, about, propagate_version = true)]
pub struct Cli {
    /// The Incus unix socket.
    #[arg(long, global = true, env = "INCUS_SOCKET", default_value = DEFAULT_SOCKET)]
    pub incus_socket: PathBuf,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon in the foreground (as systemd does).
    Run {
        /// The desired-state file.
        #[arg(long, short, default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Check a desired-state file: exit 0 when valid, 1 with every problem on stderr.
    Validate {
        /// The desired-state file.
        #[arg(long, short, default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Write the man page and shell completions into DIR (used to build the package).
    #[command(hide = true)]
    GenerateAssets {
        /// Where to write `incus-hpa.1` and the completions.
        dir: PathBuf,
    },
    /// Ask the running daemon what it thinks of each group (its control socket).
    Status {
        /// Print the stable JSON document instead of a table.
        #[arg(long)]
        json: bool,
        /// The daemon's control socket (`[daemon] control_socket`).
        #[arg(long, default_value = crate::control::DEFAULT_SOCKET)]
        control_socket: PathBuf,
    },
    /// Show what the daemon would decide now for each group, without acting (a dry run).
    Plan {
        /// The desired-state file.
        #[arg(long, short, default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
}

/// Writes `incus-hpa.1` and completions for bash, zsh and fish into `dir`.
pub fn generate_assets(dir: &std::path::Path) -> std::io::Result<()> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir)?;
    let cmd = Cli::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    std::fs::write(dir.join("incus-hpa.1"), page)?;
    for shell in [
        clap_complete::Shell::Bash,
        clap_complete::Shell::Zsh,
        clap_complete::Shell::Fish,
    ] {
        clap_complete::generate_to(shell, &mut cmd.clone(), "incus-hpa", dir)?;
    }
    Ok(())
}
