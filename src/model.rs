//! Domain types shared by the decision core, the observer and the actor. No IO here.
//!
//! `DesiredState` is what the operator declared (built by `config`), `Observation` is what Incus
//! reported for one group, and `Plan` is what `decide` wants done about the difference.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// The `user.*` config key that marks an instance as created by incus-hpa for a group.
/// Its value is the group name. Only instances carrying it are ever counted, measured or deleted.
pub const GROUP_KEY: &str = "user.incus-hpa.group";

/// A validated group name: lowercase ASCII letters, digits and '-', starting with a letter.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupName(String);

impl GroupName {
    /// Longest accepted group name (it is also the default instance name prefix).
    pub const MAX_LEN: usize = 40;

    /// Checks `s` and wraps it, or says what is wrong with it.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("a group name cannot be empty".into());
        }
        if s.len() > Self::MAX_LEN {
            return Err(format!(
                "a group name has at most {} characters",
                Self::MAX_LEN
            ));
        }
        if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err("a group name starts with a lowercase letter".into());
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
        {
            return Err(format!(
                "a group name has only lowercase letters, digits and '-' (found {c:?})"
            ));
        }
        Ok(Self(s.to_owned()))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where instance memory readings come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemorySourceKind {
    /// The local cgroup files when readable, the Incus API for any instance they do not cover.
    #[default]
    Auto,
    /// Only the local cgroup files (incusd on this host).
    Cgroup,
    /// Only `GET /1.0/instances/NAME/state` (costs incusd ~40 ms of CPU per instance on 6.0).
    Api,
}

/// Daemon-wide settings (`[daemon]`).
#[derive(Debug, Clone, PartialEq)]
pub struct DaemonSpec {
    /// How often every group is reconciled.
    pub interval: Duration,
    /// Where memory readings come from.
    pub memory_source: MemorySourceKind,
}

impl Default for DaemonSpec {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(15),
            memory_source: MemorySourceKind::Auto,
        }
    }
}

/// One group of instances as the operator declared it (`[groups.NAME]`).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSpec {
    pub name: GroupName,
    pub min: u32,
    pub max: u32,
    /// Target average memory use, percent of each instance's limit (1–100).
    pub memory_threshold: f64,
    /// No change while |utilization / threshold − 1| is within this (Kubernetes: 0.1).
    pub tolerance: f64,
    pub image: String,
    pub instance_prefix: String,
    pub profiles: Vec<String>,
    pub project: String,
    pub config: BTreeMap<String, String>,
    pub scale_down_stabilization: Duration,
    pub scale_up_stabilization: Duration,
    /// At most this many instances added by one reconcile (`None`: no limit).
    pub max_scale_up_step: Option<u32>,
    /// At most this many instances removed by one reconcile (`None`: no limit).
    pub max_scale_down_step: Option<u32>,
    /// How long a graceful stop may take before the instance is stopped by force.
    pub stop_timeout: Duration,
}

/// The whole desired state: immutable once built; a reload builds a new one.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DesiredState {
    pub daemon: DaemonSpec,
    pub groups: BTreeMap<GroupName, GroupSpec>,
}

/// Memory of one running instance, in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Memory {
    /// Working set: usage minus inactive file cache where the source can tell.
    pub usage: u64,
    /// The effective limit (the host's memory when the instance has no `limits.memory`).
    pub limit: u64,
}

impl Memory {
    /// Usage as a percentage of the limit; `None` for a zero limit.
    pub fn percent(&self) -> Option<f64> {
        (self.limit > 0).then(|| self.usage as f64 * 100.0 / self.limit as f64)
    }
}

/// The lifecycle state of an instance as far as scaling is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceStatus {
    Running,
    Stopped,
    /// Starting, stopping, frozen, error…: counted, never measured.
    Other,
}

/// One managed instance as observed.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedInstance {
    pub name: String,
    pub status: InstanceStatus,
    /// Creation time, seconds since the Unix epoch (orders scale-down: newest first).
    pub created_at: i64,
    /// Memory reading; `None` when missing or unreadable (always `None` unless running).
    pub memory: Option<Memory>,
}

/// Everything observed about one group in one reconcile.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observation {
    pub instances: Vec<ObservedInstance>,
}

/// Why a plan is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    BelowMin,
    AboveMax,
    AboveThreshold,
    BelowThreshold,
    WithinTolerance,
    /// A metric is missing and the result would have scaled down (or flipped direction).
    MetricsMissing,
    /// No running instance has a metric to decide on.
    NoMetrics,
    /// Scale-down held back by the stabilization window.
    Stabilizing,
    /// Scale-up held back by the scale-up stabilization window.
    StabilizingUp,
}

impl Reason {
    /// Short machine-friendly name, used as the journald `REASON` field.
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::BelowMin => "below-min",
            Reason::AboveMax => "above-max",
            Reason::AboveThreshold => "above-threshold",
            Reason::BelowThreshold => "below-threshold",
            Reason::WithinTolerance => "within-tolerance",
            Reason::MetricsMissing => "metrics-missing",
            Reason::NoMetrics => "no-metrics",
            Reason::Stabilizing => "stabilizing",
            Reason::StabilizingUp => "stabilizing-up",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One step for the actor. The actor executes, it never decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create and start one new instance.
    Create,
    /// Start a managed instance that is stopped (left by a crash or a person).
    Start { name: String },
    /// Stop (gracefully, then by force) and delete a managed instance.
    Remove { name: String },
}

/// The outcome of `decide` for one group.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Managed instances counted now (running, stopped and transitional).
    pub current: u32,
    /// How many there should be.
    pub desired: u32,
    /// Average memory use of the measured running instances, percent of their limits.
    pub utilization: Option<f64>,
    /// The recommendation before stabilization (kept in the history).
    pub recommendation: u32,
    pub reason: Reason,
    /// True when `max_scale_up_step` / `max_scale_down_step` cut the change.
    pub step_limited: bool,
    pub actions: Vec<Action>,
}
