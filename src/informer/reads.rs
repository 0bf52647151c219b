//! Reads of instances for their events: what an event says that needs no read is taken in at
//! once ([`Store::intake`]); the reads it asks for ([`Read`], made by [`Store::read_event`])
//! are coalesced per instance and made [`READS_AT_ONCE`](super::READS_AT_ONCE) at a time, and
//! none is made of an instance the daemon is acting on until it is done ([`Store::begin`],
//! [`Store::end`]). See the parent module's header.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

use super::{lock, Key, Lifecycle, Store, CREATED, STARTED};
use crate::incus::Incus;

/// How an instance is read for its events ([`Store::intake`]): by a read sent after `since`, a
/// stamp in the order of reads taken when the (last) event came. Nothing is read when
/// something newer than that was written about the instance by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// As soon as one of the [`READS_AT_ONCE`](super::READS_AT_ONCE) reads is free.
    Now { since: u64 },
    /// [`SETTLE`](super::SETTLE) after its (first) event.
    Settled { since: u64 },
}

impl Read {
    /// When the events it reads for came.
    pub fn since(self) -> u64 {
        match self {
            Read::Now { since } | Read::Settled { since } => since,
        }
    }
}

/// The reads of one instance for events, while one is queued or in flight.
#[derive(Debug)]
pub(super) struct Reading {
    /// Reads begun so far, the current one included.
    round: u64,
    /// When the current read was sent (a stamp in the order of reads, see [`Store::stamp`]):
    /// an event that came after it needs one more.
    sent: Option<u64>,
    /// One more read is due after the current one.
    again: bool,
    /// The last read done (for the events waiting on it).
    done: watch::Sender<u64>,
}

/// The reader of one instance: when it is dropped before it is done (cancelled), the instance
/// is no longer marked as being read, and whoever waits on it stops waiting.
struct Reader<'a> {
    reads: &'a Mutex<HashMap<Key, Reading>>,
    key: Option<Key>,
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            lock(self.reads).remove(&key);
        }
    }
}

impl Store {
    /// The daemon starts acting on `name`: events about it are not read until [`Store::end`].
    pub fn begin(&self, project: &str, name: &str) {
        lock(&self.busy).insert((project.to_owned(), name.to_owned()), 0);
    }

    /// The daemon is done with `name` (and has written what it found): an event about it that
    /// came after that read is read now.
    pub async fn end(&self, incus: &dyn Incus, project: &str, name: &str) {
        let skipped = lock(&self.busy)
            .remove(&(project.to_owned(), name.to_owned()))
            .unwrap_or(0);
        if skipped > 0 && !self.written_since(project, name, skipped) {
            self.read_coalesced(incus, project, name, None).await;
        }
    }

    /// Reads `name` for events that came by `since` (a stamp), unless the daemon is acting on
    /// it (then noted for [`Store::end`]).
    async fn read_for_event(&self, incus: &dyn Incus, project: &str, name: &str, since: u64) {
        let key = (project.to_owned(), name.to_owned());
        if let Some(skipped) = lock(&self.busy).get_mut(&key) {
            *skipped = (*skipped).max(since);
            return;
        }
        self.read_coalesced(incus, project, name, Some(since)).await;
    }

    /// Reads `name` for events that came by `since` (a stamp; `None`: now), coalesced with the
    /// other reads of it, at most [`READS_AT_ONCE`](super::READS_AT_ONCE) instances at a time (see the module's
    /// header); returns once a read sent after them is done.
    async fn read_coalesced(
        &self,
        incus: &dyn Incus,
        project: &str,
        name: &str,
        since: Option<u64>,
    ) {
        let key = (project.to_owned(), name.to_owned());
        let waiting = {
            let mut reads = lock(&self.reads);
            match reads.get_mut(&key) {
                Some(r) => {
                    // A read not sent yet, or sent after the events, covers them.
                    let covered = match (r.sent, since) {
                        (None, _) => true,
                        (Some(sent), Some(since)) => sent > since,
                        (Some(_), None) => false,
                    };
                    r.again |= !covered;
                    let covering = r.round + u64::from(!covered);
                    Some((r.done.subscribe(), covering))
                }
                None => {
                    let r = Reading {
                        round: 1,
                        sent: None,
                        again: false,
                        done: watch::Sender::new(0),
                    };
                    reads.insert(key.clone(), r);
                    None
                }
            }
        };
        if let Some((mut done, covering)) = waiting {
            // Its reader reads it for this event too (an error: the reader is gone).
            let _ = done.wait_for(|&d| d >= covering).await;
            return;
        }
        let mut reader = Reader {
            reads: &self.reads,
            key: Some(key.clone()),
        };
        loop {
            // Never closed, so never an error.
            let permit = self.gate.acquire().await;
            if let Some(r) = lock(&self.reads).get_mut(&key) {
                r.sent = Some(self.stamp());
            }
            self.refresh(incus, project, name).await;
            drop(permit);
            let mut reads = lock(&self.reads);
            let Some(r) = reads.get_mut(&key) else {
                break;
            };
            r.done.send_replace(r.round);
            if !std::mem::take(&mut r.again) {
                reads.remove(&key);
                break;
            }
            r.round += 1;
            r.sent = None;
        }
        reader.key = None;
    }

    /// True when something about `name` was written with a ticket newer than `ticket`.
    fn written_since(&self, project: &str, name: &str, ticket: u64) -> bool {
        self.with(|p| {
            p.get(project)
                .and_then(|p| p.entries.get(name))
                .is_some_and(|e| e.ticket > ticket)
        })
    }

    /// True when the cache already holds `name` as the event says it is now: created (any
    /// status), or started (running).
    fn already_known(&self, project: &str, ev: &Lifecycle) -> bool {
        self.with(|p| {
            let Some(i) = p
                .get(project)
                .and_then(|p| p.entries.get(&ev.name))
                .and_then(|e| e.instance.as_ref())
            else {
                return false;
            };
            ev.action == CREATED || i.status().is_healthy()
        })
    }

    /// Takes in what one lifecycle event says without reading anything (a deletion, the old
    /// name of a rename), and says how the instance is to be read for it, if at all (see the
    /// module's header for instances coming up): [`Store::read_event`] reads it.
    pub fn intake(&self, ev: &Lifecycle) -> Option<Read> {
        if !self.follows(&ev.project) {
            return None;
        }
        if ev.action == CREATED || ev.action == STARTED {
            return (!self.already_known(&ev.project, ev)).then(|| Read::Settled {
                since: self.stamp(),
            });
        }
        let since = self.stamp();
        if let Some(old) = &ev.old_name {
            self.put(&ev.project, old, self.ticket(), None);
        }
        if ev.action == "instance-deleted" {
            self.put(&ev.project, &ev.name, self.ticket(), None);
            None
        } else {
            Some(Read::Now { since })
        }
    }

    /// Reads `name` for its events as [`Store::intake`] said: now, or (once settled) unless
    /// something newer than its events was written about it meanwhile. Returns once a read
    /// sent after those events is done (see the module's header).
    pub async fn read_event(&self, incus: &dyn Incus, project: &str, name: &str, read: Read) {
        let since = read.since();
        // Written by a read sent after the events (or by the daemon's own action): covered.
        if self.written_since(project, name, since) {
            return;
        }
        self.read_for_event(incus, project, name, since).await;
    }
}
