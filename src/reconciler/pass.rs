//! One pass of one group: read this daemon's standing on the group, observe, decide, act (if
//! this daemon holds the group's lease), and remember what happened in the group's history and
//! last action. What the loop does with the outcome (requeue, backoff) is the parent module's.
//!
//! The standing is read before the observation and again after it: a pass acts only on
//! instances it listed while this daemon held the lease all along, never on a list taken while
//! another daemon may still have been acting. The external signals' values come with the pass
//! (see [`super::runs`]): it never waits for a program.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use super::Context;
use crate::act::{self, ActError, Done, Outcome};
use crate::control::LastAction;
use crate::decide::{decide, History};
use crate::headroom::{self, Round};
use crate::incus::IncusError;
use crate::lease::{learned, Standing};
use crate::memory::MemorySource;
use crate::model::{Action, GroupSpec, Observation, Summary};
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

/// What a group keeps from one pass to the next, moved into the pass while it runs.
pub(super) struct Carried {
    pub(super) history: History,
    /// Each instance's OOM counter at the last pass, for the history's rows.
    pub(super) kills: std::collections::BTreeMap<String, u64>,
    /// Foreign instances already reported.
    pub(super) reported: BTreeSet<String>,
    /// The group's schedule windows, compiled.
    pub(super) windows: crate::schedule::Windows,
}

/// Instances, with their memory limits where a pass read them.
pub(super) type Watched = Vec<(String, Option<u64>)>;

/// What one pass works on, and what it found for the loop.
pub(super) struct Work {
    pub(super) spec: GroupSpec,
    pub(super) carried: Carried,
    /// The external signals' values for this pass (`None`: unknown).
    pub(super) external: Vec<Option<f64>>,
    /// The last pass's outcome: a decision that repeats it is logged at debug level.
    pub(super) last: Option<Summary>,
    /// The instances the pass saw (and created), with their memory limits where it read them,
    /// and what their readings said of the group's strain: what the watch reads next.
    pub(super) seen: Option<(Watched, crate::decide::adaptive::Strain)>,
    /// The last action carried out.
    pub(super) last_action: Option<LastAction>,
    /// The pass as the history keeps it, when it keeps passes.
    pub(super) record: Option<crate::history::Record>,
}

/// When a pass last read the leases of a project itself (see [`read_unknown_lease`]).
pub(super) type LeaseRead = tokio::sync::Mutex<Option<Instant>>;

/// What a pass is given besides its group: the daemon's settings as it starts, the round of
/// host readings it shares with the passes that start with it, and its project's lease reads.
pub(super) struct Given {
    pub(super) resync: Duration,
    /// `[daemon] max_parallel_actions`.
    pub(super) parallel: usize,
    pub(super) round: std::sync::Arc<Round>,
    pub(super) lease_read: std::sync::Arc<LeaseRead>,
    /// The history keeps passes.
    pub(super) keeps: bool,
}

/// A group whose lease this daemon has not read yet (at start, or after it ran out), or has
/// just taken and not read back, gets one round of its project's leases now rather than at
/// the next renewal: once for the passes of one project that start together (`read` says when
/// the last round of a pass ended; one that ended after this pass started serves it).
async fn read_unknown_lease(ctx: &Context, spec: &GroupSpec, read: &LeaseRead, started: Instant) {
    let (project, group) = (spec.project.as_str(), spec.name.as_str());
    let unknown = |s: Standing| matches!(s, Standing::Unknown | Standing::Confirming);
    if !unknown(ctx.leases.standing(project, group)) {
        return;
    }
    let mut last = read.lock().await;
    if last.is_some_and(|t| t >= started) || !unknown(ctx.leases.standing(project, group)) {
        return;
    }
    let groups = ctx.leases.groups().remove(project).unwrap_or_default();
    let result = ctx.leases.renew(ctx.incus.as_ref(), project, &groups).await;
    ctx.leases.say(project, result);
    *last = Some(Instant::now());
}

/// The same standing, whatever a held lease's end.
fn same(a: &Standing, b: &Standing) -> bool {
    matches!((a, b), (Standing::Held { .. }, Standing::Held { .. })) || a == b
}

