//! The daemon's metrics ([`Telemetry`]): what the loop counts and gauges per group, what the
//! Incus client counts ([`Requests`]), the status board the loop writes after each pass, and
//! the Prometheus registry `GET /metrics` renders. A group taken out of the desired state
//! takes its series with it ([`Telemetry::retain_groups`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::Status;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    group: String,
    project: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    group: String,
    project: String,
    signal: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    group: String,
    project: String,
    kind: String,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabels {
    group: String,
    project: String,
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    endpoint: String,
    /// `2xx`, `4xx`, `5xx`…, or `error` when no answer came.
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    /// `control` (the unix socket) or `metrics` (`[daemon] metrics_address`).
    listener: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// Requests to Incus by method, endpoint (names and ids replaced by placeholders) and status
/// class; the client counts into it.
#[derive(Debug, Clone, Default)]
pub struct Requests(Family<RequestLabels, Counter>);

impl Requests {
    pub fn count(&self, method: &str, path: &str, status: Option<u16>) {
        self.0
            .get_or_create(&RequestLabels {
                method: method.into(),
                endpoint: endpoint(path),
                status: status.map_or_else(|| "error".into(), |s| format!("{}xx", s / 100)),
            })
            .inc();
    }
}

/// `/1.0/instances/web-a/state?project=p` → `/1.0/instances/{name}/state`: the path without
/// its query, every segment after a collection replaced by a placeholder.
pub fn endpoint(path: &str) -> String {
    let path = path.split('?').next().unwrap_or(path);
    let mut out = Vec::new();
    let mut after = "";
    for seg in path.split('/') {
        out.push(match after {
            "instances" => "{name}",
            "operations" => "{id}",
            _ => seg,
        });
        after = if matches!(after, "instances" | "operations") {
            ""
        } else {
            seg
        };
    }
    out.join("/")
}

fn histogram() -> Histogram {
    // 10 ms to about 80 s.
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

/// How late passes start: round bounds around the 1 s a pass may be late by at most.
fn lateness() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// The daemon's metrics, shared by the loop (which counts) and the socket (which renders).
pub struct Telemetry {
    registry: Registry,
    instances: Family<InstanceLabels, Gauge>,
    utilization: Family<GroupLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    threshold: Family<GroupLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    paused: Family<GroupLabels, Gauge>,
    signal_value: Family<SignalLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    signal_target: Family<SignalLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    signal_wants: Family<SignalLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    advised_limit: Family<GroupLabels, Gauge>,
    advised_saving: Family<GroupLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    actions: Family<ActionLabels, Counter>,
    errors: Family<GroupLabels, Counter>,
    headroom_blocked: Family<GroupLabels, Counter>,
    /// Requests to Incus (the client counts them).
    pub requests: Requests,
    /// (Re)connections of the event stream after the first.
    pub reconnects: Counter,
    passes: Family<GroupLabels, Histogram, fn() -> Histogram>,
    late: Family<GroupLabels, Histogram, fn() -> Histogram>,
    action_seconds: Family<KindLabels, Histogram, fn() -> Histogram>,
    refused: Family<ListenerLabels, Counter>,
    board: Mutex<Status>,
    /// Which groups have series, for [`Telemetry::retain_groups`].
    labelled: Mutex<Labelled>,
    /// Who acts on a group now (see [`Telemetry::live_standby`]).
    standby: std::sync::OnceLock<Standby>,
    /// Each group's endpoints now (see [`Telemetry::live_endpoints`]).
    endpoints: std::sync::OnceLock<Endpoints>,
}

/// The (project, group) pairs that have counters, with the (kind, outcome) of their action
/// counters: what [`Telemetry::retain_groups`] removes; and, once it was called, the groups it
/// kept: a pass of a removed group that ends after the change counts nothing.
#[derive(Default)]
struct Labelled {
    groups: BTreeMap<(String, String), BTreeSet<(String, String)>>,
    kept: Option<BTreeSet<(String, String)>>,
}

/// Who acts on `group` of `project` now, by this daemon's leases: `None` when this daemon
/// does, else who does or why nobody does.
pub type Standby = std::sync::Arc<dyn Fn(&str, &str) -> Option<String> + Send + Sync>;

/// The endpoints of `group` of `project` now (`None`: the group has no `endpoints` table).
pub type Endpoints =
    std::sync::Arc<dyn Fn(&str, &str) -> Option<crate::endpoints::EndpointsStatus> + Send + Sync>;

impl Default for Telemetry {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("incus_hpa");
        let instances = Family::<InstanceLabels, Gauge>::default();
        registry.register(
            "instances",
            "Instances of a group by state: current (in service or starting), desired, min, max, unhealthy, warm, failing (to start); by their ready check: ready (running and in service), starting, not_ready",
            instances.clone(),
        );
        let utilization = Family::default();
        registry.register(
            "utilization_percent",
            "Mean memory use of the measured instances, percent of their limits (NaN: unknown)",
            utilization.clone(),
        );
        let threshold = Family::default();
        registry.register(
            "memory_threshold_percent",
            "The group's memory_threshold: the utilization it scales toward",
            threshold.clone(),
        );
        let paused = Family::default();
        registry.register("paused", "1 when the group is paused", paused.clone());
        let signal_value = Family::default();
        registry.register(
            "signal_value",
            "Each signal's value: percent for memory, cpu and pressure, the program's number for external N (NaN: no reading)",
            signal_value.clone(),
        );
        let signal_target = Family::default();
        registry.register(
            "signal_target",
            "Each signal's threshold, or an external signal's target per instance",
            signal_target.clone(),
        );
        let signal_wants = Family::default();
        registry.register(
            "signal_wanted_instances",
            "The count each signal wants (NaN: no reading); the group takes the highest",
            signal_wants.clone(),
        );
        let advised_limit = Family::default();
        registry.register(
            "advised_memory_limit_bytes",
            "The limits.memory that would have reserved least memory over the group's history, without more time at the limit or overloaded (its own when no other; see incus-hpa advise)",
            advised_limit.clone(),
        );
        let advised_saving = Family::default();
        registry.register(
            "advised_memory_saving_ratio",
            "The share of the memory the group reserved over its history (instances times limit) that the advised limit would have saved: 0 when the advice is the group's own size",
            advised_saving.clone(),
        );
        let actions = Family::default();
        registry.register(
            "actions",
            "Actions carried out, by kind and outcome",
            actions.clone(),
        );
        let errors = Family::default();
        registry.register("reconcile_errors", "Passes that failed", errors.clone());
        let headroom_blocked = Family::default();
        registry.register(
            "headroom_blocked",
            "Passes that held additions back because a host would have gone below host_reserve",
            headroom_blocked.clone(),
        );
        let requests = Requests::default();
        registry.register(
            "incus_requests",
            "Requests to Incus by method, endpoint and status class",
            requests.0.clone(),
        );
        let reconnects = Counter::default();
        registry.register(
            "event_stream_reconnects",
            "Reconnections of the Incus event stream",
            reconnects.clone(),
        );
        let passes =
            Family::<GroupLabels, Histogram, fn() -> Histogram>::new_with_constructor(histogram);
        registry.register(
            "reconcile_duration_seconds",
            "How long a pass of a group took (observe, decide, act)",
            passes.clone(),
        );
        let late =
            Family::<GroupLabels, Histogram, fn() -> Histogram>::new_with_constructor(lateness);
        registry.register(
            "pass_delay_seconds",
            "How long after it was due a pass of a group started",
            late.clone(),
        );
        let action_seconds =
            Family::<KindLabels, Histogram, fn() -> Histogram>::new_with_constructor(histogram);
        registry.register(
            "action_duration_seconds",
            "How long an action took, by kind",
            action_seconds.clone(),
        );
        let refused = Family::default();
        registry.register(
            "listener_refused_connections",
            "Connections a listener closed at once, unanswered, because it already served its limit",
            refused.clone(),
        );
        let build = Family::<BuildLabels, Gauge>::default();
        registry.register("build_info", "The running version", build.clone());
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);
        Self {
            registry,
            instances,
            utilization,
            threshold,
            paused,
            signal_value,
            signal_target,
            signal_wants,
            advised_limit,
            advised_saving,
            actions,
            errors,
            headroom_blocked,
            requests,
            reconnects,
            passes,
            late,
            action_seconds,
            refused,
            board: Mutex::new(Status::default()),
            labelled: Mutex::default(),
            standby: std::sync::OnceLock::new(),
            endpoints: std::sync::OnceLock::new(),
        }
    }
}

