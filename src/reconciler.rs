//! The reconcile loop: per group, observe → decide → act, requeued after the interval, or
//! after an exponential backoff when it failed. Level-triggered: each pass reads what is there
//! now; the only memory kept is the stabilization history, which is safe to lose.
//!
//! Groups are independent: they are reconciled concurrently, and one group's failure (a
//! missing image, say) only backs that group off.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::act::{self, Outcome};
use crate::decide::{decide, History};
use crate::incus::{Incus, IncusError};
use crate::memory::MemorySource;
use crate::model::{DesiredState, GroupName, GroupSpec, Plan, Reason};
use crate::observe::observe;

/// First retry delay after a failed reconcile; doubles up to [`BACKOFF_MAX`].
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Longest delay between retries of a failing group.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Why one reconcile of a group failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("observing failed: {0}")]
    Observe(#[source] IncusError),
    #[error("{failed} of {total} action(s) failed: {first}")]
    Act {
        failed: usize,
        total: usize,
        first: IncusError,
    },
}

/// What the reconciler needs from the outside world.
#[derive(Clone)]
pub struct Context {
    pub incus: Arc<dyn Incus>,
    pub memory: Arc<dyn MemorySource>,
    /// Set on shutdown: the action in flight completes, no new one starts.
    pub stop: Arc<AtomicBool>,
}

/// The last outcome of a group, for the status line.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub current: u32,
    pub desired: u32,
    pub utilization: Option<f64>,
    pub reason: Reason,
    pub error: Option<String>,
}

struct GroupState {
    spec: GroupSpec,
    history: History,
    next: Instant,
    failures: u32,
    last: Option<Summary>,
}

/// Every managed group and when it is next due.
pub struct Reconciler {
    ctx: Context,
    interval: Duration,
    groups: BTreeMap<GroupName, GroupState>,
}

impl Reconciler {
    /// A reconciler with every group of `state` due at `now`.
    pub fn new(ctx: Context, state: &DesiredState, now: Instant) -> Self {
        let mut r = Self {
            ctx,
            interval: state.daemon.interval,
            groups: BTreeMap::new(),
        };
        r.set_desired(state, now);
        r
    }

    /// Switches to a new desired state: new and changed groups are due at once (their history
    /// is kept); removed groups are no longer managed and their instances are left alone.
    pub fn set_desired(&mut self, state: &DesiredState, now: Instant) {
        self.interval = state.daemon.interval;
        self.groups.retain(|name, g| {
            let keep = state.groups.contains_key(name);
            if !keep {
                let n = g.last.as_ref().map_or(0, |s| s.current);
                tracing::warn!(group = %name, current = n,
                    "group {name} was removed from the desired state: no longer managing it; its {n} instance(s) are left as they are");
            }
            keep
        });
        for (name, spec) in &state.groups {
            match self.groups.get_mut(name) {
                Some(g) if g.spec == *spec => {}
                Some(g) => {
                    g.spec = spec.clone();
                    g.next = now;
                    g.failures = 0;
                }
                None => {
                    self.groups.insert(
                        name.clone(),
                        GroupState {
                            spec: spec.clone(),
                            history: History::default(),
                            next: now,
                            failures: 0,
                            last: None,
                        },
                    );
                }
            }
        }
    }

    /// Makes due at `now` the groups whose instances `name` could be (same project, name with the
    /// group's prefix: the daemon names every instance it creates so; ownership itself is still
    /// checked by the config key), except those backing off after a failure: an event must not
    /// turn a backoff into a busy loop.
    pub fn wake(&mut self, project: &str, name: &str, now: Instant) {
        for g in self.groups.values_mut() {
            let candidate = g.spec.project == project && name.starts_with(&g.spec.instance_prefix);
            if candidate && g.failures == 0 && g.next > now {
                tracing::debug!(group = %g.spec.name, instance = name, "{name} stopped or vanished: reconciling now");
                g.next = now;
            }
        }
    }

    /// When the next group is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.groups.values().map(|g| g.next).min()
    }

    /// Reconciles every group due at `now`, concurrently.
    pub async fn run_due(&mut self, now: Instant) {
        let ctx = &self.ctx;
        let interval = self.interval;
        let due = self.groups.values_mut().filter(|g| g.next <= now);
        let passes = due.map(|g| async move {
            let result = reconcile(ctx, &g.spec, &mut g.history, g.last.as_ref(), now).await;
            let done = Instant::now();
            match result {
                Ok(summary) => {
                    g.failures = 0;
                    g.next = done + interval;
                    g.last = Some(summary);
                }
                Err((e, summary)) => {
                    let delay = backoff(g.failures);
                    g.failures = g.failures.saturating_add(1);
                    g.next = done + delay;
                    tracing::warn!(group = %g.spec.name, error = %e, retry_in = %humantime::format_duration(delay),
                        "reconciling {} failed: {e}; retrying in {}", g.spec.name, humantime::format_duration(delay));
                    let mut s = summary.or_else(|| g.last.clone()).unwrap_or(Summary {
                        current: 0,
                        desired: 0,
                        utilization: None,
                        reason: Reason::NoMetrics,
                        error: None,
                    });
                    s.error = Some(e.to_string());
                    g.last = Some(s);
                }
            }
        });
        futures_util::future::join_all(passes).await;
    }

    /// The last outcome of each group.
    pub fn summaries(&self) -> impl Iterator<Item = (&GroupName, Option<&Summary>)> {
        self.groups.iter().map(|(n, g)| (n, g.last.as_ref()))
    }

    /// A one-line summary for `STATUS=`: `web 3/3 mem 45% (target 70%); db 1/1 …`.
    pub fn status_line(&self) -> String {
        if self.groups.is_empty() {
            return "no groups configured: nothing to manage".into();
        }
        let parts: Vec<String> = self
            .groups
            .values()
            .map(|g| {
                let name = &g.spec.name;
                match &g.last {
                    None => format!("{name}: pending"),
                    Some(s) => {
                        let mut line = format!(
                            "{name} {}/{} mem {} (target {}%)",
                            s.current,
                            s.desired,
                            fmt_util(s.utilization),
                            g.spec.memory_threshold
                        );
                        if let Some(e) = &s.error {
                            line.push_str(&format!(" ERROR {e}"));
                        }
                        line
                    }
                }
            })
            .collect();
        parts.join("; ")
    }
}

