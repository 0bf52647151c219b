//! What `decide` wants done about one group: the [`Plan`], why it is what it is ([`Reason`]),
//! its steps ([`Action`]) and why each is taken ([`Cause`]), the findings about single
//! instances ([`Note`]), and the [`Summary`] a pass leaves for the status line.

use std::fmt;
use std::time::Duration;

use super::observation::{InstanceStatus, ObservedInstance};
use super::serving::{Address, Readiness};

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
    /// A scale-down that protected instances cut short.
    Protected,
    /// An instance is at its memory limit: the demand is unknown, the count at least doubles
    /// (`adaptive` policy).
    AtLimit,
    /// The demand repeats, and one period ago it rose within the time new instances take:
    /// instances are added before the rise (`adaptive` policy).
    Forecast,
    /// CPU use asks for more instances.
    CpuAboveThreshold,
    /// CPU use asks for fewer instances.
    CpuBelowThreshold,
    /// Pressure is above its threshold: the group grows in proportion.
    PressureAboveThreshold,
    /// Pressure is below half its threshold, and no other signal holds the count.
    PressureBelowThreshold,
    /// An external value asks for more instances.
    ExternalAboveTarget,
    /// An external value asks for fewer instances.
    ExternalBelowTarget,
    /// A schedule window is open and its `min` raises the count.
    ScheduleMin,
    /// A schedule window is open and its `max` lowers the count.
    ScheduleMax,
    /// A schedule window that let the group grow above its `max` has closed: the count winds
    /// down to `max` through the scale-down stabilization window and the step limits.
    WindowClosed,
    /// Additions held back: the host (or no cluster member) has room for another instance
    /// above `host_reserve`.
    HostHeadroom,
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
            Reason::Protected => "protected",
            Reason::AtLimit => "at-limit",
            Reason::Forecast => "forecast",
            Reason::CpuAboveThreshold => "cpu-above-threshold",
            Reason::CpuBelowThreshold => "cpu-below-threshold",
            Reason::PressureAboveThreshold => "pressure-above-threshold",
            Reason::PressureBelowThreshold => "pressure-below-threshold",
            Reason::ExternalAboveTarget => "external-above-target",
            Reason::ExternalBelowTarget => "external-below-target",
            Reason::ScheduleMin => "schedule-min",
            Reason::ScheduleMax => "schedule-max",
            Reason::WindowClosed => "window-closed",
            Reason::HostHeadroom => "host-headroom",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why one action is taken (the journald `REASON` of an action entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The group is below its `min`.
    BelowMin,
    /// The group is above its `max`.
    AboveMax,
    /// The signals ask for more instances.
    ScaleUp,
    /// The signals ask for fewer instances.
    ScaleDown,
    /// An instance is missing or unhealthy: its replacement.
    Replace,
    /// More instances serve than desired (an unhealthy one recovered after its replacement).
    Surplus,
    /// A stopped instance is started again.
    Restart,
    /// A crash-looping instance: restarted after its backoff, or replaced after too many crashes.
    CrashLoop,
    /// A start that failed is tried again after its backoff.
    StartRetry,
    /// Unhealthy for longer than `unhealthy_grace`: removed (it was replaced already).
    Unhealthy,
    /// The warm pool is refilled, or shrunk to its size.
    WarmPool,
    /// Never ready within the `start_timeout` of its `[groups.NAME.ready]` check after its
    /// start: a failed start, removed and replaced at once.
    NeverReady,
}

