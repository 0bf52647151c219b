//! The daemon's main loop: waits for Incus, reconciles due groups, and reacts to events
//! (reload, shutdown) that arrive on a channel: signals in production, a test's sender in tests.
//!
//! The loop never waits for one group: it starts each group's pass when the group is due, takes
//! in each pass as it returns and each external program's value as it arrives, and meanwhile
//! keeps serving events, reloads, the watch between passes and the watchdog (see
//! [`crate::reconciler`]).
//!
//! Shutdown lets the actions in flight finish and starts no new one. A reload that fails keeps
//! the last good desired state in force and says so in the log and in `STATUS=`.

use std::time::{Duration, SystemTime};

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::{sleep_until, Instant};

use crate::config::{ConfigError, Loaded, Severity};
use crate::model::DesiredState;
use crate::reconciler::{backoff, Context, Reconciler};
use crate::systemd;

/// Something the loop must react to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Re-read the desired-state file (SIGHUP, or the file changed).
    Reload,
    /// Finish the action in flight and exit (SIGTERM, SIGINT).
    Shutdown,
    /// An instance stopped or vanished: reconcile the groups it may belong to now.
    InstanceChanged { project: String, name: String },
    /// The Incus event stream (re)connected: Incus answers again.
    IncusBack,
    /// Write the cache of instances to the log (SIGUSR1).
    Dump,
}

/// How the daemon reads its desired state again on reload.
pub type Loader = Box<dyn Fn() -> Result<Loaded, ConfigError> + Send>;

/// Logs every diagnostic of a configuration, errors at error level.
pub fn log_diagnostics(diags: &[crate::config::Diagnostic]) {
    for d in diags {
        match d.severity {
            Severity::Error => {
                tracing::error!(file = %d.file.display(), line = d.line, column = d.column, key = %d.key, "{d}")
            }
            Severity::Warning => {
                tracing::warn!(file = %d.file.display(), line = d.line, column = d.column, key = %d.key, "{d}")
            }
        }
    }
}

/// How waiting for Incus ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Incus answered; `reload` says a reload was asked for meanwhile.
    Ready { reload: bool },
    /// A shutdown was asked for first.
    Shutdown,
}

/// How long a shutdown waits for the history to be written, at most.
const HISTORY_BUDGET: Duration = Duration::from_secs(5);

/// How long a shutdown waits for the actions in flight, at most. The unit's
/// `TimeoutStopSec=180s` is the whole budget: a drain is cut short at once, a graceful stop
/// lasts at most `stop_timeout` (2 minutes at most) plus 5 s, a forced stop and a delete are
/// waited for 20 s each (about a second each in practice); the leases are then given up
/// within 5 s. 120 + 5 + 20 + 20 = 165 s of actions, cut at 165 s, plus 5 s: 170 s, within
/// 180 s.
pub const SHUTDOWN_BUDGET: Duration = Duration::from_secs(165);

/// How often, at most, the status board, the gauges and systemd's `STATUS=` are written after
/// passes end: each writing walks every group and instance (about 13 ms for 1,000 groups of
/// 10), and a thousand groups passing every second each had them written a thousand times a
/// second.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Longest wait between two tries to reach Incus at start: connecting to a unix socket costs
/// nothing, and the daemon should be working within seconds of Incus being up.
pub const WAIT_MAX: Duration = Duration::from_secs(5);

/// Waits until Incus answers, retrying with backoff, and remembers a reload asked for meanwhile.
pub async fn wait_for_incus(ctx: &Context, events: &mut UnboundedReceiver<Event>) -> Waited {
    let mut failures = 0;
    let mut reload = false;
    loop {
        match ctx.incus.server_version().await {
            Ok(v) => {
                tracing::info!(incus_version = %v, "connected to Incus {v}");
                return Waited::Ready { reload };
            }
            Err(e) => {
                let delay = backoff(failures).min(WAIT_MAX);
                failures += 1;
                tracing::warn!(error = %e, "{e}; retrying in {}", humantime::format_duration(delay));
                systemd::status(&format!("waiting for Incus: {e}"));
                let deadline = tokio::time::Instant::now() + delay;
                loop {
                    tokio::select! {
                        _ = sleep_until(deadline) => break,
                        ev = events.recv() => match ev {
                            Some(Event::Reload) => reload = true,
                            Some(Event::InstanceChanged { .. } | Event::Dump) => {}
                            // Incus is back: try at once.
                            Some(Event::IncusBack) => break,
                            Some(Event::Shutdown) | None => return Waited::Shutdown,
                        },
                    }
                }
            }
        }
    }
}

/// Logs the cache of instances, one entry per project: `cache: project default: [web-a
/// Running, …]`.
fn dump(ctx: &Context) {
    for (project, instances) in ctx.store.snapshot() {
        let list: Vec<String> = instances.iter().map(|(n, s)| format!("{n} {s}")).collect();
        tracing::info!(project = %project, instances = list.len(),
            "cache: project {project}: [{}]", list.join(", "));
    }
}