/// Delay before retry number `failures + 1`.
pub fn backoff(failures: u32) -> Duration {
    BACKOFF_BASE
        .checked_mul(1u32.checked_shl(failures.min(20)).unwrap_or(u32::MAX))
        .unwrap_or(BACKOFF_MAX)
        .min(BACKOFF_MAX)
}

/// Utilization for people: `45.3%`, or `unknown`.
pub fn fmt_util(u: Option<f64>) -> String {
    u.map_or_else(|| "unknown".into(), |u| format!("{u:.1}%"))
}

type Failed = (ReconcileError, Option<Summary>);

/// One pass for one group: observe, decide, record, act.
async fn reconcile(
    ctx: &Context,
    spec: &GroupSpec,
    history: &mut History,
    previous: Option<&Summary>,
    now: Instant,
) -> Result<Summary, Failed> {
    let obs = observe(ctx.incus.as_ref(), ctx.memory.as_ref(), spec)
        .await
        .map_err(|e| (ReconcileError::Observe(e), None))?;
    let plan = decide(spec, &obs, history, now);
    history.record(
        now,
        &plan,
        spec.scale_down_stabilization
            .max(spec.scale_up_stabilization),
    );
    let changed = previous.is_none_or(|p| {
        (p.current, p.desired, p.reason) != (plan.current, plan.desired, plan.reason)
    });
    log_decision(spec, &plan, changed || !plan.actions.is_empty());
    let summary = Summary {
        current: plan.current,
        desired: plan.desired,
        utilization: plan.utilization,
        reason: plan.reason,
        error: None,
    };
    let outcomes = act::apply(ctx.incus.as_ref(), spec, &plan, &ctx.stop).await;
    let total = plan.actions.len();
    let mut failed: Vec<Outcome> = outcomes.into_iter().filter(|o| o.result.is_err()).collect();
    if failed.is_empty() {
        return Ok(summary);
    }
    let n = failed.len();
    let first = failed.remove(0).result.expect_err("filtered on errors");
    Err((
        ReconcileError::Act {
            failed: n,
            total,
            first,
        },
        Some(summary),
    ))
}

/// One line per decision: at info level when it acts or differs from the previous one, at
/// debug level when it repeats itself (`RUST_LOG=incus_hpa=debug` shows every tick).
fn log_decision(spec: &GroupSpec, plan: &Plan, notable: bool) {
    let util = fmt_util(plan.utilization);
    let util_field = plan
        .utilization
        .map_or_else(|| "unknown".into(), |u| format!("{u:.1}"));
    let target = spec.memory_threshold;
    let (c, d) = (plan.current, plan.desired);
    let msg = match plan.reason {
        Reason::BelowMin => format!("{c} instance(s), below min {}: scaling to {d}", spec.min),
        Reason::AboveMax => format!("{c} instance(s), above max {}: scaling to {d}", spec.max),
        Reason::AboveThreshold if d > c => format!("memory {util} above target {target}%: scaling up from {c} to {d}"),
        Reason::AboveThreshold => format!("memory {util} above target {target}%: keeping {c} (max {})", spec.max),
        Reason::BelowThreshold if d < c => format!("memory {util} below target {target}%: scaling down from {c} to {d}"),
        Reason::BelowThreshold => format!("memory {util} below target {target}%: keeping {c} (min {})", spec.min),
        Reason::Stabilizing => format!("memory {util} below target {target}%: keeping {c} during the scale-down stabilization window"),
        Reason::StabilizingUp => format!("memory {util} above target {target}%: keeping {c} during the scale-up stabilization window"),
        Reason::MetricsMissing => format!("memory {util}, but some instances have no reading: keeping {c}"),
        Reason::NoMetrics => format!("no memory reading: keeping {c}"),
        Reason::WithinTolerance => format!("memory {util} near target {target}%: keeping {c}"),
    };
    let msg = if plan.step_limited {
        format!("{msg} (step limit; {} recommended)", plan.recommendation)
    } else {
        msg
    };
    let g = spec.name.as_str();
    let reason = plan.reason.as_str();
    if !notable {
        tracing::debug!(group = g, current = c, desired = d, utilization = %util_field, reason, "{g}: {msg}");
    } else {
        tracing::info!(group = g, current = c, desired = d, utilization = %util_field, reason, "{g}: {msg}");
    }
}