impl Cause {
    /// Short machine-friendly name, used as the journald `REASON` field of an action.
    pub fn as_str(&self) -> &'static str {
        match self {
            Cause::BelowMin => "below-min",
            Cause::AboveMax => "above-max",
            Cause::ScaleUp => "scale-up",
            Cause::ScaleDown => "scale-down",
            Cause::Replace => "replace",
            Cause::Surplus => "surplus",
            Cause::Restart => "restart",
            Cause::CrashLoop => "crash-loop",
            Cause::StartRetry => "start-retry",
            Cause::Unhealthy => "unhealthy",
            Cause::WarmPool => "warm-pool",
            Cause::NeverReady => "never-ready",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One step for the actor. The actor executes, it never decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create and start one new instance, on the cluster member `target` when given (else
    /// where the group's `target`, or Incus' scheduler, puts it).
    Create {
        cause: Cause,
        target: Option<String>,
    },
    /// Take an instance out of the warm pool and start it.
    Promote { name: String, cause: Cause },
    /// Create one instance for the warm pool, stopped (on `target`, as for `Create`).
    CreateWarm { target: Option<String> },
    /// Start a managed instance that is stopped (left by a crash, a reboot or a person).
    Start { name: String, cause: Cause },
    /// Stop (gracefully, then by force) and delete a managed instance.
    Remove { name: String, cause: Cause },
}

impl Action {
    /// Why the action is taken.
    pub fn cause(&self) -> Cause {
        match self {
            Action::Create { cause, .. }
            | Action::Promote { cause, .. }
            | Action::Start { cause, .. }
            | Action::Remove { cause, .. } => *cause,
            Action::CreateWarm { .. } => Cause::WarmPool,
        }
    }

    /// True for what brings an instance up on a host (a creation, a start, a promotion, a
    /// warm-pool creation): what `host_reserve` checks.
    pub fn adds(&self) -> bool {
        !matches!(self, Action::Remove { .. })
    }

    /// The phase of a pass it belongs to: 0 brings instances up, 1 removes, 2 refills the
    /// warm pool (see [`crate::act::apply`]).
    pub fn phase(&self) -> u8 {
        match self {
            Action::Create { .. } | Action::Promote { .. } | Action::Start { .. } => 0,
            Action::Remove { .. } => 1,
            Action::CreateWarm { .. } => 2,
        }
    }
}

/// Something `decide` noticed about one instance, worth one journal entry when it happens.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// It stopped soon after it was started: `crashes` in a row so far. `restart_in` is `None`
    /// when it has crashed too often and is being replaced.
    CrashLoop {
        instance: String,
        crashes: u32,
        ran: Duration,
        restart_in: Option<Duration>,
    },
    /// It was just seen unhealthy: replaced at once, removed after the grace period.
    Unhealthy {
        instance: String,
        status: InstanceStatus,
        grace: Duration,
    },
    /// Its start failed `failures` times in a row: no longer counted as capacity, replaced
    /// (within `max`), left in place, its start tried again in `retry_in`.
    FailingStart {
        instance: String,
        failures: u32,
        retry_in: Duration,
    },
    /// It was just seen on a cluster member that does not answer: still counted (so no
    /// scale-down), replaced after the grace period if the member is still away.
    Unreachable {
        instance: String,
        member: String,
        grace: Duration,
    },
    /// It was ready, and its checks just failed `failures` times in a row (`why`: the last
    /// failure): out of service, replaced at once, removed if still not ready after the grace
    /// period.
    NotReady {
        instance: String,
        why: String,
        grace: Duration,
    },
    /// It was not ready within its check's `start_timeout` after its start (`why`: the last
    /// failure): a failed start, removed and replaced now (unless protected).
    NeverReady { instance: String, why: String },
}

/// One instance of a group as a pass saw it: what `status --json` lists per instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceView {
    pub name: String,
    pub status: InstanceStatus,
    pub readiness: Readiness,
    /// Its address on the group's interface, when read (groups with a network check).
    pub address: Address,
}

impl From<&ObservedInstance> for InstanceView {
    fn from(i: &ObservedInstance) -> Self {
        Self {
            name: i.name.clone(),
            status: i.status,
            readiness: i.readiness.clone(),
            address: i.address,
        }
    }
}

/// The outcome of `decide` for one group.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Capacity now: healthy instances (starting ones too) and stopped ones being restarted
    /// in place.
    pub current: u32,
    /// Healthy instances (Running or Ready) in service: not starting, not failing their
    /// checks.
    pub healthy: u32,
    /// Instances that do not count as capacity (frozen, in error, in a transition), not
    /// counting those that run and fail their checks (`not_ready`).
    pub unhealthy: u32,
    /// Running instances whose check has not passed yet since their start: counted in
    /// `current`, not measured, not in service.
    pub starting: u32,
    /// Running instances out of service by their checks (not ready, or never ready): not
    /// capacity, replaced.
    pub not_ready: u32,
    /// Every instance of the group, as observed.
    pub instances: Vec<InstanceView>,
    /// Stopped instances of the warm pool.
    pub warm: u32,
    /// Instances whose start failed too often in a row: not capacity, left in place.
    pub failing: Vec<String>,
    /// The desired count before this pass.
    pub previous: u32,
    /// How many instances should serve: the group's desired count from now on.
    pub desired: u32,
    /// Average memory use of the measured healthy instances, percent of their limits.
    pub utilization: Option<f64>,
    /// Each signal of the group: its value, its target and the count it wants.
    pub signals: Vec<SignalState>,
    /// The recommendation before stabilization (kept in the history).
    pub recommendation: u32,
    pub reason: Reason,
    /// True when `max_scale_up_step` / `max_scale_down_step` cut the change.
    pub step_limited: bool,
    pub actions: Vec<Action>,
    /// Removals that protected instances ([`PROTECTED_KEY`](super::PROTECTED_KEY)) prevented.
    pub protected: u32,
    /// The group is paused: `actions` is empty whatever was decided.
    pub paused: bool,
    /// Findings about single instances (crash loops, newly unhealthy ones).
    pub notes: Vec<Note>,
    /// When this group should be looked at again at the latest, because something is due
    /// (a restart after its backoff, the end of a grace period): `None` means only the interval.
    pub requeue_in: Option<Duration>,
    /// What the host check did to the additions, when the hosts were read.
    pub headroom: Option<super::HeadroomCheck>,
    /// The `adaptive` policy's scale-down window in force and what it learned it from (`None`
    /// for the `kubernetes` policy, whose window is `scale_down_stabilization`).
    pub hold: Option<HoldWindow>,
}

