//! What Incus reported for one group: its instances (status, memory, place) and the instances
//! that carry its key without being its own.

use std::fmt;
use std::time::Duration;

/// What one running instance uses: its memory, in bytes, and, where the source can tell, its
/// CPU time and pressure.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Memory {
    /// Working set: usage minus inactive file cache where the source can tell.
    pub usage: u64,
    /// The effective limit (the host's memory when the instance has no `limits.memory`).
    pub limit: u64,
    /// How many times the kernel's OOM killer has killed in the instance since it started
    /// (cgroup `memory.events`, or Incus' metrics); `None` when the source cannot tell.
    pub oom_kills: Option<u64>,
    /// CPU time used since the instance started, nanoseconds (a counter: the CPU signal is
    /// its change between two passes); `None` when the source cannot tell.
    pub cpu_ns: Option<u64>,
    /// Pressure stall information, percent: the higher of the instance's `cpu.pressure` and
    /// `memory.pressure` "some avg10"; `None` when the source cannot tell.
    pub pressure: Option<f64>,
}

impl Memory {
    /// Usage as a percentage of the limit, at most 100 (a reading above its limit is a race
    /// or a bogus answer); `None` for a zero limit.
    pub fn percent(&self) -> Option<f64> {
        (self.limit > 0).then(|| (self.usage as f64 * 100.0 / self.limit as f64).min(100.0))
    }
}

/// What a reading is asked to hold besides memory: a group that does not scale on CPU or
/// pressure does not pay for reading them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub cpu: bool,
    pub pressure: bool,
}

impl Wanted {
    /// Everything a source can tell.
    pub const ALL: Wanted = Wanted {
        cpu: true,
        pressure: true,
    };
    /// Memory alone.
    pub const NONE: Wanted = Wanted {
        cpu: false,
        pressure: false,
    };
}

/// The lifecycle state of an instance, as Incus reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceStatus {
    Running,
    /// Running, and its workload said it is ready (through `/dev/incus`): healthy too.
    Ready,
    Stopped,
    /// Paused (`incus pause`): not serving.
    Frozen,
    Error,
    /// Starting, stopping, freezing… or a status this version does not know.
    Transition,
    /// On a cluster member that does not answer (offline): nothing is known of it, and
    /// nothing can be done to it until the member is back.
    Unreachable,
}

impl InstanceStatus {
    /// Healthy means Running or Ready: only healthy instances are measured and serve.
    pub fn is_healthy(self) -> bool {
        matches!(self, Self::Running | Self::Ready)
    }
}

impl fmt::Display for InstanceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Ready => "ready",
            Self::Stopped => "stopped",
            Self::Frozen => "frozen",
            Self::Error => "in error",
            Self::Transition => "in a transition",
            Self::Unreachable => "on an offline cluster member",
        })
    }
}

/// One instance of the group, as observed (ownership already checked).
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedInstance {
    pub name: String,
    pub status: InstanceStatus,
    /// Creation time, nanoseconds since the Unix epoch (orders scale-down: newest first).
    pub created_at: i64,
    /// How long ago Incus last started it (`last_used_at`); `None` when unknown.
    pub since_start: Option<Duration>,
    /// Memory reading; `None` when missing or unreadable (always `None` unless healthy).
    pub memory: Option<Memory>,
    /// The cluster member it is on; empty when Incus is not clustered.
    pub location: String,
    /// It belongs to the group's warm pool ([`WARM_KEY`](super::WARM_KEY)).
    pub warm: bool,
    /// A person protected it from scale-in ([`PROTECTED_KEY`](super::PROTECTED_KEY) is `true`).
    pub protected: bool,
    /// Its readiness, from the group's checks ([`Readiness::Unchecked`] without a `ready`
    /// table).
    pub readiness: super::Readiness,
    /// Its address on the group's interface, once read (only groups with checks read it).
    pub address: super::Address,
}

/// An instance that carries the group's key but that the daemon did not create for the group:
/// a copy, a rename, a move, an import. It is never touched; it is reported once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Foreign {
    pub name: String,
    /// What it looks like, e.g. "a copy of web-k2j4h9".
    pub why: String,
    /// The [`OWNER_KEY`](super::OWNER_KEY) value that would adopt it into the group.
    pub adopt: String,
}

/// The bounds of the group's schedule windows open now (see `crate::schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// The `min` in force instead of the group's, if a window gives one.
    pub min: Option<u32>,
    /// The `max` in force instead of the group's, if a window gives one.
    pub max: Option<u32>,
}

/// Everything observed about one group in one reconcile.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observation {
    /// The group's own instances.
    pub instances: Vec<ObservedInstance>,
    /// Instances with the group's key that are not the group's own.
    pub foreign: Vec<Foreign>,
    /// Each external signal's value, in the order of the group's `external` tables; `None`
    /// when its program gave no number.
    pub external: Vec<Option<f64>>,
    /// The schedule windows open now; `None` when none is.
    pub window: Option<Window>,
    /// The memory of the hosts new instances could go to, read only for a pass that would
    /// add instances (see `crate::headroom`); `None`: not read, additions are not capped.
    pub headroom: Option<super::Headroom>,
}
