//! The command line (clap derive): `run`, `validate`, `plan`.

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
    /// Show what the daemon would decide now for each group, without acting (a dry run).
    Plan {
        /// The desired-state file.
        #[arg(long, short, default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
}
