//! The control socket: what the running daemon thinks, for people (`incus-hpa status`) and for
//! Prometheus (`GET /metrics`). HTTP/1 over a unix socket (hyper), read-only.
//!
//! - `GET /status`: `{"groups": [GroupStatus…]}`, the board the loop writes after each pass
//!   (each group's `standby` read from the leases when asked, [`Telemetry::live_standby`]);
//! - `GET /metrics`: the Prometheus exposition (prometheus-client) of [`Telemetry`], in
//!   OpenMetrics or the classic text format as the client asks ([`crate::exposition`]).
//!
//! This module owns the documents and the metrics; `listen` owns the listeners (binding,
//! accepting, the limits on connections). The socket is created mode 0660 (root and the
//! members of the socket's group may read it); a socket that cannot be created is logged and
//! the daemon goes on without it.
//!
//! With `[daemon] metrics_address`, `GET /metrics` (and nothing else) is also served on TCP,
//! for a Prometheus that cannot reach the unix socket.

mod listen;

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

pub use listen::{
    bind, serve, serve_metrics, start, start_metrics, CONNECTION_LIFETIME, HEADER_READ_TIMEOUT,
    MAX_CONNECTIONS,
};

/// The last action of a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastAction {
    /// RFC 3339, UTC.
    pub at: String,
    /// `create`, `start`, `promote`, `create-warm`, `delete`.
    pub kind: String,
    pub instance: String,
    /// `ok`, `failed`, or `pending` (a creation whose end Incus has not told).
    pub outcome: String,
}

/// One group, as `incus-hpa status --json` prints it (stable names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStatus {
    pub name: String,
    pub project: String,
    /// Instances in service (healthy, or stopped and being restarted).
    pub current: u32,
    pub desired: u32,
    pub min: u32,
    pub max: u32,
    pub unhealthy: u32,
    pub warm: u32,
    /// Instances whose start failed too often in a row: not counted in `current`, replaced,
    /// left in place (their start is retried with a backoff).
    #[serde(default)]
    pub failing: Vec<String>,
    /// Mean memory use of the measured instances, percent; `null` when unknown.
    pub utilization: Option<f64>,
    /// The group's `memory_threshold`; `null` when memory is not one of its signals.
    pub threshold: Option<f64>,
    /// Every signal of the group (memory included): its value, target and the count it wants.
    #[serde(default)]
    pub signals: Vec<SignalStatus>,
    /// The decision's `REASON`; `pending` before the first pass.
    pub reason: String,
    pub paused: bool,
    pub last_action: Option<LastAction>,
    /// RFC 3339, UTC: the next pass at the latest.
    pub next_pass: Option<String>,
    pub last_error: Option<String>,
    /// Another daemon holds the group's lease and acts on it: its holder (`HOST:PID:TAG`), or
    /// `nobody: WHY` when the project's lease store cannot be used; `null` when this daemon
    /// acts.
    #[serde(default)]
    pub standby: Option<String>,
    /// The `adaptive` policy's scale-down window in force and why, e.g. "holding 1m 30s after
    /// drops (learned: 3 of the last hour's 5 drops came back within 1m 30s)"; `null` for the
    /// `kubernetes` policy (its window is `scale_down_stabilization`) and before the first pass.
    #[serde(default)]
    pub scale_down_window: Option<String>,
}

/// One signal of a group, as `status --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignalStatus {
    /// `memory`, `cpu`, `pressure` or `external N`.
    pub name: String,
    /// Percent for memory, CPU and pressure, the program's number for an external signal;
    /// `null` without a reading.
    pub value: Option<f64>,
    /// The threshold, or an external signal's target per instance.
    pub target: f64,
    /// The count it wants; `null` without a reading.
    pub wants: Option<u32>,
}

impl From<&crate::model::SignalState> for SignalStatus {
    fn from(s: &crate::model::SignalState) -> Self {
        Self {
            name: s.name.clone(),
            value: s.value,
            target: s.target,
            wants: s.wants,
        }
    }
}

/// The `/status` document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub groups: Vec<GroupStatus>,
}

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
    actions: Family<ActionLabels, Counter>,
    errors: Family<GroupLabels, Counter>,
    headroom_blocked: Family<GroupLabels, Counter>,
    /// Requests to Incus (the client counts them).
    pub requests: Requests,
    /// (Re)connections of the event stream after the first.
    pub reconnects: Counter,
    passes: Family<GroupLabels, Histogram, fn() -> Histogram>,
    action_seconds: Family<KindLabels, Histogram, fn() -> Histogram>,
    refused: Family<ListenerLabels, Counter>,
    board: Mutex<Status>,
    /// Who acts on a group now (see [`Telemetry::live_standby`]).
    standby: std::sync::OnceLock<Standby>,
}

/// Who acts on `group` of `project` now, by this daemon's leases: `None` when this daemon
/// does, else who does or why nobody does.
pub type Standby = std::sync::Arc<dyn Fn(&str, &str) -> Option<String> + Send + Sync>;

