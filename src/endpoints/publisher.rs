//! The publisher: per group with an `endpoints` table, a task that runs the group's command
//! with the set on its standard input whenever the set to publish is not the one last
//! published successfully, and at start and after a reload even when it is.
//!
//! - The set comes from the passes: a pass of the daemon holding the group's lease hands what
//!   it observed ([`Publisher::observed`]); a pass that does not hold it
//!   ([`Publisher::standby`]) forgets what was published, so that a takeover publishes the set
//!   it finds. A standby never runs the command.
//! - A failed run (an exit status other than 0, a timeout) is retried after [`BACKOFF_BASE`],
//!   doubling up to [`BACKOFF_MAX`], with the set as it is then; it is logged once at warn
//!   (with its exit status and stderr), and once at info when a run succeeds again.
//! - A removal ([`Publisher::leave`]) takes its instance out of the set and publishes the set
//!   without it itself, waiting for the run in flight first, within
//!   [`EndpointsSpec::removal_wait`]; a failure puts the instance back.
//! - Runs of one group never overlap; the command itself is run by [`crate::external`] (its
//!   program checked again before each run, killed at `timeout`, nothing left behind).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{document, set, Endpoint, EndpointsStatus};
use crate::model::{DesiredState, EndpointsSpec, GroupSpec, Observation, Readiness};

/// The first wait before a failed run is retried.
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The longest wait between retries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// How long a daemon that starts (or takes a group over) waits, at most, for its running
/// instances to be checked (or their addresses read) before it publishes a first set: the
/// set it found, not an empty one because nothing was looked at yet.
pub const SETTLE: Duration = Duration::from_secs(10);

/// How a command is run: `(command, timeout, stdin)` → `Err(why)` unless it exited with 0.
pub type Runner = Arc<
    dyn Fn(Vec<String>, Duration, Vec<u8>) -> BoxFuture<'static, Result<(), String>> + Send + Sync,
>;

/// The runner of the daemon: [`crate::external::run_with_input`].
pub fn external_runner() -> Runner {
    Arc::new(|command, timeout, input| {
        Box::pin(async move {
            crate::external::run_with_input(&command, timeout, &input)
                .await
                .map_err(|e| e.to_string())
        })
    })
}

/// (project, group).
type Key = (String, String);

/// What the publisher knows of one group.
struct State {
    group: String,
    project: String,
    spec: EndpointsSpec,
    /// The set the last pass of the lease holder observed (leaving instances included);
    /// `None` until one did, and while this daemon stands by.
    observed: Option<Vec<Endpoint>>,
    /// Instances being removed: out of the set.
    leaving: BTreeSet<String>,
    /// The set the command last took; `None` before (at start, after a takeover).
    published: Option<Vec<Endpoint>>,
    /// Run even when the set is the published one (after a reload).
    forced: bool,
    /// Why the last run failed, until one succeeds.
    error: Option<String>,
    /// The next wait after a failure.
    backoff: Duration,
    /// No run before this (a failure's backoff).
    retry_at: Option<Instant>,
    /// A run is in flight.
    running: bool,
    /// When a pass first handed a set that was not settled yet (see [`SETTLE`]).
    unsettled_since: Option<Instant>,
}

impl State {
    fn new(spec: &GroupSpec, e: &EndpointsSpec) -> Self {
        Self {
            group: spec.name.to_string(),
            project: spec.project.clone(),
            spec: e.clone(),
            observed: None,
            leaving: BTreeSet::new(),
            published: None,
            forced: true,
            error: None,
            backoff: BACKOFF_BASE,
            retry_at: None,
            running: false,
            unsettled_since: None,
        }
    }

    /// The set to publish now: the observed one without the leaving instances.
    fn want(&self) -> Option<Vec<Endpoint>> {
        let observed = self.observed.as_ref()?;
        Some(
            observed
                .iter()
                .filter(|e| !self.leaving.contains(&e.instance))
                .cloned()
                .collect(),
        )
    }

    /// A run is due (backoff aside).
    fn due(&self) -> Option<Vec<Endpoint>> {
        let want = self.want()?;
        (self.forced || self.published.as_ref() != Some(&want)).then_some(want)
    }

