//! The events waiting to be read: one entry per instance, however many events came about it,
//! so that a storm of events costs memory in proportion to the instances it is about, never to
//! the events, and no task of its own (the follower reads the queue [`READS_AT_ONCE`] entries
//! at a time, see [`super::follow`]).
//!
//! An entry is read now ([`Read::Now`]) or once it settled ([`Read::Settled`], [`SETTLE`] after
//! its first event): entries to read now go first, in the order of their first event, then
//! the settled ones as they come due. Events about an instance already queued join its entry,
//! which then reads for the newest of them: a read now covers a settled one, and a settled
//! one keeps its time. Each entry carries the groups to wake once it is read. At most
//! [`PENDING_MAX`] instances wait: past that, the queue gives everything up (the cache is
//! listed again instead, and every group it would have woken is woken at once).
//!
//! [`READS_AT_ONCE`]: crate::informer::READS_AT_ONCE

use std::collections::{BTreeSet, HashMap, VecDeque};

use tokio::time::Instant;

pub use crate::informer::Read;
use crate::informer::SETTLE;

/// (project, instance).
pub type Key = (String, String);

/// The most instances whose events wait to be read.
pub const PENDING_MAX: usize = 1024;

/// One instance to read, and the groups to wake once it is read: (project, instance) of the
/// events it covers that can leave a group short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    pub key: Key,
    pub read: Read,
    pub wakes: BTreeSet<Key>,
}

#[derive(Debug)]
struct Pending {
    read: Read,
    wakes: BTreeSet<Key>,
}

/// The queue; see the module's header.
#[derive(Debug, Default)]
pub struct Queue {
    pending: HashMap<Key, Pending>,
    /// The instances to read now, in the order of their first event.
    now: VecDeque<Key>,
    /// The instances to read once settled, with when: in that order (`SETTLE` after each).
    settling: VecDeque<(Instant, Key)>,
}

/// The queue was full: everything in it was given up. The cache is to be listed again, and
/// these groups woken at once.
#[derive(Debug, PartialEq, Eq)]
pub struct Overflow {
    pub wakes: BTreeSet<Key>,
}

impl Queue {
    /// Queues a read of `key` for an event taken in at `now` that asks for `read`, waking the
    /// groups of `wake` once it is done.
    pub fn push(
        &mut self,
        key: Key,
        read: Read,
        wake: Option<Key>,
        now: Instant,
    ) -> Result<(), Overflow> {
        if let Some(p) = self.pending.get_mut(&key) {
            p.wakes.extend(wake);
            let since = p.read.since().max(read.since());
            match (p.read, read) {
                (Read::Now { .. }, _) => p.read = Read::Now { since },
                (Read::Settled { .. }, Read::Now { .. }) => {
                    p.read = Read::Now { since };
                    self.settling.retain(|(_, k)| k != &key);
                    self.now.push_back(key);
                }
                (Read::Settled { .. }, Read::Settled { .. }) => p.read = Read::Settled { since },
            }
            return Ok(());
        }
        if self.pending.len() >= PENDING_MAX {
            let mut wakes: BTreeSet<Key> = self.drain().into_iter().collect();
            wakes.extend(wake);
            return Err(Overflow { wakes });
        }
        match read {
            Read::Now { .. } => self.now.push_back(key.clone()),
            Read::Settled { .. } => self.settling.push_back((now + SETTLE, key.clone())),
        }
        let wakes = wake.into_iter().collect();
        self.pending.insert(key, Pending { read, wakes });
        Ok(())
    }

    /// The next instance to read at `now`, if one is ready.
    pub fn take(&mut self, now: Instant) -> Option<Work> {
        let key = match self.now.pop_front() {
            Some(key) => key,
            None if self.settling.front().is_some_and(|(due, _)| *due <= now) => {
                self.settling.pop_front()?.1
            }
            None => return None,
        };
        let p = self.pending.remove(&key)?;
        Some(Work {
            key,
            read: p.read,
            wakes: p.wakes,
        })
    }

    /// When the next settled read is due, if none is ready before it.
    pub fn next_due(&self) -> Option<Instant> {
        if self.now.is_empty() {
            self.settling.front().map(|(due, _)| *due)
        } else {
            None
        }
    }

    /// Gives up everything queued: the groups its entries would have woken.
    pub fn drain(&mut self) -> Vec<Key> {
        self.now.clear();
        self.settling.clear();
        self.pending.drain().flat_map(|(_, p)| p.wakes).collect()
    }

    /// How many instances wait.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// True when no instance waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        ("default".to_owned(), name.to_owned())
    }

    fn now(since: u64) -> Read {
        Read::Now { since }
    }

    #[test]
    fn events_about_one_instance_make_one_entry_with_every_group_to_wake() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        for _ in 0..1000 {
            q.push(key("web-a"), now(1), Some(key("web-a")), t0)
                .unwrap();
        }
        // A rename to web-a: the old name's groups are woken too.
        q.push(key("web-a"), now(3), Some(key("old")), t0).unwrap();
        q.push(key("web-a"), now(2), None, t0).unwrap();
        q.push(key("web-b"), now(4), None, t0).unwrap();
        assert_eq!(q.len(), 2);
        let first = q.take(t0).unwrap();
        assert_eq!(
            (first.key, first.read),
            (key("web-a"), now(3)),
            "the newest"
        );
        assert_eq!(first.wakes, BTreeSet::from([key("old"), key("web-a")]));
        assert_eq!(q.take(t0).unwrap().key, key("web-b"));
        assert_eq!(q.take(t0), None);
        assert!(q.is_empty());
    }

    #[test]
    fn a_settled_read_waits_its_time_and_a_read_now_goes_first() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        let settled = |since| Read::Settled { since };
        q.push(key("up"), settled(1), None, t0).unwrap();
        q.push(key("up"), settled(5), None, t0 + SETTLE / 2)
            .unwrap();
        q.push(key("stopped"), now(6), None, t0).unwrap();
        assert_eq!(q.next_due(), None, "something is ready now");
        assert_eq!(q.take(t0).unwrap().key, key("stopped"));
        assert_eq!(q.take(t0), None);
        // Due SETTLE after its first event, compared with its newest.
        assert_eq!(q.next_due(), Some(t0 + SETTLE));
        let up = q.take(t0 + SETTLE).unwrap();
        assert_eq!((up.key, up.read), (key("up"), settled(5)));
        // A read now covers a settled one, and goes at once.
        q.push(key("b"), settled(8), None, t0).unwrap();
        q.push(key("b"), now(7), Some(key("b")), t0).unwrap();
        assert_eq!(q.next_due(), None);
        assert_eq!(q.take(t0).unwrap().read, now(8));
        assert_eq!(q.next_due(), None, "nothing left settling");
    }

    #[test]
    fn past_pending_max_instances_everything_is_given_up_with_the_groups_to_wake() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        let mut woken = BTreeSet::new();
        for i in 0..3 * PENDING_MAX {
            let k = key(&format!("web-{i}"));
            if let Err(overflow) = q.push(k.clone(), now(1), Some(k), t0) {
                woken.extend(overflow.wakes);
            }
            assert!(q.len() <= PENDING_MAX);
        }
        // Two overflows: the first 2 × PENDING_MAX + 2 instances woken, the rest queued.
        assert_eq!(woken.len(), 2 * PENDING_MAX + 2);
        assert_eq!(q.len(), PENDING_MAX - 2);
        assert_eq!(
            q.take(t0).unwrap().key,
            key(&format!("web-{}", 2 * PENDING_MAX + 2))
        );
    }
}
