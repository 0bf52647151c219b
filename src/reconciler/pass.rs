//! One pass of one group: observe, decide, act (if this daemon holds the group's lease), and
//! remember what happened in the group's history and last action. What the loop does with
//! the outcome (requeue, backoff) is the parent module's.

use std::time::Duration;

use tokio::time::Instant;

use super::{Context, GroupState};
use crate::act::{self, ActError, Done, Outcome};
use crate::control::LastAction;
use crate::decide::decide;
use crate::headroom::{self, Round};
use crate::incus::IncusError;
use crate::memory::MemorySource;
use crate::model::{Action, Summary, Window};
use crate::observe::observe;
use crate::report;

/// Why one reconcile of a group failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("observing failed: {0}")]
    Observe(#[source] IncusError),
    #[error("{failed} of {total} action(s) failed: {first}")]
    Act {
        failed: usize,
        total: usize,
        first: ActError,
    },
}

impl ReconcileError {
    /// True when Incus could not be reached (rather than refusing something).
    pub fn is_transport(&self) -> bool {
        match self {
            ReconcileError::Observe(e) => e.is_transport(),
            ReconcileError::Act { first, .. } => first.is_transport(),
        }
    }
}

/// A pass that worked: its summary, when it wants to run again at the latest, and the
/// instances it removed.
pub(super) type Passed = (Summary, Option<Duration>, Vec<String>);
/// A pass that failed: why, its summary if it got as far as deciding, and what it removed.
pub(super) type Failed = (ReconcileError, Option<Summary>, Vec<String>);

/// One pass for one group: observe, decide, act, and remember what happened. A plan that
/// adds instances is decided again with the hosts' memory, read then (see
/// [`crate::headroom`]), within what the other groups of the `round` planned.
pub(super) async fn reconcile(
    ctx: &Context,
    memory: &dyn MemorySource,
    g: &mut GroupState,
    now: Instant,
    resync: Duration,
    parallel: usize,
    round: &Round,
) -> Result<Passed, Failed> {
    let mut obs = observe(ctx.incus.as_ref(), memory, &ctx.store, &g.spec, resync)
        .await
        .map_err(|e| (ReconcileError::Observe(e), None, Vec::new()))?;
    obs.external = external_values(g, now).await;
    g.watched = obs
        .instances
        .iter()
        .map(|i| (i.name.clone(), i.memory.map(|m| m.limit)))
        .collect();
    g.strain =
        crate::decide::adaptive::strain(&g.spec, obs.instances.iter().filter_map(|i| i.memory));
    // Schedule windows follow the wall clock; the pass is due again when one opens or closes.
    let wall = std::time::SystemTime::now();
    let bounds = g.windows.at(wall);
    if !bounds.open.is_empty() {
        obs.window = Some(Window {
            min: bounds.min,
            max: bounds.max,
        });
    }
    let window_change = bounds
        .next_change
        .map(|t| t.duration_since(wall).unwrap_or(Duration::ZERO));
    let spec = &g.spec;
    g.reported
        .retain(|n| obs.foreign.iter().any(|f| &f.name == n));
    for f in &obs.foreign {
        if g.reported.insert(f.name.clone()) {
            report::foreign(spec, f);
        }
    }
    // Only the holder of the group's lease acts; it does nothing past the lease's end.
    let standing = ctx.leases.standing(&spec.project, spec.name.as_str());
    let standby = standing.standby();
    let before = g.history.clone();
    let mut plan = decide(spec, &obs, &mut g.history, now);
    if !standing.someone_acts() {
        // Nobody does what was decided: the first pass that acts starts from what there is.
        g.history.not_acted(&before);
    } else if standby.is_none() && plan.actions.iter().any(Action::adds) {
        if let Some(h) = round.read(ctx.incus.as_ref(), spec, &obs, &plan).await {
            obs.headroom = Some(h);
            g.history = before;
            plan = decide(spec, &obs, &mut g.history, now);
        }
    }
    if let Some(check) = &plan.headroom {
        round.claim(check);
        if check.held > 0 {
            headroom::report(spec, check);
            ctx.telemetry
                .headroom_blocked(spec.name.as_str(), &spec.project);
        }
    }
    for note in &plan.notes {
        report::note(spec, note);
    }
    let changed = g.last.as_ref().is_none_or(|p| {
        (p.current, p.desired, p.reason, &p.standby, &p.failing)
            != (
                plan.current,
                plan.desired,
                plan.reason,
                &standby,
                &plan.failing,
            )
    });
    let busy = standby.is_none() && !plan.actions.is_empty();
    report::decision(spec, &plan, changed || busy, standby.as_deref());
    let summary = Summary {
        current: plan.current,
        desired: plan.desired,
        unhealthy: plan.unhealthy,
        warm: plan.warm,
        failing: plan.failing.clone(),
        utilization: plan.utilization,
        signals: plan.signals.clone(),
        reason: plan.reason,
        error: None,
        standby: standby.clone(),
        hold: plan.hold,
    };
    if standby.is_some() || plan.actions.is_empty() {
        // A lease just taken is read back one renewal later: look again then.
        let confirm = (ctx.leases.standing(&spec.project, spec.name.as_str())
            == crate::lease::Standing::Confirming)
            .then(|| ctx.leases.confirm_after());
        let requeue = sooner(sooner(plan.requeue_in, window_change), confirm);
        return Ok((summary, requeue, Vec::new()));
    }
    let (project, group) = (spec.project.as_str(), spec.name.as_str());
    let fence = || ctx.leases.holds(project, group);
    // No lease is written while they run (Incus 6.0 can stall a start written beside).
    let acting = ctx.leases.acting().await;
    let applied = act::apply(
        &act::Ctx {
            incus: ctx.incus.as_ref(),
            store: &ctx.store,
            spec,
            shutdown: &ctx.stop,
            fence: &fence,
        },
        &plan.actions,
        parallel,
    )
    .await;
    drop(acting);
    let done = Instant::now();
    let mut requeue_in = sooner(plan.requeue_in, window_change);
    if applied.fenced > 0 {
        tracing::warn!(
            group,
            fenced = applied.fenced,
            "{} action(s) of {group} not started: this daemon's lease of the group ran out \
             (renewing it); looking at {group} again now",
            applied.fenced
        );
        requeue_in = Some(Duration::ZERO);
    }
    let mut removed = Vec::new();
    for o in &applied.outcomes {
        // The same word in the journal (OUTCOME), `status` and the metrics.
        let outcome = match o.result {
            Ok(Done::Finished) => "ok",
            Ok(Done::StillRunning) => "pending",
            Err(_) => "failed",
        };
        ctx.telemetry
            .action(spec.name.as_str(), &spec.project, o.action, outcome, o.took);
        g.last_action = Some(LastAction {
            at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            kind: o.action.to_owned(),
            instance: o.instance.clone(),
            outcome: outcome.to_owned(),
        });
        if matches!(o.action, "create" | "promote") && o.result.is_ok() {
            // The watch between passes reads it from now on, not from the next pass.
            g.watched.push((o.instance.clone(), None));
        }
        match (o.action, &o.result) {
            ("create", Ok(Done::Finished)) => g.history.created(&o.instance),
            ("create" | "create-warm", Ok(Done::StillRunning)) => {
                g.history.creating(&o.instance, done)
            }
            // A start refused or fenced off says nothing of the instance itself.
            ("start" | "promote", Err(ActError::Refused { .. } | ActError::LeaseLost { .. })) => {}
            ("start" | "promote", _) => {
                g.history.started(spec, &o.instance, o.result.is_ok(), done)
            }
            ("delete", _) => removed.push(o.instance.clone()),
            _ => {}
        }
    }
    let total = plan.actions.len();
    let mut failed: Vec<Outcome> = applied
        .outcomes
        .into_iter()
        .filter(|o| o.result.is_err())
        .collect();
    if failed.is_empty() {
        return Ok((summary, requeue_in, removed));
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
        removed,
    ))
}

