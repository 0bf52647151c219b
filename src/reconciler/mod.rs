//! The reconcile loop: per group, observe → decide → act, requeued after the interval (sooner
//! when something is due, such as a restart after its backoff), or after an exponential backoff
//! when it failed. Level-triggered: each pass reads what is there now; the only memory kept is
//! the decision history, which is safe to lose.
//!
//! Groups are independent: they are reconciled concurrently, and one group's failure (a
//! missing image, say) only backs that group off. Incus events wake a group early, except the
//! events of the daemon's own removals, and except a group that is backing off; a group backing
//! off because Incus was unreachable is retried as soon as Incus is back. One pass of one group
//! is [`pass`].

mod pass;

pub use pass::ReconcileError;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::act::Shutdown;
use crate::control::{GroupStatus, LastAction, Status, Telemetry};
use crate::decide::History;
use crate::headroom::Round;
use crate::incus::Incus;
use crate::informer::Store;
use crate::lease::Standing;
use crate::memory::MemorySource;
use crate::model::{
    DesiredState, GroupName, GroupSpec, HostReserve, Memory, MemorySourceKind, Reason, Summary,
};
use crate::report;

/// First retry delay after a failed reconcile; doubles up to [`BACKOFF_MAX`].
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Longest delay between retries of a failing group.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// How long after the daemon removed an instance the events about it are its own.
const OWN_EVENTS: Duration = Duration::from_secs(10);
/// How often the watch between passes reads the memory of the `adaptive` groups' instances
/// ([`Reconciler::peek`]).
pub const PEEK_EVERY: Duration = Duration::from_secs(1);

/// Builds the memory source `[daemon] memory_source` asks for.
pub type MemoryFactory = Arc<dyn Fn(MemorySourceKind) -> Arc<dyn MemorySource> + Send + Sync>;

/// What the reconciler needs from the outside world.
#[derive(Clone)]
pub struct Context {
    pub incus: Arc<dyn Incus>,
    /// The informer's cache of instances, fed by the event follower.
    pub store: Arc<Store>,
    pub memory: MemoryFactory,
    /// Set on shutdown: the action in flight completes (a drain is cut short), no new one
    /// starts.
    pub stop: Arc<Shutdown>,
    /// Counters and the status board, served on the control socket.
    pub telemetry: Arc<Telemetry>,
    /// Which groups this daemon may act on (leader leases).
    pub leases: Arc<crate::lease::Leases>,
}

impl Context {
    /// Makes `status` say who acts on each group from this context's leases when it is asked
    /// (see [`crate::control::Telemetry::live_standby`]), as the fence before every action
    /// does: done by [`Reconciler::new`], for every context a loop runs with.
    fn status_reads_leases(&self) {
        let leases = self.leases.clone();
        self.telemetry.live_standby(Arc::new(move |project, group| {
            leases.standing(project, group).standby()
        }));
    }
}

struct GroupState {
    spec: GroupSpec,
    history: History,
    next: Instant,
    failures: u32,
    /// The last failure was Incus being unreachable.
    unreachable: bool,
    last: Option<Summary>,
    /// The last action carried out, for `incus-hpa status`.
    last_action: Option<LastAction>,
    /// When the last pass ended.
    done: Option<Instant>,
    /// Foreign instances already reported.
    reported: BTreeSet<String>,
    /// The external signals' last values (one run per interval) and failures said.
    external: crate::external::Cache,
    external_said: crate::external::Said,
    /// The group's schedule windows, compiled.
    windows: crate::schedule::Windows,
    /// The instances the last pass saw, with their memory limits where it read them: what the
    /// watch between passes reads ([`Reconciler::peek`]).
    watched: Vec<(String, Option<u64>)>,
    /// What their readings said of the group's strain at the last pass.
    strain: crate::decide::adaptive::Strain,
}

/// The host's time zone, read once: the zone of schedule windows that name none (UTC, said
/// once, when it cannot be told, as the C library does).
fn host_zone() -> &'static crate::schedule::Zone {
    static HOST: std::sync::OnceLock<crate::schedule::Zone> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        crate::schedule::Zone::host().unwrap_or_else(|e| {
            tracing::warn!("{e}: schedule windows without a timezone are read in UTC");
            crate::schedule::Zone::UTC
        })
    })
}

/// A group's schedule windows (none when they cannot be compiled, which the parser's check
/// of each expression and zone rules out; said if it happens anyway).
fn windows(spec: &GroupSpec) -> crate::schedule::Windows {
    crate::schedule::Windows::new(&spec.schedule, host_zone()).unwrap_or_else(|e| {
        tracing::error!(group = %spec.name, "{e}: the group's schedule is ignored");
        crate::schedule::Windows::new(&[], host_zone()).expect("no window")
    })
}