/// Runs the reconcile loop until a shutdown event; returns the desired state last in force.
pub async fn run_loop(
    ctx: Context,
    initial: DesiredState,
    load: Loader,
    mut events: UnboundedReceiver<Event>,
) -> DesiredState {
    let mut state = initial;
    let mut reconciler = Reconciler::new(ctx.clone(), &state, Instant::now());
    // The readiness checks of the groups that have them, for as long as the loop runs.
    let prober = crate::ready::Prober::start(
        ctx.incus.clone(),
        ctx.store.clone(),
        ctx.ready.clone(),
        &state,
    );
    let watchdog = systemd::watchdog_period();
    let mut pet = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
    // The watch between passes (see `Reconciler::peek`).
    let mut peek = tokio::time::interval(crate::reconciler::PEEK_EVERY);
    peek.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut invalid_since: Option<SystemTime> = None;
    let status = |r: &Reconciler, invalid: Option<SystemTime>| {
        let mut line = r.status_line();
        if let Some(t) = invalid {
            line = format!(
                "CONFIG INVALID since {} (running the last good one); {line}",
                humantime::format_rfc3339_seconds(t)
            );
        }
        systemd::status(&line);
        r.publish(Instant::now());
    };
    status(&reconciler, None);
    let mut publish = tokio::time::interval(PUBLISH_EVERY);
    publish.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A pass ended since the board was last written.
    let mut unpublished = false;
    let mut give_back = tokio::time::interval(crate::limits::GIVE_BACK_EVERY);
    give_back.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next = reconciler
            .next_due()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let mut reload = false;
        tokio::select! {
            _ = sleep_until(next) => reconciler.start_due(Instant::now()),
            ended = reconciler.ended() => {
                if reconciler.finish(ended, Instant::now()) {
                    unpublished = true;
                }
            }
            ev = events.recv() => match ev {
                Some(Event::Reload) => reload = true,
                Some(Event::InstanceChanged { project, name }) => reconciler.wake(&project, &name, Instant::now()),
                Some(Event::IncusBack) => reconciler.incus_back(Instant::now()),
                Some(Event::Dump) => dump(&ctx),
                Some(Event::Shutdown) | None => break,
            },
            _ = pet.tick(), if watchdog.is_some() => systemd::watchdog(),
            _ = peek.tick() => reconciler.peek(Instant::now()),
            _ = publish.tick(), if unpublished => {
                status(&reconciler, invalid_since);
                unpublished = false;
            }
            _ = give_back.tick() => crate::limits::give_back(),
        }
        if reload {
            match load() {
                Ok(loaded) => {
                    log_diagnostics(&loaded.warnings);
                    let (was, now) = (&state.daemon, &loaded.state.daemon);
                    if (
                        &was.control_socket,
                        was.metrics_address,
                        was.lease,
                        &was.state_directory,
                    ) != (
                        &now.control_socket,
                        now.metrics_address,
                        now.lease,
                        &now.state_directory,
                    ) || (&was.incus, &was.tls) != (&now.incus, &now.tls)
                    {
                        tracing::warn!(
                            "[daemon] {} are read at start: the change takes effect at the next \
                             restart",
                            crate::config::keys::read_at_start().join(", ")
                        );
                    }
                    if loaded.state != state {
                        tracing::info!(
                            groups = loaded.state.groups.len(),
                            "desired state reloaded: {} group(s)",
                            loaded.state.groups.len()
                        );
                    } else {
                        tracing::info!("desired state reloaded: no change");
                    }
                    state = loaded.state;
                    reconciler.set_desired(&state, Instant::now());
                    prober.set_desired(&state);
                    invalid_since = None;
                }
                Err(e) => {
                    log_diagnostics(&e.diagnostics);
                    tracing::error!(file = %e.file.display(), "{e}: keeping the last good desired state");
                    invalid_since.get_or_insert_with(SystemTime::now);
                }
            }
            status(&reconciler, invalid_since);
            unpublished = false;
        }
    }
    // The actions in flight finish (a drain is cut short), no new one starts, and no program
    // runs any more.
    ctx.stop.set();
    reconciler.stop_programs();
    drop(prober);
    if reconciler.busy() {
        tracing::info!("shutting down after the actions in flight");
    }
    let deadline = Instant::now() + SHUTDOWN_BUDGET;
    while reconciler.busy() {
        tokio::select! {
            ended = reconciler.ended() => {
                reconciler.finish(ended, Instant::now());
            }
            _ = sleep_until(deadline) => {
                tracing::warn!(
                    "the actions in flight did not end within {}: stopping without waiting for \
                     them (their instances are left as they are, the daemon's own; its next \
                     start finishes the job)", humantime::format_duration(SHUTDOWN_BUDGET));
                break;
            }
            _ = pet.tick(), if watchdog.is_some() => systemd::watchdog(),
        }
    }
    // Each group's history is on disk for the next start, and what it learned in Incus for
    // the next holder.
    reconciler.save_history(Instant::now(), HISTORY_BUDGET);
    reconciler.leave_all(Instant::now());
    let learned = ctx.leases.learned().write(ctx.incus.as_ref());
    if tokio::time::timeout(HISTORY_BUDGET, learned).await.is_err() {
        tracing::debug!("what the groups learned was not left in Incus within the budget");
    }
    // What is still in flight stops here.
    drop(reconciler);
    // Another daemon takes over at once rather than after the lease runs out.
    ctx.leases.release_all(ctx.incus.as_ref()).await;
    state
}
