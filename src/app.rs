//! The commands behind the CLI, wired together: this is where IO, signals and `anyhow` meet.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::config::{self, Loaded};
use crate::daemon::{self, Event};
use crate::events::IncusEvents;
use crate::incus::client::{Client, DEFAULT_SOCKET};
use crate::incus::tls::Tls;
use crate::incus::{Endpoint, Incus};
use crate::informer::Store;
use crate::memory;
use crate::model::{DaemonSpec, MemorySourceKind};
use crate::reconciler::Context;
use crate::systemd;

/// The control socket `incus-hpa status` asks when not given one: the `[daemon]
/// control_socket` of the desired-state file at `config` when it can be read and is valid
/// (its content alone: a path to connect to is all that is taken from it), else the default.
pub fn control_socket_of(config: &Path) -> PathBuf {
    config::load_content(config).map_or_else(
        |_| DaemonSpec::default().control_socket,
        |l| l.state.daemon.control_socket,
    )
}

/// The state directory `incus-hpa status GROUP` reads the history from: `[daemon]
/// state_directory` of the desired-state file at `config` when it can be read, else
/// `$STATE_DIRECTORY`, else the packaged unit's.
pub fn state_directory_of(config: &Path) -> PathBuf {
    let key = config::load_content(config)
        .ok()
        .and_then(|l| l.state.daemon.state_directory);
    crate::history::directory(
        key.as_deref(),
        std::env::var_os("STATE_DIRECTORY").as_deref(),
    )
    .unwrap_or_else(|| PathBuf::from("/var/lib/incus-hpa"))
}

/// What `incus-hpa status` shows: every group, or one in detail with its history in `dir`.
pub struct Asked<'a> {
    pub json: bool,
    pub group: Option<&'a str>,
    pub dir: PathBuf,
}

/// `incus-hpa status`: asks the running daemon on its control socket; exit 1 when none answers,
/// or when it has not answered within `timeout` (a daemon that accepts and never answers must
/// not hang a script that asks it), or when the group asked about is not one of its.
pub async fn status(
    socket: &Path,
    asked: Asked<'_>,
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let json = asked.json;
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(crate::incus::tls::unused())
        .unix_socket(socket)
        .timeout(timeout)
        .build()?;
    let answer = client.get("http://incus-hpa/status").send().await;
    let body = match answer {
        Ok(r) if r.status().is_success() => match r.text().await {
            Ok(body) => body,
            Err(e) => return Ok(unanswered(socket, &e, timeout)),
        },
        Ok(r) => anyhow::bail!("the daemon answered {} on {}", r.status(), socket.display()),
        Err(e) if e.is_timeout() => return Ok(unanswered(socket, &e, timeout)),
        Err(e) => {
            let denied = format!(
                "permission denied on {}: run as root or as a member of the incus-hpa group \
                 (usermod -aG incus-hpa $USER, then log in again)",
                socket.display()
            );
            let why = match std::fs::metadata(socket) {
                Err(m) if m.kind() == std::io::ErrorKind::PermissionDenied => denied,
                Err(_) => format!(
                    "no incus-hpa daemon is running (no control socket at {}; \
                     systemctl status incus-hpa)",
                    socket.display()
                ),
                Ok(_)
                    if std::os::unix::net::UnixStream::connect(socket)
                        .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied) =>
                {
                    denied
                }
                Ok(_) => format!(
                    "no incus-hpa daemon answers on {} ({e}); systemctl status incus-hpa",
                    socket.display()
                ),
            };
            eprintln!("incus-hpa: {why}");
            return Ok(ExitCode::from(1));
        }
    };
    let Some(name) = asked.group else {
        if json {
            println!("{body}");
        } else {
            let status: crate::control::Status = serde_json::from_str(&body)?;
            print!("{}", crate::control::table(&status));
        }
        return Ok(ExitCode::SUCCESS);
    };
    let status: crate::control::Status = serde_json::from_str(&body)?;
    let Some(g) = status.groups.iter().find(|g| g.name == name) else {
        let known: Vec<&str> = status.groups.iter().map(|g| g.name.as_str()).collect();
        eprintln!(
            "incus-hpa: the daemon has no group {name:?} (its groups: {})",
            if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            }
        );
        return Ok(ExitCode::from(1));
    };
    if json {
        println!("{}", serde_json::to_string(g)?);
        return Ok(ExitCode::SUCCESS);
    }
    let now_ms = crate::history::unix_ms(std::time::SystemTime::now());
    let since = now_ms - crate::control::detail::CHART_MINUTES as i64 * 60_000;
    let rows = crate::history::read(&asked.dir, name, since);
    let why;
    let rows = match &rows {
        Ok((rows, _)) => Ok(rows.as_slice()),
        Err(e) => {
            why = format!(
                "no history ({}: {e})",
                asked.dir.join("groups").join(name).display()
            );
            Err(why.as_str())
        }
    };
    print!("{}", crate::control::detail::detail(g, rows, now_ms));
    Ok(ExitCode::SUCCESS)
}