impl GroupState {
    fn new(spec: &GroupSpec, now: Instant) -> Self {
        Self {
            spec: spec.clone(),
            history: History::default(),
            next: now,
            failures: 0,
            unreachable: false,
            last: None,
            last_action: None,
            done: None,
            reported: BTreeSet::new(),
            external: Default::default(),
            external_said: Default::default(),
            windows: windows(spec),
            watched: Vec::new(),
            strain: Default::default(),
        }
    }
}

/// Every managed group and when it is next due.
pub struct Reconciler {
    ctx: Context,
    memory_kind: MemorySourceKind,
    memory: Arc<dyn MemorySource>,
    interval: Duration,
    resync: Duration,
    parallel: usize,
    /// `[daemon] host_reserve`.
    reserve: HostReserve,
    groups: BTreeMap<GroupName, GroupState>,
    /// (project, instance) the daemon removed, until when their events are its own.
    own: HashMap<(String, String), Instant>,
}

impl Reconciler {
    /// A reconciler with every group of `state` due at `now`.
    pub fn new(ctx: Context, state: &DesiredState, now: Instant) -> Self {
        let memory_kind = state.daemon.memory_source;
        ctx.status_reads_leases();
        let mut r = Self {
            memory: (ctx.memory)(memory_kind),
            memory_kind,
            ctx,
            interval: state.daemon.interval,
            resync: state.daemon.resync,
            parallel: state.daemon.max_parallel_actions,
            reserve: state.daemon.host_reserve,
            groups: BTreeMap::new(),
            own: HashMap::new(),
        };
        r.set_desired(state, now);
        r
    }

    /// Switches to a new desired state. Every `[daemon]` key applies at once: a new memory
    /// source is used from the next pass, a shorter interval brings every group's next pass
    /// forward. New and changed groups are due at once (their history is kept); removed groups,
    /// and groups moved to another project, are no longer managed where they were and their
    /// instances are left alone.
    pub fn set_desired(&mut self, state: &DesiredState, now: Instant) {
        self.ctx.leases.set_groups(
            state
                .groups
                .values()
                .map(|g| (g.project.as_str(), g.name.as_str())),
        );
        // Projects no group observes any more leave the informer's cache.
        let projects = state.groups.values().map(|g| g.project.clone()).collect();
        self.ctx.store.retain_projects(&projects);
        if state.daemon.memory_source != self.memory_kind {
            self.memory_kind = state.daemon.memory_source;
            self.memory = (self.ctx.memory)(self.memory_kind);
        }
        let shorter = state.daemon.interval < self.interval;
        self.interval = state.daemon.interval;
        self.resync = state.daemon.resync;
        self.parallel = state.daemon.max_parallel_actions;
        self.reserve = state.daemon.host_reserve;
        self.groups.retain(|name, g| {
            let moved = state.groups.get(name).map(|s| s.project != g.spec.project);
            let n = g.last.as_ref().map_or(0, |s| s.current);
            match moved {
                None => tracing::warn!(group = %name, current = n,
                    "group {name} was removed from the desired state: no longer managing it; \
                     its {n} instance(s) are left as they are"),
                Some(true) => tracing::warn!(group = %name, current = n,
                    "group {name} moved from project {} to {}: its {n} instance(s) in {} are \
                     left as they are", g.spec.project, state.groups[name].project, g.spec.project),
                Some(false) => {}
            }
            moved == Some(false)
        });
        for (name, spec) in &state.groups {
            let g = self
                .groups
                .entry(name.clone())
                .or_insert_with(|| GroupState::new(spec, now));
            if g.spec != *spec {
                if g.spec.external != spec.external {
                    // Values of programs that changed are not theirs any more.
                    g.external = Default::default();
                }
                if g.spec.schedule != spec.schedule {
                    g.windows = windows(spec);
                }
                g.spec = spec.clone();
                g.next = now;
                g.failures = 0;
            }
            // A shorter interval brings the next pass forward (not a backoff's).
            let sooner = g.done.and_then(|d| d.checked_add(self.interval));
            if let Some(sooner) = sooner.filter(|_| shorter && g.failures == 0) {
                g.next = g.next.min(sooner.max(now));
            }
        }
    }

    /// Makes due at `now` the groups whose instance `name` could be (same project, name with the
    /// group's prefix: the daemon names every instance it creates so), unless the event is
    /// about an instance the daemon itself just removed, and except groups backing off after a
    /// failure: an event must not turn a backoff into a busy loop.
    pub fn wake(&mut self, project: &str, name: &str, now: Instant) {
        self.own.retain(|_, until| *until > now);
        if self
            .own
            .contains_key(&(project.to_owned(), name.to_owned()))
        {
            tracing::debug!(
                instance = name,
                "event about {name}, removed by incus-hpa: ignored"
            );
            return;
        }
        for g in self.groups.values_mut() {
            let candidate = g.spec.project == project && name.starts_with(&g.spec.instance_prefix);
            if candidate && g.failures == 0 && g.next > now {
                tracing::debug!(group = %g.spec.name, instance = name, "{name} stopped or vanished: reconciling now");
                g.next = now;
            }
        }
    }

