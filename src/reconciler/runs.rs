//! The external signals' programs, run in the background: a pass never waits for one.
//!
//! A group's pass starts each of its programs that is due (it never ran, or its last run
//! started an interval ago or more), unless that signal's run is still in flight: at most one
//! run of each signal at a time. The pass takes the last value there is, while it is fresh: its
//! run started less than an interval plus the program's timeout ago (the run after it has had
//! its whole timeout to answer); none otherwise, as for a run that failed. A program that
//! hangs holds only its own signal unknown (which holds the count, never lowers it) until it
//! is killed at its timeout. A run that ends with another value than the one its group's last
//! pass was given wakes the group ([`super::Reconciler`]), so that the value is acted on at
//! once, not an interval later.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::{AbortHandle, Abortable, BoxFuture};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::time::Instant;

use crate::external::{Cache, ExternalError, Key, Said};
use crate::model::{ExternalSpec, GroupSpec};

/// A run that ended: which signal, which run of it, when it started, and what it gave.
pub(super) struct Ran {
    key: Key,
    id: u64,
    started: Instant,
    result: Result<f64, ExternalError>,
}

impl Ran {
    /// The group whose signal it is.
    pub(super) fn group(&self) -> &crate::model::GroupName {
        &self.key.0
    }
}

/// The programs in flight, and what the runs that ended gave.
#[derive(Default)]
pub(super) struct Runs {
    cache: Cache,
    said: Said,
    /// The runs in flight, each cancelled through its handle in `running`.
    tasks: FuturesUnordered<BoxFuture<'static, Option<Ran>>>,
    /// The run in flight of each signal: its number (a run that ends under another number was
    /// cancelled) and how to cancel it.
    running: HashMap<Key, (u64, AbortHandle)>,
    last_id: u64,
}

/// How long a value stands: an interval, and the timeout of the run after it.
fn freshness(spec: &GroupSpec, external: &ExternalSpec) -> Duration {
    spec.interval.saturating_add(external.timeout)
}

impl Runs {
    /// Starts the programs of `spec` that are due at `now`, and gives the value of each of its
    /// signals for a pass at `now` (`None`: unknown).
    pub(super) fn for_pass(&mut self, spec: &GroupSpec, now: Instant) -> Vec<Option<f64>> {
        for (i, external) in spec.external.iter().enumerate() {
            let key = (spec.name.clone(), i);
            let due = self.cache.fresh(&key, now, spec.interval).is_none();
            if due && !self.running.contains_key(&key) {
                self.start(key, external.clone(), now);
            }
        }
        spec.external
            .iter()
            .enumerate()
            .map(|(i, external)| {
                let key = (spec.name.clone(), i);
                self.cache
                    .fresh(&key, now, freshness(spec, external))
                    .flatten()
            })
            .collect()
    }

    fn start(&mut self, key: Key, external: ExternalSpec, now: Instant) {
        self.last_id += 1;
        let id = self.last_id;
        let (handle, registration) = AbortHandle::new_pair();
        let run_key = key.clone();
        let run = async move {
            let result = crate::external::read(&external).await;
            Ran {
                key: run_key,
                id,
                started: now,
                result,
            }
        };
        // Cancelled: the future (and with it the program and every process it started) is
        // dropped.
        self.tasks
            .push(Abortable::new(run, registration).map(Result::ok).boxed());
        self.running.insert(key, (id, handle));
    }

    /// How many programs are running.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.running.len()
    }

    /// The next run that ends (never, while none runs). Cancel-safe.
    pub(super) async fn next(&mut self) -> Ran {
        loop {
            match self.tasks.next().await {
                Some(Some(ran)) => return ran,
                // Cancelled.
                Some(None) => {}
                None => std::future::pending().await,
            }
        }
    }

    /// Records a run that ended (and says a failure once, until it changes or the program
    /// answers again); the signal and its value, unless the run was cancelled meanwhile.
    pub(super) fn ended(
        &mut self,
        ran: Ran,
        spec: Option<&GroupSpec>,
    ) -> Option<(Key, Option<f64>)> {
        match self.running.get(&ran.key) {
            Some((id, _)) if *id == ran.id => {}
            _ => return None,
        }
        self.running.remove(&ran.key);
        let (group, i) = &ran.key;
        let program = spec
            .and_then(|s| s.external.get(*i))
            .and_then(|e| e.command.first())
            .map_or("", String::as_str);
        match &ran.result {
            Ok(_) => {
                if self.said.succeeded(&ran.key) {
                    tracing::info!(%group, signal = i + 1,
                        "external signal {} of {group} ({program}) answers again", i + 1);
                }
            }
            Err(e) => {
                if self.said.failed(&ran.key, &e.to_string()) {
                    tracing::warn!(%group, signal = i + 1, error = %e,
                        "{}", crate::external::no_reading(group.as_str(), *i, program, e));
                }
            }
        }
        let value = ran.result.ok();
        self.cache.put(ran.key.clone(), ran.started, value);
        Some((ran.key, value))
    }

    /// Forgets the signals `keep` refuses (a group removed, or whose programs changed): their
    /// values, what was said of them, and their runs in flight, which are cancelled.
    pub(super) fn retain(&mut self, keep: impl Fn(&Key) -> bool) {
        self.cache.retain(&keep);
        self.said.retain(&keep);
        self.running.retain(|key, (_, handle)| {
            let kept = keep(key);
            if !kept {
                handle.abort();
            }
            kept
        });
    }

    /// Cancels every run in flight (a shutdown).
    pub(super) fn stop(&mut self) {
        self.retain(|_| false);
    }
}

#[cfg(test)]
#[path = "runs_tests.rs"]
mod tests;
