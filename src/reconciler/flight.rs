//! Passes in flight: each group's pass starts when the group is due and returns on its own,
//! whatever the other groups' passes are doing. While it runs, what the pass carries from one
//! pass to the next (the decision history) is with it, and the group is not started again;
//! what happens to the group meanwhile (an event, a program's value, a reload) is kept and
//! applied when the pass returns. A group removed meanwhile is gone: what its pass returns is
//! dropped; a group declared again meanwhile waits for that pass to return before its own
//! first pass.
//!
//! Passes that start within [`SHARED_READINGS`] of each other share one [`Round`]: one
//! reading per host, and what each planned there (see [`crate::headroom`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use super::pass::{self, Failed, Passed, Work};
use super::runs::Ran;
use super::{backoff, windows, GroupState, Reconciler, OWN_EVENTS};
use crate::headroom::Round;
use crate::lease::Standing;
use crate::model::{GroupName, GroupSpec, Reason, Summary};

/// How long after the first of them passes that start share one reading of each host.
const SHARED_READINGS: Duration = Duration::from_secs(1);

/// A pass that returned: which declaration of its group it was of, what it worked on, its
/// outcome, when it started and ended, and how long after it was due it began.
pub(super) struct Returned {
    id: u64,
    work: Work,
    result: Result<Passed, Failed>,
    started: Instant,
    done: Instant,
    late: Duration,
}

/// A pass that returned, or an external program that ended: what [`Reconciler::ended`] gives
/// and [`Reconciler::finish`] takes in.
pub struct Ended(Inner);

enum Inner {
    Pass(Box<Returned>),
    Run(Ran),
}

