//! The reconcile loop: per group, observe → decide → act, requeued after the interval (sooner
//! when something is due, such as a restart after its backoff), or after an exponential backoff
//! when it failed. Level-triggered: each pass reads what is there now; the only memory kept is
//! the decision history, which is safe to lose.
//!
//! Groups are independent: they are reconciled concurrently, and nothing of one group waits
//! for another. Each group's pass starts when the group is due, whatever the other groups'
//! passes are doing (one may drain for minutes); a group whose pass is in flight is not started
//! again until it returns ([`flight`]). No pass waits for an external program: the programs
//! run in the background, and a value that arrives wakes its group ([`runs`]). One group's
//! failure (a missing image, say) only backs that group off. Incus events wake a group early,
//! except the events of the daemon's own removals, and except a group that is backing off; a
//! group backing off because Incus was unreachable is retried as soon as Incus is back. The
//! watch between passes is [`watch`]; one pass of one group is [`pass`].

mod flight;
mod pass;
mod runs;
mod watch;

pub use flight::Ended;
pub use pass::ReconcileError;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

use crate::act::Shutdown;
use crate::control::{GroupStatus, InstanceState, LastAction, Status, Telemetry};
use crate::headroom::Round;
use crate::incus::Incus;
use crate::informer::Store;
use crate::memory::MemorySource;
use crate::model::{DesiredState, GroupName, GroupSpec, HostReserve, MemorySourceKind, Summary};
use crate::report;
use pass::{Carried, LeaseRead};

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
    /// What the readiness checks found ([`crate::ready`]), read by each pass.
    pub ready: Arc<crate::ready::Board>,
    /// Publishes each group's endpoints ([`crate::endpoints`]): a pass of the lease holder
    /// hands it what it observed, and a removal takes its instance out of the set first.
    pub endpoints: Arc<crate::endpoints::Publisher>,
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
        let endpoints = self.endpoints.clone();
        self.telemetry
            .live_endpoints(Arc::new(move |project, group| {
                endpoints.status(project, group)
            }));
    }
}

struct GroupState {
    /// Which declaration of the group this is: a group removed and declared again is another
    /// one, and a pass of the one before that returns finds nothing of its own to update.
    id: u64,
    spec: GroupSpec,
    next: Instant,
    failures: u32,
    /// The last failure was Incus being unreachable.
    unreachable: bool,
    last: Option<Summary>,
    /// The last action carried out, for `incus-hpa status`.
    last_action: Option<LastAction>,
    /// When the last pass ended.
    done: Option<Instant>,
    /// The instances the last pass saw, with their memory limits where it read them: what the
    /// watch between passes reads ([`Reconciler::peek`]).
    watched: pass::Watched,
    /// What their readings said of the group's strain at the last pass.
    strain: crate::decide::adaptive::Strain,
    /// The external signals' values the last pass was given: a run that ends with another
    /// wakes the group.
    external: Vec<Option<f64>>,
    /// What a pass carries to the next: with the pass while one is in flight.
    carried: Option<Carried>,
    /// What happened while a pass was in flight, applied when it returns.
    meanwhile: Meanwhile,
    /// When what the group's decisions learned is next left for the next holder, while this
    /// daemon holds it (see [`crate::lease::learned`]): the first a minute after the group
    /// came, when the first write is due, so that what is written is at most a few seconds old.
    leave_next: Instant,
}

/// What happened to a group while its pass was in flight.
#[derive(Default)]
struct Meanwhile {
    /// Instances an event said stopped or vanished (the pass's own removals are told apart
    /// when it returns).
    events: Vec<String>,
    /// A program's value other than the one the pass was given arrived.
    value: bool,
    /// Incus answers again.
    back: bool,
    /// The group's table changed (a reload).
    changed: bool,
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
    fn new(id: u64, spec: &GroupSpec, now: Instant, history: crate::decide::History) -> Self {
        Self {
            id,
            spec: spec.clone(),
            next: now,
            failures: 0,
            unreachable: false,
            last: None,
            last_action: None,
            done: None,
            watched: Vec::new(),
            strain: Default::default(),
            external: Vec::new(),
            carried: Some(Carried {
                history,
                kills: Default::default(),
                reported: Default::default(),
                windows: windows(spec),
            }),
            meanwhile: Meanwhile::default(),
            leave_next: now + crate::lease::learned::EVERY,
        }
    }