    /// Records how a run of `want` ended.
    fn ended(&mut self, want: Vec<Endpoint>, result: Result<(), String>, now: Instant) {
        let g = self.group.clone();
        match result {
            Ok(()) => {
                if self.error.take().is_some() {
                    tracing::info!(group = %g, endpoints = want.len(),
                        "the endpoints command of {g} succeeded again: {} endpoint(s) published",
                        want.len());
                } else {
                    tracing::debug!(group = %g, endpoints = want.len(),
                        "published {} endpoint(s) of {g}", want.len());
                }
                self.published = Some(want);
                self.forced = false;
                self.backoff = BACKOFF_BASE;
                self.retry_at = None;
            }
            Err(why) => {
                let wait = self.backoff;
                if self.error.is_none() {
                    tracing::warn!(group = %g, error = %why,
                        "the endpoints command of {g} failed: {why}; retrying in {}s, then \
                         less often (up to every {}s)",
                        wait.as_secs(), BACKOFF_MAX.as_secs());
                }
                self.error = Some(why);
                self.retry_at = Some(now + wait);
                self.backoff = (wait * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// One group's state, its run lock and its task.
struct Entry {
    state: Arc<Mutex<State>>,
    run: Arc<tokio::sync::Mutex<()>>,
    wake: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The publisher of every group with an `endpoints` table (see the module's header).
pub struct Publisher {
    runner: Runner,
    groups: Mutex<HashMap<Key, Entry>>,
}

impl Default for Publisher {
    fn default() -> Self {
        Self::with_runner(external_runner())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key(spec: &GroupSpec) -> Key {
    (spec.project.clone(), spec.name.to_string())
}

/// Whether a removal found its instance in the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// It was not in the set (nor published): nothing to wait for.
    NotInSet,
    /// The set without it is published: wait `deregistration_delay` before it stops.
    Deregistered,
}

impl Publisher {
    /// A publisher that runs commands with `runner` (tests give another).
    pub fn with_runner(runner: Runner) -> Self {
        Self {
            runner,
            groups: Mutex::new(HashMap::new()),
        }
    }

    /// Follows the desired state (at start and after each reload): groups with an
    /// `endpoints` table get a task, removed ones lose theirs, and each publishes again at
    /// its next pass as the lease holder, even with the set unchanged. Needs a Tokio runtime.
    pub fn set_desired(&self, state: &DesiredState) {
        let mut groups = lock(&self.groups);
        groups.retain(|(project, group), _| {
            state
                .groups
                .values()
                .any(|g| &g.project == project && g.name.as_str() == group && g.endpoints.is_some())
        });
        for spec in state.groups.values() {
            let Some(e) = &spec.endpoints else {
                continue;
            };
            if let Some(entry) = groups.get(&key(spec)) {
                let mut st = lock(&entry.state);
                st.spec = e.clone();
                st.forced = true;
                st.backoff = BACKOFF_BASE;
                st.retry_at = None;
                drop(st);
                entry.wake.notify_one();
                continue;
            }
            let state = Arc::new(Mutex::new(State::new(spec, e)));
            let run = Arc::new(tokio::sync::Mutex::new(()));
            let wake = Arc::new(Notify::new());
            let task = tokio::spawn(publish(
                self.runner.clone(),
                state.clone(),
                run.clone(),
                wake.clone(),
            ));
            groups.insert(
                key(spec),
                Entry {
                    state,
                    run,
                    wake,
                    task,
                },
            );
        }
    }

    fn entry<T>(&self, spec: &GroupSpec, f: impl FnOnce(&Entry) -> T) -> Option<T> {
        lock(&self.groups).get(&key(spec)).map(f)
    }

    /// What a pass of the lease holder observed: the set to publish (leaving instances aside).
    /// The first set after a start or a takeover waits, up to [`SETTLE`], for every running
    /// instance to have been checked once (or its address read, without checks).
    pub fn observed(&self, spec: &GroupSpec, obs: &Observation) {
        let found = set(spec, &obs.instances, &BTreeSet::new());
        let unknown = obs.instances.iter().any(|i| {
            i.status.is_healthy()
                && !i.warm
                && match &i.readiness {
                    Readiness::Starting { why } => why.is_empty(),
                    Readiness::Unchecked => i.address.is_none(),
                    _ => false,
                }
        });
        self.entry(spec, |e| {
            let mut st = lock(&e.state);
            if st.observed.is_none() && unknown {
                let since = *st.unsettled_since.get_or_insert_with(Instant::now);
                if since.elapsed() < SETTLE {
                    return;
                }
            }
            st.unsettled_since = None;
            if st.observed.as_ref() != Some(&found) {
                st.observed = Some(found);
            }
            drop(st);
            e.wake.notify_one();
        });
    }

    /// A pass of a daemon that does not hold the group's lease: nothing is published, and
    /// what was is forgotten (a takeover publishes the set it finds).
    pub fn standby(&self, spec: &GroupSpec) {
        self.entry(spec, |e| {
            let mut st = lock(&e.state);
            st.observed = None;
            st.unsettled_since = None;
            st.published = None;
            st.error = None;
            st.retry_at = None;
            st.backoff = BACKOFF_BASE;
        });
    }

    /// The group's endpoints for `status`; `None` for a group without an `endpoints` table.
    pub fn status(&self, project: &str, group: &str) -> Option<EndpointsStatus> {
        let groups = lock(&self.groups);
        let st = lock(&groups.get(&(project.to_owned(), group.to_owned()))?.state);
        Some(EndpointsStatus {
            published: st.published.clone().unwrap_or_default(),
            pending: st.running || st.due().is_some(),
            error: st.error.clone(),
        })
    }

    /// A removal of `instance`: takes it out of the set and publishes the set without it,
    /// waiting for a run in flight first, within [`EndpointsSpec::removal_wait`].
    /// [`Left::NotInSet`] at once when it was neither in the set nor published. On an error
    /// (the run failed or did not end in time) it is back in the set, and the error says why.
    /// Call [`Publisher::done`] when the removal ends.
    pub async fn leave(&self, spec: &GroupSpec, instance: &str) -> Result<Left, String> {
        let Some((state, run)) = self.entry(spec, |e| (e.state.clone(), e.run.clone())) else {
            return Ok(Left::NotInSet);
        };
        let wait = {
            let mut st = lock(&state);
            if st.observed.is_none() {
                // Nothing published since this daemon started (or took the group over): the
                // balancer may still send it requests.
                return Err(
                    "the endpoints are not published yet since this daemon started \
                            or took the group over"
                        .to_owned(),
                );
            }
            let named = |set: Option<&Vec<Endpoint>>| {
                set.is_some_and(|s| s.iter().any(|e| e.instance == instance))
            };
            if !named(st.observed.as_ref()) && !named(st.published.as_ref()) {
                return Ok(Left::NotInSet);
            }
            st.leaving.insert(instance.to_owned());
            st.spec.removal_wait()
        };
        let runner = self.runner.clone();
        let published = tokio::time::timeout(wait, async {
            let _one = run.lock().await;
            let (want, command, timeout, input) = {
                let mut st = lock(&state);
                let Some(want) = st.want() else {
                    return Err("this daemon no longer holds the group's lease".to_owned());
                };
                if st.published.as_ref() == Some(&want) {
                    return Ok(());
                }
                st.running = true;
                let input = document(&st.group, &st.project, &want).into_bytes();
                (want, st.spec.command.clone(), st.spec.timeout, input)
            };
            let result = runner(command, timeout, input).await;
            let mut st = lock(&state);
            st.running = false;
            st.ended(want, result.clone(), Instant::now());
            result
        })
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the set without it was not published within {}",
                humantime::format_duration(wait)
            ))
        });
        match published {
            Ok(()) => Ok(Left::Deregistered),
            Err(why) => {
                lock(&state).leaving.remove(instance);
                self.entry(spec, |e| e.wake.notify_one());
                Err(why)
            }
        }
    }

    /// A removal of `instance` ended: `removed`, it is gone (out of the set until a pass
    /// says otherwise); else it is back in the set.
    pub fn done(&self, spec: &GroupSpec, instance: &str, removed: bool) {
        self.entry(spec, |e| {
            let mut st = lock(&e.state);
            st.leaving.remove(instance);
            if removed {
                if let Some(observed) = st.observed.as_mut() {
                    observed.retain(|x| x.instance != instance);
                }
            }
            drop(st);
            e.wake.notify_one();
        });
    }
}

/// A group's task: runs the command whenever [`State::due`] says, and no sooner than a
/// failure's backoff allows.
async fn publish(
    runner: Runner,
    state: Arc<Mutex<State>>,
    run: Arc<tokio::sync::Mutex<()>>,
    wake: Arc<Notify>,
) {
    loop {
        let retry_at = lock(&state).retry_at;
        match retry_at {
            Some(at) => {
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            None => wake.notified().await,
        }
        let _one = run.lock().await;
        let (want, command, timeout, input) = {
            let mut st = lock(&state);
            if st.retry_at.is_some_and(|at| at > Instant::now()) {
                continue;
            }
            let Some(want) = st.due() else {
                if st.error.take().is_some() {
                    tracing::info!(group = %st.group,
                        "the endpoints of {} are published as they are: no retry needed", st.group);
                }
                st.retry_at = None;
                st.backoff = BACKOFF_BASE;
                continue;
            };
            st.running = true;
            let input = document(&st.group, &st.project, &want).into_bytes();
            (want, st.spec.command.clone(), st.spec.timeout, input)
        };
        let result = runner(command, timeout, input).await;
        let mut st = lock(&state);
        st.running = false;
        st.ended(want, result, Instant::now());
    }
}

#[cfg(test)]
#[path = "publisher_tests.rs"]
mod tests;