/// Says that the daemon on `socket` did not answer (all of) `status` within `timeout`, or
/// broke off its answer; exit 1.
fn unanswered(socket: &Path, e: &reqwest::Error, timeout: Duration) -> ExitCode {
    let what = if e.is_timeout() {
        format!(
            "did not answer within {}",
            humantime::format_duration(timeout)
        )
    } else {
        format!("broke off its answer ({e})")
    };
    eprintln!(
        "incus-hpa: the daemon on {} {what}; it may be stuck: systemctl status incus-hpa, \
         journalctl -u incus-hpa (or ask again with a longer --timeout)",
        socket.display()
    );
    ExitCode::from(1)
}

/// `incus-hpa validate`: every problem on stderr; exit 1 when there is an error. The file is
/// loaded as `run` loads it ([`load_strict`]: its ownership and modes, and those of every
/// directory on its path, must be right), or for its content alone when `syntax_only`, which
/// says so.
pub fn validate(path: &Path, syntax_only: bool) -> ExitCode {
    let result = if syntax_only {
        config::load_content(path)
    } else {
        load_strict(path)
    };
    let diags = match &result {
        Ok(l) => &l.warnings,
        Err(e) => &e.diagnostics,
    };
    for d in diags {
        eprintln!("{d}");
    }
    if syntax_only {
        eprintln!(
            "{}: note: --syntax-only: the content alone was checked, not the ownership and \
             modes of the file and of the directories on its path, nor the TLS files it names; \
             the daemon may still refuse it where it is installed",
            path.display()
        );
    }
    match result {
        Ok(l) => {
            println!("{}: OK, {} group(s)", path.display(), l.state.groups.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}

/// Loads a file the daemon may use: opened once, safely (see [`config::open_checked`]), and
/// valid.
fn load_strict(path: &Path) -> Result<Loaded, config::ConfigError> {
    config::load_checked(path, own_uid())
}

/// The effective uid of this process (the owner of `/proc/self`).
fn own_uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
}

/// Where Incus is and how to reach it: `--incus-socket` (or `INCUS_SOCKET`) when given, else
/// `[daemon] incus`, else the default socket; over HTTPS, with the TLS files loaded.
struct Reach {
    endpoint: Endpoint,
    tls: Option<Tls>,
}

impl Reach {
    fn new(cli_socket: Option<&Path>, daemon: &DaemonSpec) -> anyhow::Result<Self> {
        let endpoint = match (cli_socket, &daemon.incus) {
            (Some(socket), _) => Endpoint::Unix(socket.to_path_buf()),
            (None, Some(e)) => e.clone(),
            (None, None) => Endpoint::Unix(DEFAULT_SOCKET.into()),
        };
        let tls = match (&endpoint, &daemon.tls) {
            (Endpoint::Https { .. }, Some(files)) => Some(Tls::load(files)?),
            _ => None,
        };
        Ok(Self { endpoint, tls })
    }
}

fn context(reach: &Reach, lease: Duration) -> anyhow::Result<Context> {
    let telemetry = Arc::new(crate::control::Telemetry::default());
    let client =
        Client::connect(&reach.endpoint, reach.tls.clone())?.counting(telemetry.requests.clone());
    let incus: Arc<dyn Incus> = Arc::new(client);
    let for_memory = incus.clone();
    // Over HTTPS the instances are elsewhere (or on other cluster members): no local cgroups.
    let remote = reach.endpoint.is_https();
    Ok(Context {
        memory: Arc::new(move |kind| {
            let kind = match kind {
                MemorySourceKind::Auto if remote => MemorySourceKind::Api,
                k => k,
            };
            memory::source(kind, for_memory.clone())
        }),
        incus,
        store: Arc::new(Store::default()),
        stop: Arc::new(crate::act::Shutdown::default()),
        telemetry,
        leases: Arc::new(crate::lease::Leases::new(lease)),
        ready: Arc::default(),
        endpoints: Arc::default(),
    })
}

/// Exit status of `run` when the desired-state file cannot be used at start (EX_CONFIG): the
/// unit does not restart on it (`RestartPreventExitStatus=`), since retrying cannot help.
pub const EXIT_CONFIG: u8 = 78;

/// `incus-hpa run`: the daemon.
pub async fn run(socket: Option<&Path>, path: &Path) -> anyhow::Result<ExitCode> {
    let loaded = match load_strict(path) {
        Ok(l) => l,
        Err(e) => {
            daemon::log_diagnostics(&e.diagnostics);
            eprintln!("incus-hpa: {e}: not starting");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    daemon::log_diagnostics(&loaded.warnings);
    let reach = match Reach::new(socket, &loaded.state.daemon) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("incus-hpa: {e:#}: not starting");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    // Before the memory sources are made: they keep open as many files as the limit allows.
    let descriptors = crate::limits::raise_descriptors();
    tracing::debug!(
        descriptors,
        "open descriptors: at most {descriptors}, {} cgroup files kept open",
        crate::memory::max_open(descriptors)
    );
    let ctx = context(&reach, loaded.state.daemon.lease)?;
    tracing::info!(incus = %reach.endpoint, "talking to Incus at {}", reach.endpoint);

    let (tx, mut events) = mpsc::unbounded_channel();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let signals = tx.clone();
    tokio::spawn(async move {
        loop {
            let ev = tokio::select! {
                _ = term.recv() => Event::Shutdown,
                _ = int.recv() => Event::Shutdown,
                _ = hup.recv() => Event::Reload,
                _ = usr1.recv() => Event::Dump,
            };
            if signals.send(ev).is_err() {
                break;
            }
        }
    });

    // What the daemon thinks, for `incus-hpa status` and Prometheus.
    crate::control::start(
        loaded.state.daemon.control_socket.clone(),
        ctx.telemetry.clone(),
    );
    if let Some(addr) = loaded.state.daemon.metrics_address {
        crate::control::start_metrics(addr, ctx.telemetry.clone()).await;
    }
    // Lifecycle events keep the cache of instances up to date, and wake the groups an instance
    // that stops or vanishes belongs to before their next interval.
    tokio::spawn(crate::events::follow(
        Arc::new(IncusEvents::at(reach.endpoint.clone(), reach.tls.clone())),
        ctx.incus.clone(),
        ctx.store.clone(),
        tx.clone(),
        ctx.telemetry.reconnects.clone(),
    ));
    // Saving the file reloads it, like SIGHUP does.
    let _watch = match crate::watch::watch(path, tx.clone()) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!("{e}; reload with SIGHUP (systemctl reload incus-hpa)");
            None
        }
    };
    match daemon::wait_for_incus(&ctx, &mut events).await {
        daemon::Waited::Shutdown => {
            systemd::stopping();
            return Ok(ExitCode::SUCCESS);
        }
        // The file changed while Incus was not there yet: apply it at once.
        daemon::Waited::Ready { reload: true } => {
            let _ = tx.send(Event::Reload);
        }
        daemon::Waited::Ready { reload: false } => {}
    }
    tracing::info!(
        config = %path.display(),
        groups = loaded.state.groups.len(),
        interval = %humantime::format_duration(loaded.state.daemon.interval),
        "incus-hpa {} started: {} group(s) from {}",
        env!("CARGO_PKG_VERSION"),
        loaded.state.groups.len(),
        path.display()
    );
    systemd::ready();
    // Leader leases: one daemon acts on a group at a time (see `lease`).
    tokio::spawn(ctx.leases.clone().keep(ctx.incus.clone()));
    let owned = path.to_path_buf();
    let loader: daemon::Loader = Box::new(move || load_strict(&owned));
    daemon::run_loop(ctx, loaded.state, loader, events).await;
    systemd::stopping();
    tracing::info!("incus-hpa stopped");
    Ok(ExitCode::SUCCESS)
}

/// `incus-hpa plan`: observe and decide once per group, act on nothing (see
/// [`crate::dry_run`]). The groups' external programs run only when the file passes the
/// checks `run` makes of it ([`load_strict`], for the user running plan): the file names
/// their arguments, and they run with this user's rights. Otherwise the file is read for its
/// content alone, and a note on stderr says why they were not run.
pub async fn plan(socket: Option<&Path>, path: &Path) -> anyhow::Result<ExitCode> {
    let (loaded, programs) = match load_strict(path) {
        Ok(l) => (l, Ok(())),
        Err(strict) => match config::load(path) {
            Ok(l) => {
                let why = strict.diagnostics.iter().map(|d| d.message.as_str());
                (l, Err(why.collect::<Vec<_>>().join("; ")))
            }
            Err(e) => {
                for d in &e.diagnostics {
                    eprintln!("{d}");
                }
                return Ok(ExitCode::from(1));
            }
        },
    };
    let ctx = context(
        &Reach::new(socket, &loaded.state.daemon)?,
        loaded.state.daemon.lease,
    )?;
    if let Err(e) = ctx.incus.server_version().await {
        eprintln!("incus-hpa: {e}");
        return Ok(ExitCode::from(1));
    }
    let programs = match programs {
        Ok(()) => crate::dry_run::Programs::Run,
        Err(why) => {
            if loaded.state.groups.values().any(|g| !g.external.is_empty()) {
                eprintln!(
                    "incus-hpa: {}: the external programs are not run, their signals show \
                     unknown: {why} (run plan as root, or as the user who owns the file)",
                    path.display()
                );
            }
            crate::dry_run::Programs::NotRun
        }
    };
    let memory = (ctx.memory)(loaded.state.daemon.memory_source);
    let state = &loaded.state;
    let shown = crate::dry_run::plan(
        ctx.incus.as_ref(),
        memory.as_ref(),
        &ctx.store,
        state,
        programs,
    )
    .await?;
    print!("{shown}");
    Ok(ExitCode::SUCCESS)
}