/// Observes the group with this daemon's standing on it, read before the observation and
/// after. When it changed meanwhile (a standby that took the group over while it listed, a
/// lease that ran out), the group is observed again; when it changed again, the pass does not
/// act (the standing it had before, unless it held the lease then) and says so (`true`): the
/// group is looked at again at once.
async fn observe_standing(
    ctx: &Context,
    memory: &dyn MemorySource,
    spec: &GroupSpec,
    resync: Duration,
) -> Result<(Observation, Standing, bool), IncusError> {
    let (project, group) = (spec.project.as_str(), spec.name.as_str());
    let mut again = false;
    loop {
        let before = ctx.leases.standing(project, group);
        let obs = observe(
            ctx.incus.as_ref(),
            memory,
            &ctx.store,
            &ctx.ready,
            spec,
            resync,
        )
        .await?;
        let after = ctx.leases.standing(project, group);
        if same(&before, &after) {
            return Ok((obs, after, false));
        }
        if again {
            let acting = matches!(after, Standing::Held { .. });
            return Ok((obs, if acting { before } else { after }, true));
        }
        tracing::debug!(
            group,
            "this daemon's standing on {group} changed while it listed \
            the instances: listing them again"
        );
        again = true;
    }
}

/// Resumes `history` from what another holder left for `spec`'s group (see
/// [`crate::lease::learned`]): when it was left at most [`learned::FRESH`] ago and knew the
/// group for longer than `history` does. A store that cannot be read leaves it as it is.
async fn take_over(ctx: &Context, spec: &GroupSpec, history: &mut History, now: Instant) {
    let (project, group) = (spec.project.as_str(), spec.name.as_str());
    let left = match ctx
        .leases
        .left()
        .left(ctx.incus.as_ref(), project, group)
        .await
    {
        Ok(Some(left)) => left,
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(group, error = %e, "cannot read what the last holder of {group} left: {e}");
            return;
        }
    };
    let wall = crate::history::unix_ms(std::time::SystemTime::now());
    let gone = Duration::from_millis(u64::try_from(wall - left.at_unix_ms).unwrap_or(0));
    if left.holder == ctx.leases.me() || gone > learned::FRESH {
        return;
    }
    let resumed = History::resume(spec, &left.saved, gone, now);
    let Some(since) = resumed.since() else { return };
    if history.since().is_some_and(|own| own <= since) {
        return;
    }
    let known = |t: Instant| {
        humantime::format_duration(Duration::from_secs(
            now.saturating_duration_since(t).as_secs(),
        ))
    };
    tracing::info!(
        group,
        "{group} taken over from {}: resumes from what it left {} ago (it knew the group for \
         {}; this daemon for {})",
        crate::lease::holder::short(&left.holder),
        humantime::format_duration(Duration::from_secs(gone.as_secs())),
        known(since),
        history
            .since()
            .map_or_else(|| "no time".into(), |t| known(t).to_string())
    );
    *history = resumed;
}

