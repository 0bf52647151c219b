//! The command line (clap derive): `run`, `validate`, `plan`, `status`, `simulate`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::DEFAULT_PATH;
use crate::simulate::command::SimulateArgs;

/// Horizontal autoscaler for Incus containers: keeps each group of instances between min and
/// max, adding instances when their average memory use is above the group's threshold.
#[derive(Debug, Parser)]
#[command(name = "incus-hpa", version, about, propagate_version = true)]
pub struct Cli {
    /// The Incus unix socket [default: `[daemon] incus` in the desired-state file, else
    /// /var/lib/incus/unix.socket]. Given, it wins over the file.
    #[arg(long, global = true, env = "INCUS_SOCKET", value_name = "PATH")]
    pub incus_socket: Option<PathBuf>,

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
    /// Check a desired-state file as `run` does: exit 0 when the daemon would accept it, 1
    /// with every problem on stderr.
    ///
    /// Besides the content (and the TLS files it names), the file and every directory on its
    /// path must be owned by root or the user running the check and writable by no one else
    /// (sticky directories such as /tmp excepted), and a symlink on the way owned by one of
    /// them, or `run` refuses the file (exit 78): the error names what is wrong and the chmod
    /// or chown that fixes it. The daemon trusts root and its own user: run the check as
    /// root, or as the daemon's user for a file that user owns.
    Validate {
        /// The desired-state file.
        #[arg(long, short, default_value = DEFAULT_PATH)]
        config: PathBuf,
        /// Check the content alone: not the ownership and modes of the file and of the
        /// directories on its path, nor the TLS files it names. For a copy kept elsewhere (a
        /// git checkout, /tmp) before it is installed; exit 0 or 1 on the content, and a note
        /// on stderr that the rest was not checked.
        #[arg(long)]
        syntax_only: bool,
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
        #[arg(long, default_value = crate::model::DEFAULT_CONTROL_SOCKET)]
        control_socket: PathBuf,
    },
    /// Replay a demand trace (CSV `t,demand_mib`) through the decision code and score it.
    Simulate(SimulateArgs),
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