impl Default for Telemetry {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("incus_hpa");
        let instances = Family::<InstanceLabels, Gauge>::default();
        registry.register(
            "instances",
            "Instances of a group by state: current (in service), desired, min, max, unhealthy, warm, failing (to start)",
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
            actions,
            errors,
            headroom_blocked,
            requests,
            reconnects,
            passes,
            action_seconds,
            refused,
            board: Mutex::new(Status::default()),
            standby: std::sync::OnceLock::new(),
        }
    }
}

impl Telemetry {
    /// Records how long one pass of a group took.
    pub fn pass(&self, group: &str, project: &str, took: std::time::Duration) {
        self.passes
            .get_or_create(&GroupLabels {
                group: group.into(),
                project: project.into(),
            })
            .observe(took.as_secs_f64());
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
        self.errors
            .get_or_create(&GroupLabels {
                group: group.into(),
                project: project.into(),
            })
            .inc();
    }

    /// Counts a pass that held additions back for lack of memory on the hosts.
    pub fn headroom_blocked(&self, group: &str, project: &str) {
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
            self.paused.get_or_create(&labels).set(i64::from(g.paused));
        }
        *self.board.lock().unwrap_or_else(|e| e.into_inner()) = status;
    }

    /// The counter of connections `listener` (`control` or `metrics`) refused; the first call
    /// shows it at 0, so a listener that serves exports it before it refuses anything.
    fn refused(&self, listener: &str) -> Counter {
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

    /// The `/status` document now.
    pub fn status(&self) -> Status {
        let mut status = self.board.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(who) = self.standby.get() {
            for g in &mut status.groups {
                g.standby = who(&g.project, &g.name);
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

/// Formats a status document as a table in the style of `incus list`.
/// The signals other than memory, for the table: `cpu 82.0%/70% → 4, external 1 130/20 → 7`.
fn signals(all: &[SignalStatus]) -> String {
    let shown: Vec<String> = all
        .iter()
        .filter(|s| s.name != "memory")
        .map(|s| {
            let unit = if s.name.starts_with("external") {
                ""
            } else {
                "%"
            };
            let value = s
                .value
                .map_or_else(|| "-".into(), |v| format!("{v:.1}{unit}"));
            let wants = s.wants.map_or_else(|| "-".into(), |w| w.to_string());
            format!("{} {value}/{}{unit} → {wants}", s.name, s.target)
        })
        .collect();
    if shown.is_empty() {
        "-".into()
    } else {
        shown.join(", ")
    }
}

pub fn table(status: &Status) -> String {
    let header = [
        "GROUP",
        "PROJECT",
        "CURRENT",
        "DESIRED",
        "MIN",
        "MAX",
        "MEMORY",
        "TARGET",
        "SIGNALS",
        "REASON",
        "SCALE-DOWN WINDOW",
        "PAUSED",
        "STANDBY",
        "LAST ACTION",
        "LAST ERROR",
    ];
    let rows: Vec<Vec<String>> = status
        .groups
        .iter()
        .map(|g| {
            vec![
                g.name.clone(),
                g.project.clone(),
                g.current.to_string(),
                g.desired.to_string(),
                g.min.to_string(),
                g.max.to_string(),
                g.utilization
                    .map_or_else(|| "-".into(), |u| format!("{u:.1}%")),
                g.threshold.map_or_else(|| "-".into(), |t| format!("{t}%")),
                signals(&g.signals),
                g.reason.clone(),
                g.scale_down_window.clone().unwrap_or_else(|| "-".into()),
                if g.paused { "yes" } else { "no" }.into(),
                g.standby
                    .clone()
                    .map_or_else(|| "no".into(), |h| format!("yes ({h})")),
                g.last_action.as_ref().map_or_else(
                    || "-".into(),
                    |a| format!("{} {} {} ({})", a.at, a.kind, a.instance, a.outcome),
                ),
                g.last_error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    crate::table::render(&header, &rows)
}

#[cfg(test)]
mod listen_tests;
#[cfg(test)]
mod tests {
    use super::endpoint;

    #[test]
    fn endpoints_name_no_instance_nor_operation() {
        assert_eq!(endpoint("/1.0"), "/1.0");
        assert_eq!(
            endpoint("/1.0/instances?recursion=1&project=p"),
            "/1.0/instances"
        );
        assert_eq!(
            endpoint("/1.0/instances/web-a/state?project=p"),
            "/1.0/instances/{name}/state"
        );
        assert_eq!(
            endpoint("/1.0/instances/web-a/exec"),
            "/1.0/instances/{name}/exec"
        );
        assert_eq!(
            endpoint("/1.0/operations/1c2d-33/wait?timeout=5"),
            "/1.0/operations/{id}/wait"
        );
        assert_eq!(endpoint("/1.0/metrics?project=p"), "/1.0/metrics");
    }
}