/// The group's external signals: each program's value, run at most once per interval (a value
/// taken less than an interval ago stands); a failure is said once, until it changes or the
/// program answers again.
async fn external_values(g: &mut GroupState, now: Instant) -> Vec<Option<f64>> {
    let spec = &g.spec;
    let due: Vec<usize> = (0..spec.external.len())
        .filter(|&i| {
            g.external
                .fresh(&(spec.name.clone(), i), now, spec.interval)
                .is_none()
        })
        .collect();
    let runs = due
        .iter()
        .map(|&i| crate::external::read(&spec.external[i]));
    let results = futures_util::future::join_all(runs).await;
    for (&i, result) in due.iter().zip(results) {
        let key = (spec.name.clone(), i);
        let program = &spec.external[i].command[0];
        match &result {
            Ok(_) => {
                if g.external_said.succeeded(&key) {
                    tracing::info!(group = %spec.name, signal = i + 1,
                        "external signal {} of {} ({program}) answers again", i + 1, spec.name);
                }
            }
            Err(e) => {
                if g.external_said.failed(&key, &e.to_string()) {
                    tracing::warn!(group = %spec.name, signal = i + 1, error = %e,
                        "external signal {} of {} ({program}) has no reading: {e}; it holds the \
                         count (never lowers it) until the program answers", i + 1, spec.name);
                }
            }
        }
        g.external.put(key, now, result.ok());
    }
    (0..spec.external.len())
        .map(|i| {
            g.external
                .fresh(&(spec.name.clone(), i), now, spec.interval)
                .flatten()
        })
        .collect()
}

/// The sooner of two optional delays.
fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