/// How long the `adaptive` policy holds instances after its recommendation drops, learned from
/// how the drops of the last hour came back (`src/decide/hold.rs`), and the count a level of
/// the last hour holds it to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HoldWindow {
    pub window: Duration,
    /// Drops remembered (the last hour).
    pub drops: usize,
    /// Of them, those that came back within the window.
    pub back_within: usize,
    /// The count a level of the demand over the last hour held the group to at the last pass
    /// (the count that would have cost least over the hour's readings), if it held it below
    /// what the other rules asked for.
    pub level: Option<u32>,
    /// The demand repeats: the forecast in force at the last pass, if any.
    pub forecast: Option<Forecast>,
}

/// What the `adaptive` policy's forecast did (`src/decide/forecast.rs`): the demand repeats
/// every `every`, and the count holds what one period ago says comes next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forecast {
    /// The period found in the last hour's demand.
    pub every: Duration,
    /// The count the forecast raised the group to at the last pass, ahead of a recurring rise.
    pub raised: Option<u32>,
}

impl HoldWindow {
    /// For people: "holding 1m 30s after drops (learned: 3 of the last hour's 5 drops came
    /// back within 1m 30s)", or, where the demand repeats, "the
    /// demand repeats every 7m: keeping the instances one period ago says are needed within
    /// 4m, and adding them before each recurring rise (raised to 9)".
    pub fn describe(&self) -> String {
        let w = humantime::format_duration(Duration::from_secs(self.window.as_secs()));
        let hold = match (self.forecast, self.drops, self.window.is_zero()) {
            (Some(f), _, _) => format!(
                "the demand repeats every {}: keeping the instances one period ago says are \
                 needed within 4m, and adding them before each recurring rise{}",
                humantime::format_duration(Duration::from_secs(f.every.as_secs())),
                f.raised.map_or(String::new(), |n| format!(" (raised to {n})"))
            ),
            (None, 0, true) => "letting drops go at once (nothing learned yet)".into(),
            (None, 0, false) => format!("holding {w} after drops (nothing learned yet: no drop in the last hour)"),
            (None, n, true) => format!(
                "letting drops go at once (learned: holding none of the last hour's {n} drop{} would have paid)",
                plural(n)
            ),
            (None, n, false) => format!(
                "holding {w} after drops (learned: {} of the last hour's {n} drop{} came back within {w})",
                self.back_within,
                plural(n)
            ),
        };
        match self.level {
            Some(n) => format!(
                "{hold}; a level over the last hour: {n} instance{} would have cost least",
                plural(n as usize)
            ),
            None => hold,
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// What one signal of a group says in one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalState {
    /// `memory`, `cpu`, `pressure` or `external N` (N from 1, in the file's order).
    pub name: String,
    /// Its value: percent for memory, CPU and pressure, the program's number for an external
    /// signal; `None` when there is no reading.
    pub value: Option<f64>,
    /// Its threshold, or an external signal's target per instance.
    pub target: f64,
    /// The count it wants; `None` when it has no reading (it then never lowers the count).
    pub wants: Option<u32>,
}

/// The last outcome of a group, for the status line.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub current: u32,
    pub desired: u32,
    pub unhealthy: u32,
    pub warm: u32,
    /// Instances counted in `current` whose check has not passed yet since their start.
    pub starting: u32,
    /// Running instances out of service by their checks.
    pub not_ready: u32,
    /// Every instance of the group, as the last pass saw it.
    pub instances: Vec<InstanceView>,
    /// Instances whose start keeps failing (not capacity, left in place).
    pub failing: Vec<String>,
    pub utilization: Option<f64>,
    pub signals: Vec<SignalState>,
    pub reason: Reason,
    pub error: Option<String>,
    /// Another daemon holds the group's lease: its holder id.
    pub standby: Option<String>,
    /// The `adaptive` policy's scale-down window in force.
    pub hold: Option<HoldWindow>,
}