    /// The watch between passes: for each group of the `adaptive` policy that scales on memory,
    /// reads what its instances use where that costs no request to incusd (one cgroup file
    /// each on this host; the whole reading of one near its limit, and of all of them when
    /// the files put the group above its tolerance), and makes the group due at `now` when
    /// one of them reached its limit, or the group went above its tolerance, since the last
    /// pass ([`crate::decide::adaptive::wakes`]). Not for a group backing off, in standby, or
    /// with a pass due within [`PEEK_EVERY`].
    pub fn peek(&mut self, now: Instant) {
        use crate::decide::adaptive::{at_limit, strain, wakes, Strain};
        for g in self.groups.values_mut() {
            let since = g
                .done
                .map_or(Duration::ZERO, |d| now.saturating_duration_since(d));
            if g.failures > 0
                || g.next <= now + PEEK_EVERY
                || !wakes(&g.spec, g.strain, Strain::AtLimit, since)
                || self
                    .ctx
                    .leases
                    .standing(&g.spec.project, g.spec.name.as_str())
                    .standby()
                    .is_some()
            {
                continue;
            }
            let project = &g.spec.project;
            let memory = &self.memory;
            // What the files tell: each instance's usage (one file) against the limit the last
            // pass read; the whole reading of one whose limit is not known yet (`true`).
            let told: Vec<(&str, Option<Memory>, bool)> = g
                .watched
                .iter()
                .map(|(name, limit)| match limit {
                    Some(limit) => {
                        let m = memory.usage(project, name).map(|usage| Memory {
                            usage,
                            limit: *limit,
                            ..Default::default()
                        });
                        (name.as_str(), m, false)
                    }
                    None => (name.as_str(), memory.peek(project, name), true),
                })
                .collect();
            // Page cache counts in a file's usage: the whole reading (the working set) says
            // whether an instance is full, or the group above its tolerance.
            let whole = |(name, told, is_whole): &(&str, Option<Memory>, bool)| {
                if *is_whole {
                    *told
                } else {
                    memory.peek(project, name)
                }
            };
            let full = told.iter().find(|t| {
                t.1.is_some_and(|m| at_limit(&m)) && whole(t).is_some_and(|m| at_limit(&m))
            });
            let (now_strain, why) = if let Some((name, _, _)) = full {
                (Strain::AtLimit, format!("{name} reached its memory limit"))
            } else if g.strain < Strain::AboveTolerance
                && strain(&g.spec, told.iter().filter_map(|t| t.1)) >= Strain::AboveTolerance
            {
                // The files put the group above its tolerance: the whole readings, every one
                // of them, say whether it is.
                let readings: Option<Vec<Memory>> = told.iter().map(whole).collect();
                let s = readings.map_or(Strain::Within, |r| strain(&g.spec, r));
                (s, "its memory went above its tolerance".to_owned())
            } else {
                (Strain::Within, String::new())
            };
            if wakes(&g.spec, g.strain, now_strain, since) {
                tracing::debug!(group = %g.spec.name, "{why}: reconciling {} now", g.spec.name);
                g.next = now;
            }
        }
    }

    /// Incus answers again: groups that were backing off because it could not be reached are
    /// retried at once.
    pub fn incus_back(&mut self, now: Instant) {
        for g in self.groups.values_mut().filter(|g| g.unreachable) {
            tracing::info!(group = %g.spec.name, "Incus is back: reconciling {} now", g.spec.name);
            g.unreachable = false;
            g.failures = 0;
            g.next = now;
        }
    }