impl Reconciler {
    /// When the next group is due, among those with no pass in flight, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.groups
            .values()
            .filter(|g| self.may_start(g))
            .map(|g| g.next)
            .min()
    }

    /// No pass of the group is in flight, of this declaration or of one before it.
    fn may_start(&self, g: &GroupState) -> bool {
        !self
            .flying
            .get(&g.spec.project)
            .is_some_and(|p| p.contains_key(&g.spec.name))
    }

    /// Starts the pass of every group due at `now` that has none in flight. It returns through
    /// [`Reconciler::ended`].
    pub fn start_due(&mut self, now: Instant) {
        let due: Vec<GroupName> = self
            .groups
            .values()
            .filter(|g| g.next <= now && self.may_start(g))
            .map(|g| g.spec.name.clone())
            .collect();
        for name in due {
            self.start(&name, now);
        }
    }

    fn start(&mut self, name: &GroupName, now: Instant) {
        let round = self.round(now);
        let Some(g) = self.groups.get_mut(name) else {
            return;
        };
        let Some(carried) = g.carried.take() else {
            return;
        };
        let project = g.spec.project.clone();
        let lease_read = self.lease_reads.entry(project.clone()).or_default().clone();
        g.meanwhile = Default::default();
        g.external = self.runs.for_pass(&g.spec, now);
        let mut work = Work {
            spec: g.spec.clone(),
            carried,
            external: g.external.clone(),
            last: g.last.clone(),
            seen: None,
            last_action: None,
            record: None,
        };
        self.flying
            .entry(project)
            .or_default()
            .insert(name.clone(), g.id);
        let (id, due) = (g.id, g.next);
        let (ctx, memory) = (self.ctx.clone(), self.memory.clone());
        let given = pass::Given {
            resync: self.resync,
            parallel: self.parallel,
            round,
            lease_read,
            keeps: self.history.keeps(),
        };
        self.passes.push(Box::pin(async move {
            let late = Instant::now().saturating_duration_since(due);
            let result = pass::reconcile(&ctx, memory.as_ref(), &mut work, now, &given).await;
            Returned {
                id,
                work,
                result,
                started: now,
                done: Instant::now(),
                late,
            }
        }));
    }

    /// The round of readings a pass starting at `now` joins: the one opened less than
    /// [`SHARED_READINGS`] ago, or a new one.
    fn round(&mut self, now: Instant) -> Arc<Round> {
        match &self.round {
            Some((opened, round)) if now.saturating_duration_since(*opened) < SHARED_READINGS => {
                round.clone()
            }
            _ => {
                let round = Arc::new(Round::new(self.reserve));
                self.round = Some((now, round.clone()));
                round
            }
        }
    }

    /// Whether passes are in flight.
    pub fn busy(&self) -> bool {
        !self.passes.is_empty()
    }

    /// The next pass that returns, or program that ends (never, while none is in flight).
    /// Cancel-safe; what it gives goes to [`Reconciler::finish`].
    pub async fn ended(&mut self) -> Ended {
        tokio::select! {
            Some(r) = self.passes.next(), if !self.passes.is_empty() => Ended(Inner::Pass(Box::new(r))),
            ran = self.runs.next() => Ended(Inner::Run(ran)),
        }
    }

    /// Saves the history of every group with no pass in flight (a shutdown) and waits until
    /// it is on disk, at most `within`.
    pub fn save_history(&mut self, now: Instant, within: Duration) {
        if !self.history.keeps() {
            return;
        }
        for g in self.groups.values() {
            if let Some(c) = &g.carried {
                self.history.save(g.spec.name.as_str(), &c.history, now);
            }
        }
        self.history.flush(within);
    }

    /// Hands what every group this daemon holds learned over for the next holder (a shutdown:
    /// the caller writes them before it gives its leases up).
    pub fn leave_all(&self, now: Instant) {
        for g in self.groups.values() {
            if let Some(c) = &g.carried {
                leave(&self.ctx.leases, &g.spec, &c.history, now);
            }
        }
    }

    /// Cancels the programs in flight and starts no other (a shutdown).
    pub fn stop_programs(&mut self) {
        self.runs.stop();
    }

    /// Takes in what ended at `now`: a pass's outcome (its group requeued, or backed off) or a
    /// program's value (its group woken when the value is not the one its last pass was
    /// given). True when a pass returned: the status changed.
    pub fn finish(&mut self, ended: Ended, now: Instant) -> bool {
        match ended.0 {
            Inner::Pass(r) => {
                self.returned(*r, now);
                true
            }
            Inner::Run(ran) => {
                self.value(ran, now);
                false
            }
        }
    }

    fn value(&mut self, ran: Ran, now: Instant) {
        let spec = self.groups.get(ran.group()).map(|g| &g.spec);
        let Some(((name, i), value)) = self.runs.ended(ran, spec) else {
            return;
        };
        let Some(g) = self.groups.get_mut(&name) else {
            return;
        };
        if g.external.get(i) == Some(&value) {
            return;
        }
        if g.busy() {
            g.meanwhile.value = true;
        } else if g.failures == 0 && g.next > now {
            tracing::debug!(group = %name, signal = i + 1,
                "external signal {} of {name} has a new reading: reconciling {name} now", i + 1);
            g.next = now;
        }
    }

    fn returned(&mut self, r: Returned, now: Instant) {
        let Returned {
            id,
            work,
            result,
            started,
            done,
            late,
        } = r;
        let (project, name) = (&work.spec.project, &work.spec.name);
        if let Some(p) = self.flying.get_mut(project) {
            p.remove(name);
            if p.is_empty() {
                self.flying.remove(project);
            }
        }
        self.ctx.telemetry.pass(
            name.as_str(),
            project,
            done.saturating_duration_since(started),
            late,
        );
        let removed = match &result {
            Ok((_, _, removed)) | Err((_, _, removed)) => removed,
        };
        let until = done + OWN_EVENTS;
        self.own.extend(
            removed
                .iter()
                .map(|instance| ((project.clone(), instance.clone()), until)),
        );
        let Some(g) = self.groups.get_mut(name).filter(|g| g.id == id) else {
            // Removed, or moved to another project, meanwhile: what the pass found goes too.
            return;
        };
        g.done = Some(done);
        if let Some((watched, strain)) = work.seen {
            g.watched = watched;
            g.strain = strain;
        }
        if work.last_action.is_some() {
            g.last_action = work.last_action;
        }
        let mut carried = work.carried;
        if work.spec.schedule != g.spec.schedule {
            carried.windows = windows(&g.spec);
        }
        if let Some(row) = &work.record {
            self.history.pass(name.as_str(), row, now);
            if self.history.due(name.as_str(), now) {
                self.history.save(name.as_str(), &carried.history, now);
            }
            self.history.advise(&g.spec, now);
            self.history.write_rows(now);
        }
        if now >= g.leave_next && leave(&self.ctx.leases, &g.spec, &carried.history, now) {
            g.leave_next = now + crate::lease::learned::EVERY;
        }
        g.carried = Some(carried);
        match result {
            Ok((summary, requeue_in, _)) => {
                g.failures = 0;
                g.unreachable = false;
                let regular = done.checked_add(self.interval).unwrap_or(done);
                let due = requeue_in.and_then(|r| started.checked_add(r));
                g.next = due.map_or(regular, |d| d.clamp(done, regular));
                g.last = Some(summary);
            }
            Err((e, summary, _)) => {
                let delay = backoff(g.failures);
                g.failures = g.failures.saturating_add(1);
                g.unreachable = e.is_transport();
                g.next = done + delay;
                tracing::warn!(group = %g.spec.name, error = %e, retry_in = %humantime::format_duration(delay),
                    "reconciling {} failed: {e}; retrying in {}", g.spec.name, humantime::format_duration(delay));
                self.ctx
                    .telemetry
                    .error(g.spec.name.as_str(), &g.spec.project);
                let mut s = summary.or_else(|| g.last.clone()).unwrap_or(Summary {
                    current: 0,
                    desired: 0,
                    unhealthy: 0,
                    warm: 0,
                    starting: 0,
                    not_ready: 0,
                    instances: Vec::new(),
                    failing: Vec::new(),
                    utilization: None,
                    signals: Vec::new(),
                    reason: Reason::NoMetrics,
                    error: None,
                    standby: None,
                    hold: None,
                });
                s.error = Some(e.to_string());
                g.last = Some(s);
            }
        }
        // What happened meanwhile, as it would have been taken in then.
        let meanwhile = std::mem::take(&mut g.meanwhile);
        if meanwhile.changed {
            g.next = now;
            g.failures = 0;
        }
        if meanwhile.back && g.unreachable {
            tracing::info!(group = %g.spec.name, "Incus is back: reconciling {} now", g.spec.name);
            g.unreachable = false;
            g.failures = 0;
            g.next = now;
        }
        if meanwhile.value && g.failures == 0 {
            g.next = g.next.min(now);
        }
        self.own.retain(|_, until| *until > now);
        for instance in meanwhile.events {
            let own = (g.spec.project.clone(), instance);
            if !self.own.contains_key(&own) && g.failures == 0 && g.next > now {
                tracing::debug!(group = %g.spec.name, instance = own.1,
                    "{} stopped or vanished: reconciling now", own.1);
                g.next = now;
            }
        }
    }
}

/// Hands what `spec`'s group learned (`history`, at `now`) over for the next holder, when
/// this daemon holds the group; `true` when it did.
fn leave(
    leases: &crate::lease::Leases,
    spec: &GroupSpec,
    history: &crate::decide::History,
    now: Instant,
) -> bool {
    let (project, group) = (spec.project.as_str(), spec.name.as_str());
    if !matches!(leases.standing(project, group), Standing::Held { .. }) {
        return false;
    }
    let wall = crate::history::unix_ms(std::time::SystemTime::now());
    if !leases
        .learned()
        .leave(project, group, leases.me(), wall, &history.save(now))
    {
        tracing::debug!(
            group,
            "what {group} learned is too large to leave for the next holder"
        );
    }
    true
}