impl Telemetry {
    /// Records how long one pass of a group took, and how long after it was due it started.
    pub fn pass(
        &self,
        group: &str,
        project: &str,
        took: std::time::Duration,
        late: std::time::Duration,
    ) {
        if !self.label(project, group, None) {
            return;
        }
        let labels = GroupLabels {
            group: group.into(),
            project: project.into(),
        };
        self.passes
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        self.late.get_or_create(&labels).observe(late.as_secs_f64());
    }

    /// Counts one action's outcome (`ok`, `failed` or `pending`), and how long it took.
    pub fn action(
        &self,
        group: &str,
        project: &str,
        kind: &str,
        outcome: &'static str,
        took: std::time::Duration,
    ) {
        if !self.label(project, group, Some((kind, outcome))) {
            return;
        }
        self.action_seconds
            .get_or_create(&KindLabels { kind: kind.into() })
            .observe(took.as_secs_f64());
        self.actions
            .get_or_create(&ActionLabels {
                group: group.into(),
                project: project.into(),
                kind: kind.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Counts a failed pass.
    pub fn error(&self, group: &str, project: &str) {
        if !self.label(project, group, None) {
            return;
        }
        self.errors
            .get_or_create(&GroupLabels {
                group: group.into(),
                project: project.into(),
            })
            .inc();
    }

    /// Counts a pass that held additions back for lack of memory on the hosts.
    pub fn headroom_blocked(&self, group: &str, project: &str) {
        if !self.label(project, group, None) {
            return;
        }
        self.headroom_blocked
            .get_or_create(&GroupLabels {
                group: group.into(),
                project: project.into(),
            })
            .inc();
    }

    /// Replaces the board, and the gauges with it (groups no longer configured disappear).
    pub fn publish(&self, status: Status) {
        self.instances.clear();
        self.utilization.clear();
        self.threshold.clear();
        self.paused.clear();
        self.signal_value.clear();
        self.signal_target.clear();
        self.signal_wants.clear();
        self.advised_limit.clear();
        self.advised_saving.clear();
        for g in &status.groups {
            let labels = GroupLabels {
                group: g.name.clone(),
                project: g.project.clone(),
            };
            for (state, n) in [
                ("current", g.current),
                ("desired", g.desired),
                ("min", g.min),
                ("max", g.max),
                ("unhealthy", g.unhealthy),
                ("warm", g.warm),
                ("failing", g.failing.len() as u32),
                (
                    "ready",
                    g.instances.iter().filter(|i| i.serves()).count() as u32,
                ),
                ("starting", g.starting),
                ("not_ready", g.not_ready),
            ] {
                self.instances
                    .get_or_create(&InstanceLabels {
                        group: g.name.clone(),
                        project: g.project.clone(),
                        state: state.into(),
                    })
                    .set(i64::from(n));
            }
            self.utilization
                .get_or_create(&labels)
                .set(g.utilization.unwrap_or(f64::NAN));
            if let Some(threshold) = g.threshold {
                self.threshold.get_or_create(&labels).set(threshold);
            }
            for signal in &g.signals {
                let labels = SignalLabels {
                    group: g.name.clone(),
                    project: g.project.clone(),
                    signal: signal.name.clone(),
                };
                self.signal_value
                    .get_or_create(&labels)
                    .set(signal.value.unwrap_or(f64::NAN));
                self.signal_target.get_or_create(&labels).set(signal.target);
                self.signal_wants
                    .get_or_create(&labels)
                    .set(signal.wants.map_or(f64::NAN, f64::from));
            }
            if let Some(a) = &g.advice {
                self.advised_limit
                    .get_or_create(&labels)
                    .set((a.advised.limit_mib * 1024.0 * 1024.0) as i64);
                self.advised_saving.get_or_create(&labels).set(a.saving());
            }
            self.paused.get_or_create(&labels).set(i64::from(g.paused));
        }
        *lock(&self.board) = status;
    }

    /// Forgets every group `state` no longer has (in its project): its counters and
    /// histograms, its gauges and its entry on the board. A group removed from the desired
    /// state, or moved to another project, leaves nothing behind under its old labels; the
    /// series of the groups kept go on. Called on every change of the desired state.
    pub fn retain_groups(&self, state: &crate::model::DesiredState) {
        let kept: BTreeSet<(String, String)> = state
            .groups
            .values()
            .map(|g| (g.project.clone(), g.name.to_string()))
            .collect();
        let mut labelled = lock(&self.labelled);
        labelled.groups.retain(|key, actions| {
            if kept.contains(key) {
                return true;
            }
            let (project, group) = key;
            let labels = GroupLabels {
                group: group.clone(),
                project: project.clone(),
            };
            self.passes.remove(&labels);
            self.late.remove(&labels);
            self.errors.remove(&labels);
            self.headroom_blocked.remove(&labels);
            for (kind, outcome) in std::mem::take(actions) {
                self.actions.remove(&ActionLabels {
                    group: group.clone(),
                    project: project.clone(),
                    kind,
                    outcome,
                });
            }
            false
        });
        let mut board = lock(&self.board).clone();
        board
            .groups
            .retain(|g| kept.contains(&(g.project.clone(), g.name.clone())));
        labelled.kept = Some(kept);
        drop(labelled);
        self.publish(board);
    }

    /// Notes that `group` of `project` has counters, and the action counter (kind, outcome)
    /// when given, for [`Telemetry::retain_groups`]; `false` (count nothing) for a group that
    /// it did not keep.
    #[must_use]
    fn label(&self, project: &str, group: &str, action: Option<(&str, &str)>) -> bool {
        let mut labelled = lock(&self.labelled);
        let key = (project.to_owned(), group.to_owned());
        if labelled.kept.as_ref().is_some_and(|k| !k.contains(&key)) {
            return false;
        }
        let actions = labelled.groups.entry(key).or_default();
        if let Some((kind, outcome)) = action {
            actions.insert((kind.to_owned(), outcome.to_owned()));
        }
        true
    }

    /// The counter of connections `listener` (`control` or `metrics`) refused; the first call
    /// shows it at 0, so a listener that serves exports it before it refuses anything.
    pub(super) fn refused(&self, listener: &str) -> Counter {
        self.refused
            .get_or_create(&ListenerLabels {
                listener: listener.into(),
            })
            .clone()
    }

    /// Reads each group's `standby` from `who` when the status is asked, rather than from the
    /// last pass: a pass that waits on Incus leaves the rest of the board as that pass saw it,
    /// and the lease it acted under may have run out since (set once; later calls are
    /// ignored).
    pub fn live_standby(&self, who: Standby) {
        let _ = self.standby.set(who);
    }

    /// Reads each group's `endpoints` from `read` when the status is asked (set once; later
    /// calls are ignored).
    pub fn live_endpoints(&self, read: Endpoints) {
        let _ = self.endpoints.set(read);
    }

    /// The `/status` document now.
    pub fn status(&self) -> Status {
        let mut status = lock(&self.board).clone();
        if let Some(who) = self.standby.get() {
            for g in &mut status.groups {
                g.standby = who(&g.project, &g.name);
            }
        }
        if let Some(read) = self.endpoints.get() {
            for g in &mut status.groups {
                g.endpoints = read(&g.project, &g.name);
            }
        }
        status
    }

    /// The Prometheus text exposition now.
    pub fn metrics(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A mutex's contents, even after a panic while it was held.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
