//! The control socket: what the running daemon thinks, for people (`incus-hpa status`) and for
//! Prometheus (`GET /metrics`). HTTP/1 over a unix socket (hyper), read-only.
//!
//! - `GET /status`: `{"groups": [GroupStatus…]}`, the board the loop writes after passes end
//!   (at most every [`crate::daemon::PUBLISH_EVERY`]; each group's `standby` read from the
//!   leases when asked, [`Telemetry::live_standby`]);
//! - `GET /metrics`: the Prometheus exposition (prometheus-client) of [`Telemetry`], in
//!   OpenMetrics or the classic text format as the client asks ([`crate::exposition`]).
//!
//! This module owns the documents; `telemetry` owns the metrics, and `listen` the listeners
//! (binding, accepting, the limits on connections). The socket appears at its path with mode
//! 0660 (root and the members of the socket's group may read it); a socket that cannot be
//! created is logged and the daemon goes on without it.
//!
//! With `[daemon] metrics_address`, `GET /metrics` (and nothing else) is also served on TCP,
//! for a Prometheus that cannot reach the unix socket.

pub mod detail;
mod listen;
mod telemetry;

use serde::{Deserialize, Serialize};

pub use telemetry::{endpoint, Requests, Standby, Telemetry};

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
    /// Instances that count toward the desired count: healthy (starting ones included), or
    /// stopped and being restarted.
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
    /// Instances counted in `current` whose ready check has not passed since their start: not
    /// in service yet (always 0 for a group without a `ready` table).
    #[serde(default)]
    pub starting: u32,
    /// Running instances its ready check took out of service (not ready, or never ready): not
    /// counted in `current` nor in `unhealthy`, replaced.
    #[serde(default)]
    pub not_ready: u32,
    /// Every instance of the group as the last pass saw it; empty before the first pass.
    #[serde(default)]
    pub instances: Vec<InstanceState>,
    /// The group's endpoints (`[groups.NAME.endpoints]`): the set last published, whether a
    /// run is due or being retried, and why the last run failed; absent without the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<crate::endpoints::EndpointsStatus>,
    /// The right-sizing advice the daemon last found on the group's history (each hour, for a
    /// group scaled on memory with a `limits.memory` and a state directory; see `incus-hpa
    /// advise`): `null` before the first, or when it was found for another size.
    #[serde(default)]
    pub advice: Option<crate::history::Advised>,
}

/// One instance of a group, as `status --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceState {
    pub name: String,
    /// `running`, `ready`, `stopped`, `frozen`, `error`, `transition` or `unreachable`.
    pub status: String,
    /// `unchecked` (the group has no `ready` table, or it does not run), `starting`, `ready`,
    /// `not-ready` or `never-ready`.
    pub readiness: String,
    /// Why it is not ready (its check's last failure); `null` when it is, or nothing failed.
    pub why: Option<String>,
    /// Its address on the group's interface, when read; `null` otherwise.
    pub address: Option<String>,
}

impl InstanceState {
    /// The instance as the daemon's pass saw it.
    pub fn of(i: &crate::model::InstanceView) -> Self {
        use crate::model::InstanceStatus as S;
        Self {
            name: i.name.clone(),
            status: match i.status {
                S::Running => "running",
                S::Ready => "ready",
                S::Stopped => "stopped",
                S::Frozen => "frozen",
                S::Error => "error",
                S::Transition => "transition",
                S::Unreachable => "unreachable",
            }
            .into(),
            readiness: i.readiness.as_str().into(),
            why: i
                .readiness
                .why()
                .filter(|w| !w.is_empty())
                .map(str::to_owned),
            address: i.address.map(|a| a.to_string()),
        }
    }

    /// In service by its status and its check: running and ready (or not checked), or frozen
    /// and still ready (as [`crate::endpoints::in_service`] has it).
    pub fn serves(&self) -> bool {
        match self.status.as_str() {
            "running" | "ready" => matches!(self.readiness.as_str(), "unchecked" | "ready"),
            "frozen" => self.readiness == "ready",
            _ => false,
        }
    }
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

impl SignalStatus {
    /// The unit of its value and target: `%`, or nothing for an external signal's number.
    fn unit(&self) -> &'static str {
        if self.name.starts_with("external") {
            ""
        } else {
            "%"
        }
    }

    /// Its value with its unit, or `none` without a reading.
    fn shown(&self, none: &str) -> String {
        self.value
            .map_or_else(|| none.into(), |v| format!("{v:.1}{}", self.unit()))
    }
}

/// The signals other than memory, for the table: `cpu 82.0%/70% → 4, external 1 130/20 → 7`.
fn signals(all: &[SignalStatus]) -> String {
    let shown: Vec<String> = all
        .iter()
        .filter(|s| s.name != "memory")
        .map(|s| {
            let wants = s.wants.map_or_else(|| "-".into(), |w| w.to_string());
            format!(
                "{} {}/{}{} → {wants}",
                s.name,
                s.shown("-"),
                s.target,
                s.unit()
            )
        })
        .collect();
    if shown.is_empty() {
        "-".into()
    } else {
        shown.join(", ")
    }
}

/// The widest `incus-hpa status` prints its table.
pub const TABLE_WIDTH: usize = 100;

/// The NOTE cell: what is out of the ordinary, most pressing first (`-` when nothing is).
fn note(g: &GroupStatus) -> String {
    let mut notes = Vec::new();
    if g.starting > 0 {
        notes.push(format!("{} starting", g.starting));
    }
    if g.not_ready > 0 {
        notes.push(format!("{} not ready", g.not_ready));
    }
    if let Some(e) = &g.last_error {
        notes.push(format!("error: {e}"));
    }
    if let Some(h) = &g.standby {
        notes.push(format!("standby ({h})"));
    }
    if g.paused {
        notes.push("paused".into());
    }
    if !g.failing.is_empty() {
        notes.push(format!("{} failing", g.failing.len()));
    }
    if notes.is_empty() {
        "-".into()
    } else {
        notes.join("; ")
    }
}

/// Formats a status document as a table in the style of `incus list`, at most
/// [`TABLE_WIDTH`] columns wide; `status GROUP` shows the rest ([`detail`]).
pub fn table(status: &Status) -> String {
    let header = [
        "GROUP", "PROJECT", "CURRENT", "DESIRED", "MIN-MAX", "MEMORY", "SIGNALS", "REASON", "NOTE",
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
                format!("{}-{}", g.min, g.max),
                match (g.utilization, g.threshold) {
                    (_, None) => "-".into(),
                    (None, Some(t)) => format!("-/{t}%"),
                    (Some(u), Some(t)) => format!("{u:.1}%/{t}%"),
                },
                signals(&g.signals),
                g.reason.clone(),
                note(g),
            ]
        })
        .collect();
    // SIGNALS and NOTE are cut first: `status GROUP` shows them whole.
    crate::table::render_within(&header, &rows, TABLE_WIDTH, &[6, 8])
}

#[cfg(test)]
mod listen_tests;
#[cfg(test)]
mod tests;