    /// When the next group is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.groups.values().map(|g| g.next).min()
    }

    /// Reconciles every group due at `now`, concurrently.
    pub async fn run_due(&mut self, now: Instant) {
        // A due group whose lease this daemon has not read yet (at start, or after it ran
        // out), or has just taken and not read back, gets one round of its project's leases
        // now rather than at the next renewal.
        let unknown: BTreeSet<String> = self
            .groups
            .values()
            .filter(|g| g.next <= now)
            .filter(|g| {
                matches!(
                    self.ctx
                        .leases
                        .standing(&g.spec.project, g.spec.name.as_str()),
                    Standing::Unknown | Standing::Confirming
                )
            })
            .map(|g| g.spec.project.clone())
            .collect();
        let all = self.ctx.leases.groups();
        for project in unknown {
            let groups = all.get(&project).cloned().unwrap_or_default();
            let result = self
                .ctx
                .leases
                .renew(self.ctx.incus.as_ref(), &project, &groups)
                .await;
            self.ctx.leases.say(&project, result);
        }
        let ctx = &self.ctx;
        let memory = self.memory.as_ref();
        let interval = self.interval;
        let resync = self.resync;
        let parallel = self.parallel;
        // The groups of this round share the hosts' readings and what each planned there.
        let round = &Round::new(self.reserve);
        let due = self.groups.values_mut().filter(|g| g.next <= now);
        let passes = due.map(|g| async move {
            let result = pass::reconcile(ctx, memory, g, now, resync, parallel, round).await;
            let done = Instant::now();
            ctx.telemetry.pass(
                g.spec.name.as_str(),
                &g.spec.project,
                done.saturating_duration_since(now),
            );
            g.done = Some(done);
            let removed = match result {
                Ok((summary, requeue_in, removed)) => {
                    g.failures = 0;
                    g.unreachable = false;
                    let regular = done.checked_add(interval).unwrap_or(done);
                    let due = requeue_in.and_then(|r| now.checked_add(r));
                    g.next = due.map_or(regular, |d| d.clamp(done, regular));
                    g.last = Some(summary);
                    removed
                }
                Err((e, summary, removed)) => {
                    let delay = backoff(g.failures);
                    g.failures = g.failures.saturating_add(1);
                    g.unreachable = e.is_transport();
                    g.next = done + delay;
                    tracing::warn!(group = %g.spec.name, error = %e, retry_in = %humantime::format_duration(delay),
                        "reconciling {} failed: {e}; retrying in {}", g.spec.name, humantime::format_duration(delay));
                    ctx.telemetry.error(g.spec.name.as_str(), &g.spec.project);
                    let mut s = summary.or_else(|| g.last.clone()).unwrap_or(Summary {
                        current: 0,
                        desired: 0,
                        unhealthy: 0,
                        warm: 0,
                        failing: Vec::new(),
                        utilization: None,
                        signals: Vec::new(),
                        reason: Reason::NoMetrics,
                        error: None,
                        standby: None,
                        hold: None,
                    });
                    s.error = Some(e.to_string());
                    g.last = Some(s);
                    removed
                }
            };
            let until = done + OWN_EVENTS;
            removed
                .into_iter()
                .map(move |name| ((g.spec.project.clone(), name), until))
                .collect::<Vec<_>>()
        });
        for own in futures_util::future::join_all(passes).await {
            self.own.extend(own);
        }
    }

    /// The last outcome of each group.
    pub fn summaries(&self) -> impl Iterator<Item = (&GroupSpec, Option<&Summary>)> {
        self.groups.values().map(|g| (&g.spec, g.last.as_ref()))
    }

    /// Writes [`Reconciler::board`] to the control socket's board and gauges.
    pub fn publish(&self, now: Instant) {
        self.ctx.telemetry.publish(self.board(now));
    }

    /// What `incus-hpa status` and the metrics show, as of `now`.
    pub fn board(&self, now: Instant) -> Status {
        let wall = std::time::SystemTime::now();
        let at = |t: Instant| {
            let t = wall + t.saturating_duration_since(now);
            humantime::format_rfc3339_seconds(t).to_string()
        };
        let groups = self
            .groups
            .values()
            .map(|g| {
                let s = &g.spec;
                let last = g.last.as_ref();
                GroupStatus {
                    name: s.name.to_string(),
                    project: s.project.clone(),
                    current: last.map_or(0, |l| l.current),
                    desired: last.map_or(0, |l| l.desired),
                    min: s.min,
                    max: s.max,
                    unhealthy: last.map_or(0, |l| l.unhealthy),
                    warm: last.map_or(0, |l| l.warm),
                    failing: last.map(|l| l.failing.clone()).unwrap_or_default(),
                    utilization: last.and_then(|l| l.utilization),
                    threshold: s.memory_threshold,
                    signals: last
                        .map(|l| l.signals.iter().map(Into::into).collect())
                        .unwrap_or_default(),
                    reason: last.map_or_else(|| "pending".into(), |l| l.reason.to_string()),
                    paused: s.paused,
                    last_action: g.last_action.clone(),
                    next_pass: Some(at(g.next)),
                    last_error: last.and_then(|l| l.error.clone()),
                    standby: last.and_then(|l| l.standby.clone()),
                    scale_down_window: last.and_then(|l| l.hold).map(|h| h.describe()),
                }
            })
            .collect();
        Status { groups }
    }

    /// A one-line summary for `STATUS=` (see [`report::status_line`]).
    pub fn status_line(&self) -> String {
        report::status_line(self.summaries())
    }
}

/// Delay before retry number `failures + 1`.
pub fn backoff(failures: u32) -> Duration {
    BACKOFF_BASE
        .checked_mul(1u32.checked_shl(failures.min(20)).unwrap_or(u32::MAX))
        .unwrap_or(BACKOFF_MAX)
        .min(BACKOFF_MAX)
}