/// One pass for one group: observe, decide, act, and remember what happened. A plan that
/// adds instances is decided again with the hosts' memory, read then (see
/// [`crate::headroom`]), within what the other passes of its round planned.
pub(super) async fn reconcile(
    ctx: &Context,
    memory: &dyn MemorySource,
    w: &mut Work,
    now: Instant,
    given: &Given,
) -> Result<Passed, Failed> {
    let round = &given.round;
    read_unknown_lease(ctx, &w.spec, &given.lease_read, now).await;
    let (mut obs, standing, unsettled) = observe_standing(ctx, memory, &w.spec, given.resync)
        .await
        .map_err(|e| (ReconcileError::Observe(e), None, Vec::new()))?;
    obs.external = w.external.clone();
    if w.spec.endpoints.is_some() {
        // Only the lease holder publishes; a standby forgets what it published, so that a
        // takeover publishes the set it finds (before it removes anything).
        if matches!(standing, Standing::Held { .. }) {
            ctx.endpoints.observed(&w.spec, &obs);
        } else {
            ctx.endpoints.standby(&w.spec);
        }
    }
    w.seen = Some((
        obs.instances
            .iter()
            .map(|i| (i.name.clone(), i.memory.map(|m| m.limit)))
            .collect(),
        crate::decide::adaptive::strain(&w.spec, obs.instances.iter().filter_map(|i| i.memory)),
    ));
    // Schedule windows follow the wall clock; the pass is due again when one opens or closes.
    let wall = std::time::SystemTime::now();
    let bounds = w.carried.windows.at(wall);
    obs.window = bounds.window();
    let window_change = bounds
        .next_change
        .map(|t| t.duration_since(wall).unwrap_or(Duration::ZERO));
    let Work {
        spec,
        carried: c,
        seen,
        last,
        last_action,
        record,
        ..
    } = w;
    let spec = &*spec;
    c.reported
        .retain(|n| obs.foreign.iter().any(|f| &f.name == n));
    for f in &obs.foreign {
        if c.reported.insert(f.name.clone()) {
            report::foreign(spec, f);
        }
    }
    // A group this daemon now holds and did not at its last pass (or has not passed yet):
    // what the holder before it left, when that knows more than its own history.
    if matches!(standing, Standing::Held { .. })
        && last.as_ref().is_none_or(|l| l.standby.is_some())
    {
        take_over(ctx, spec, &mut c.history, now).await;
    }
    // Only the holder of the group's lease acts; it does nothing past the lease's end.
    let standby = standing.standby();
    let before = c.history.clone();
    let mut plan = decide(spec, &obs, &mut c.history, now);
    if !standing.someone_acts() {
        // Nobody does what was decided: the first pass that acts starts from what there is.
        c.history.not_acted(&before);
    } else if standby.is_none() && plan.actions.iter().any(Action::adds) {
        if let Some(h) = round.read(ctx.incus.as_ref(), spec, &obs, &plan).await {
            obs.headroom = Some(h);
            c.history = before;
            plan = decide(spec, &obs, &mut c.history, now);
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
    // An instance coming into service (or going out of it) by its check is news too.
    let changed = last.as_ref().is_none_or(|p| {
        (p.current, p.desired, p.reason, &p.standby, &p.failing)
            != (
                plan.current,
                plan.desired,
                plan.reason,
                &standby,
                &plan.failing,
            )
            || (p.starting, p.not_ready) != (plan.starting, plan.not_ready)
    });
    let busy = standby.is_none() && !plan.actions.is_empty();
    report::decision(spec, &plan, changed || busy, standby.as_deref());
    if given.keeps {
        let unix_ms = crate::history::unix_ms(wall);
        *record = Some(crate::history::Record::of(
            &obs,
            &plan,
            unix_ms,
            &mut c.kills,
        ));
    }
    let summary = Summary {
        current: plan.current,
        desired: plan.desired,
        unhealthy: plan.unhealthy,
        warm: plan.warm,
        starting: plan.starting,
        not_ready: plan.not_ready,
        instances: plan.instances.clone(),
        failing: plan.failing.clone(),
        utilization: plan.utilization,
        signals: plan.signals.clone(),
        reason: plan.reason,
        error: None,
        standby: standby.clone(),
        hold: plan.hold,
    };
    if standby.is_some() || plan.actions.is_empty() {
        // A lease just taken is read back a renewal after its write: look again then.
        let confirm = ctx.leases.confirm_in(&spec.project, spec.name.as_str());
        // A standing that would not settle: looked at again at once.
        let unsettled = unsettled.then_some(Duration::ZERO);
        let requeue = sooner(sooner(plan.requeue_in, window_change), confirm);
        return Ok((summary, sooner(requeue, unsettled), Vec::new()));
    }
    let (project, group) = (spec.project.as_str(), spec.name.as_str());
    let fence = || ctx.leases.holds(project, group);
    let applied = act::apply(
        &act::Ctx {
            incus: ctx.incus.as_ref(),
            store: &ctx.store,
            spec,
            shutdown: &ctx.stop,
            fence: &fence,
            endpoints: Some(&ctx.endpoints),
            ready: Some(&ctx.ready),
            // No lease is written beside a start (Incus 6.0 can stall it), nor in the middle
            // of a burst for longer than one action.
            quiet: Some(ctx.leases.quiet()),
        },
        &plan.actions,
        given.parallel,
    )
    .await;
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
        *last_action = Some(LastAction {
            at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            kind: o.action.to_owned(),
            instance: o.instance.clone(),
            outcome: outcome.to_owned(),
        });
        if matches!(o.action, "create" | "promote") && o.result.is_ok() {
            // The watch between passes reads it from now on, not from the next pass.
            if let Some((watched, _)) = seen.as_mut() {
                watched.push((o.instance.clone(), None));
            }
        }
        match (o.action, &o.result) {
            ("create", Ok(Done::Finished)) => c.history.created(&o.instance),
            ("create" | "create-warm", Ok(Done::StillRunning)) => {
                c.history.creating(&o.instance, done)
            }
            // A start refused or fenced off says nothing of the instance itself.
            ("start" | "promote", Err(ActError::Refused { .. } | ActError::LeaseLost { .. })) => {}
            ("start" | "promote", _) => {
                c.history.started(spec, &o.instance, o.result.is_ok(), done)
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

/// The sooner of two optional delays.
fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
