//! The command line (clap derive): `run`, `validate`, `plan`, `status`, `simulate`, and the
//! ready-made endpoint hooks under `hook`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::config::DEFAULT_PATH;
use crate::simulate::command::SimulateArgs;

/// Horizontal autoscaler for Incus containers: keeps each group of instances between min and
/// max, adding instances when its signals ask (memory, CPU, pressure, a program's number) and
/// removing them when they allow.
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
        #[arg(long, short, value_name = "FILE", default_value = DEFAULT_PATH)]
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
        #[arg(long, short, value_name = "FILE", default_value = DEFAULT_PATH)]
        config: PathBuf,
        /// Check the content alone: not the ownership and modes of the file and of the
        /// directories on its path, nor the TLS files it names. For a copy kept elsewhere (a
        /// git checkout, /tmp) before it is installed; exit 0 or 1 on the content, and a note
        /// on stderr that the rest was not checked.
        #[arg(long)]
        syntax_only: bool,
    },
    /// Write the man pages and shell completions into DIR (used to build the package).
    #[command(hide = true)]
    GenerateAssets {
        /// Where to write `incus-hpa.8`, `incus-hpa.toml.5` and the completions.
        dir: PathBuf,
    },
    /// Ask the running daemon what it thinks of each group (its control socket).
    ///
    /// Without GROUP, a table of every group, at most 100 columns wide (long cells are cut,
    /// ending in …): GROUP, PROJECT, CURRENT, DESIRED, MIN-MAX, MEMORY (use/target), SIGNALS,
    /// REASON and NOTE (paused, standby, failing instances, the last error). With GROUP, that
    /// group in detail: its count and bounds, each signal's reading and the count it wants,
    /// the scale-down window in force and why, who acts on it, the right-sizing advice the
    /// daemon found on its history each hour (as `incus-hpa advise`, over the last week at a
    /// minute's resolution), the last action and error, the next pass, its instances, and the
    /// last hour of its history (the count and the demand, a column a minute; the history is
    /// read from the state directory, see FILES).
    Status {
        /// The group to show in detail.
        group: Option<String>,
        /// Print the stable JSON document instead of a table (with GROUP: that group's object).
        #[arg(long)]
        json: bool,
        /// The daemon's control socket [default: `[daemon] control_socket` of the
        /// desired-state file when it can be read, else /run/incus-hpa/control.sock].
        #[arg(long, value_name = "PATH")]
        control_socket: Option<PathBuf>,
        /// The desired-state file whose `[daemon] control_socket` is asked, unless
        /// --control-socket is given.
        #[arg(long, short, value_name = "FILE", default_value = DEFAULT_PATH)]
        config: PathBuf,
        /// How long to wait for the daemon's whole answer before giving up with exit 1 (a
        /// daemon that accepts and never answers does not hang the command). The daemon
        /// answers from memory, usually within milliseconds.
        #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Replay a demand trace (CSV `t,demand_mib`) through the decision code and score it.
    Simulate(SimulateArgs),
    /// Advise each group scaled on memory on the size of its instances (`limits.memory`) from
    /// its recorded history.
    ///
    /// Replays the group's history (see incus-hpa(8), FILES) under its own policy at sizes
    /// from half to one and a half times the one it has, and advises the one that would have
    /// reserved the least memory (instances times their limit, over time) without the group
    /// being at its limit or overloaded longer than at its own size; with the count range,
    /// memory reserved, seconds at the limit and churn at both sizes. Nothing is applied. The
    /// count stays the daemon's: a size is judged by what the count would have done with it,
    /// so sizing and counting do not fight over one signal. The daemon finds the same advice
    /// each hour by itself (every minute's highest readings of the last week) and shows it in
    /// `status GROUP`, `status --json` and its metrics.
    Advise(crate::simulate::advise_cmd::AdviseArgs),
    /// Show what the daemon would decide now for each group, without acting (a dry run).
    ///
    /// Each group is decided as a pass of the daemon decides it, with every signal: memory, CPU
    /// and pressure as read now, the schedule windows open now, and the number each external
    /// program prints, run once. A program that fails, times out or prints no number is said as
    /// the journal says it, and its signal has no reading (it holds the count). The programs
    /// run as the daemon runs them (no shell, a small environment, killed after their timeout),
    /// but with the rights of the user running plan: one that reads what only the daemon's user
    /// may read fails here. They run only when the file passes the checks `run` makes of it
    /// (see `validate`, for the user running plan); otherwise a note on stderr says why, and
    /// their signals show unknown. plan starts from an empty history: no stabilization window
    /// holds a recommendation back. Run it as root, or as a member of both incus-hpa (to read
    /// the file) and incus-admin (to ask Incus).
    Plan {
        /// The desired-state file.
        #[arg(long, short, value_name = "FILE", default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
    /// The ready-made endpoint hooks, for a group's `[groups.NAME.endpoints] command`
    /// (installed as /usr/lib/incus-hpa/hooks/haproxy and nginx).
    ///
    /// Each reads the group's endpoint set as JSON on standard input (one line, here with
    /// spaces): {"group": "web", "project": "default", "endpoints": [{"instance":
    /// "web-3kd9x2", "address": "10.98.0.12", "port": 80}]}, makes the load balancer send requests to exactly those endpoints, and exits 0 once it
    /// has, or 1 with the reason on stderr (the daemon logs it and runs the hook again). The
    /// same set twice changes nothing the second time. docs/traffic.md shows the
    /// configuration each expects.
    Hook {
        #[command(subcommand)]
        hook: HookCommand,
    },
}

/// The hooks of `incus-hpa hook`.
#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// Make a HAProxy backend's servers the endpoint set, through HAProxy's runtime API
    /// socket, without a reload.
    ///
    /// The backend must have free server slots, and the socket the admin level:
    /// `stats socket /run/haproxy/admin.sock mode 660 level admin` in the global section,
    /// `server-template web- 1-20 127.0.0.1:80 disabled` in the backend. An endpoint keeps
    /// the slot at its address; a new one takes a slot in maintenance (set server … addr,
    /// then state ready); the slot of one that left is put in maintenance (state maint: the
    /// requests in flight finish, no new one comes). More endpoints than slots: exit 1,
    /// nothing changed.
    Haproxy {
        /// HAProxy's admin stats socket.
        #[arg(long, value_name = "PATH")]
        socket: PathBuf,
        /// The backend whose servers are the endpoints.
        #[arg(long, value_name = "NAME")]
        backend: String,
        /// Use only the backend's servers whose names start with PREFIX (the
        /// server-template's) [default: all of them].
        #[arg(long, value_name = "PREFIX")]
        server_prefix: Option<String>,
    },
    /// Write the endpoint set as an nginx upstream block, and reload nginx when it changed.
    ///
    /// The file (`upstream NAME { server ADDRESS:PORT; … }`, one server marked down when the
    /// set is empty) is replaced whole, through a file beside it and a rename; nginx's http
    /// block includes it and proxies to http://NAME. A reload that fails puts the previous
    /// file back and exits 1.
    Nginx {
        /// The file the upstream block is written to (its directory must be writable).
        #[arg(long, value_name = "PATH")]
        upstream_file: PathBuf,
        /// The upstream's name, as proxy_pass names it.
        #[arg(long, value_name = "NAME")]
        upstream: String,
        /// The command that reloads nginx, run without a shell (split at spaces).
        #[arg(long, value_name = "COMMAND", default_value = "nginx -s reload")]
        reload_command: String,
        /// Reload by sending SIGHUP to the process whose pid this file holds
        /// (/run/nginx.pid), instead of the reload command.
        #[arg(long, value_name = "PATH", conflicts_with = "reload_command")]
        pid_file: Option<PathBuf>,
    },
    /// Print a HAProxy backend's current rate (sessions per second; requests per second in
    /// mode http), for a group's `[[groups.NAME.external]]` command.
    HaproxyRate {
        /// HAProxy's stats socket.
        #[arg(long, value_name = "PATH")]
        socket: PathBuf,
        /// The backend whose rate is printed.
        #[arg(long, value_name = "NAME")]
        backend: String,
    },
}