    /// Whether a pass of the group is in flight.
    fn busy(&self) -> bool {
        self.carried.is_none()
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
    /// The last [`GroupState::id`] given.
    last_id: u64,
    /// The passes in flight.
    passes: FuturesUnordered<BoxFuture<'static, flight::Returned>>,
    /// The groups with a pass in flight by project, and the declaration each is of: a group
    /// is never reconciled twice at once, even declared again meanwhile. (By project, then
    /// group: looked up without a copy of either name, for every group at every turn of the
    /// loop.)
    flying: HashMap<String, HashMap<GroupName, u64>>,
    /// The external signals' programs.
    runs: runs::Runs,
    /// The hosts' readings shared by the passes that start together, and when it was opened.
    round: Option<(Instant, Arc<Round>)>,
    /// Per project, when a pass last read its leases itself.
    lease_reads: HashMap<String, Arc<LeaseRead>>,
    /// (project, instance) the daemon removed, until when their events are its own.
    own: HashMap<(String, String), Instant>,
    /// Each group's history on disk (nothing without a state directory).
    history: crate::history::Store,
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
            last_id: 0,
            passes: FuturesUnordered::new(),
            flying: HashMap::new(),
            runs: Default::default(),
            round: None,
            lease_reads: HashMap::new(),
            own: HashMap::new(),
            history: match crate::history::directory(
                state.daemon.state_directory.as_deref(),
                std::env::var_os("STATE_DIRECTORY").as_deref(),
            ) {
                Some(dir) => {
                    tracing::debug!("each group's history is kept under {}", dir.display());
                    crate::history::Store::open(&dir)
                }
                None => crate::history::Store::none(),
            },
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
        self.ctx.telemetry.retain_groups(state);
        self.ctx.endpoints.set_desired(state);
        if state.daemon.memory_source != self.memory_kind {
            self.memory_kind = state.daemon.memory_source;
            self.memory = (self.ctx.memory)(self.memory_kind);
        }
        let shorter = state.daemon.interval < self.interval;
        self.interval = state.daemon.interval;
        self.resync = state.daemon.resync;
        self.parallel = state.daemon.max_parallel_actions;
        self.reserve = state.daemon.host_reserve;
        // The next passes read the hosts afresh, keeping the new reserve.
        self.round = None;
        self.lease_reads.retain(|p, _| projects.contains(p));
        // The programs of groups that stay in their project with the same signals keep their
        // values and their runs; the others' runs are cancelled.
        let kept: Vec<GroupName> =
            self.groups
                .values()
                .filter(|g| {
                    state.groups.get(&g.spec.name).is_some_and(|s| {
                        s.project == g.spec.project && s.external == g.spec.external
                    })
                })
                .map(|g| g.spec.name.clone())
                .collect();
        self.runs.retain(|(group, _)| kept.contains(group));
        self.groups.retain(|name, g| {
            let moved = state.groups.get(name).map(|s| s.project != g.spec.project);
            let n = g.last.as_ref().map_or(0, |s| s.current);
            let after = if g.busy() {
                " (its pass in flight ends first)"
            } else {
                ""
            };
            match moved {
                None => tracing::warn!(group = %name, current = n,
                    "group {name} was removed from the desired state: no longer managing it; \
                     its {n} instance(s) are left as they are{after}"),
                Some(true) => tracing::warn!(group = %name, current = n,
                    "group {name} moved from project {} to {}: its {n} instance(s) in {} are \
                     left as they are{after}", g.spec.project, state.groups[name].project,
                    g.spec.project),
                Some(false) => {}
            }
            moved == Some(false)
        });
        self.history
            .declared(state.groups.keys().map(|g| g.as_str().to_owned()));
        for (name, spec) in &state.groups {
            let g = self.groups.entry(name.clone()).or_insert_with(|| {
                self.last_id += 1;
                GroupState::new(self.last_id, spec, now, self.history.resume(spec, now))
            });
            if g.spec != *spec {
                if g.spec.external != spec.external {
                    // Values of programs that changed are not theirs any more.
                    g.external = Vec::new();
                }
                if let Some(c) = g
                    .carried
                    .as_mut()
                    .filter(|_| g.spec.schedule != spec.schedule)
                {
                    c.windows = windows(spec);
                }
                // A pass in flight ran on the old table: the group is reconciled again when it
                // returns.
                g.meanwhile.changed |= g.busy();
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
    /// failure: an event must not turn a backoff into a busy loop. A group whose pass is in
    /// flight is told when the pass returns (its own removals are known then).
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
            if candidate && g.busy() {
                if !g.meanwhile.events.iter().any(|e| e == name) {
                    g.meanwhile.events.push(name.to_owned());
                }
            } else if candidate && g.failures == 0 && g.next > now {
                tracing::debug!(group = %g.spec.name, instance = name, "{name} stopped or vanished: reconciling now");
                g.next = now;
            }
        }
    }

    /// Incus answers again: groups that were backing off because it could not be reached are
    /// retried at once.
    pub fn incus_back(&mut self, now: Instant) {
        for g in self.groups.values_mut() {
            g.meanwhile.back |= g.busy();
        }
        for g in self
            .groups
            .values_mut()
            .filter(|g| g.unreachable && !g.busy())
        {
            tracing::info!(group = %g.spec.name, "Incus is back: reconciling {} now", g.spec.name);
            g.unreachable = false;
            g.failures = 0;
            g.next = now;
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
                    starting: last.map_or(0, |l| l.starting),
                    not_ready: last.map_or(0, |l| l.not_ready),
                    endpoints: None,
                    advice: self.history.advice(s),
                    instances: last
                        .map(|l| l.instances.iter().map(InstanceState::of).collect())
                        .unwrap_or_default(),
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
