//! The readiness board: what the prober last found of each instance it checks, keyed by
//! (project, group, instance), read by `observe`. Cheap to read (a lock held for a copy).
//! A removal marks its instance as leaving before it drains and stops it: the prober checks
//! it no more (a server shutting down fails its checks, which would take it out of service
//! and say so in the log) and the board keeps what was found of it last.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Mutex;

use crate::model::Readiness;

/// What the board says of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The start it is about (Incus' `last_used_at` when it was checked): what is said of an
    /// earlier start does not hold for a later one.
    pub start: String,
    pub readiness: Readiness,
    /// Its address on the group's interface, once read.
    pub address: Option<IpAddr>,
}

/// (project, group, instance).
type Key = (String, String, String);

/// Shared between the prober, which writes it, and the passes, which read it.
#[derive(Debug, Default)]
pub struct Board {
    entries: Mutex<HashMap<Key, Seen>>,
    /// Instances being removed: not checked until the removal ends.
    leaving: Mutex<HashSet<Key>>,
}

fn key(project: &str, group: &str, instance: &str) -> Key {
    (project.to_owned(), group.to_owned(), instance.to_owned())
}

impl Board {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<Key, Seen>) -> T) -> T {
        f(&mut self.entries.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// What was last found of an instance, if it was checked.
    pub fn get(&self, project: &str, group: &str, instance: &str) -> Option<Seen> {
        self.with(|e| e.get(&key(project, group, instance)).cloned())
    }

    /// What was found of an instance just now.
    pub fn set(&self, project: &str, group: &str, instance: &str, seen: Seen) {
        self.with(|e| e.insert(key(project, group, instance), seen));
    }

    /// Forgets the group's instances but those `keep` says to keep.
    pub fn retain_instances(&self, project: &str, group: &str, keep: impl Fn(&str) -> bool) {
        self.with(|e| e.retain(|(p, g, i), _| p != project || g != group || keep(i)));
    }

    /// Forgets the group's leaving marks but those `keep` says to keep (the instances still
    /// running: a mark lasts as long as its removal, whether the instance was checked or not).
    pub fn retain_leaving(&self, project: &str, group: &str, keep: impl Fn(&str) -> bool) {
        self.leaving_set()
            .retain(|(p, g, i)| p != project || g != group || keep(i));
    }

    fn leaving_set(&self) -> std::sync::MutexGuard<'_, HashSet<Key>> {
        self.leaving.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks an instance as leaving (`true`: its removal is about to drain and stop it) or no
    /// longer (`false`: the removal ended, whatever its outcome).
    pub fn set_leaving(&self, project: &str, group: &str, instance: &str, leaving: bool) {
        let k = key(project, group, instance);
        if leaving {
            self.leaving_set().insert(k);
        } else {
            self.leaving_set().remove(&k);
        }
    }

    /// Whether a removal is taking the instance out of service.
    pub fn is_leaving(&self, project: &str, group: &str, instance: &str) -> bool {
        self.leaving_set().contains(&key(project, group, instance))
    }

    /// Forgets every instance of a group (no longer checked).
    pub fn forget_group(&self, project: &str, group: &str) {
        self.retain_instances(project, group, |_| false);
        self.retain_leaving(project, group, |_| false);
    }

    /// How many instances it holds.
    pub fn len(&self) -> usize {
        self.with(|e| e.len())
    }

    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(r: Readiness) -> Seen {
        Seen {
            start: "t1".into(),
            readiness: r,
            address: None,
        }
    }

    #[test]
    fn entries_by_project_group_and_instance() {
        let b = Board::default();
        b.set("default", "web", "web-a", seen(Readiness::Ready));
        b.set("default", "web", "web-b", seen(Readiness::Ready));
        b.set("default", "api", "api-a", seen(Readiness::Ready));
        b.set("other", "web", "web-a", seen(Readiness::Ready));
        assert_eq!(b.len(), 4);
        assert_eq!(
            b.get("default", "web", "web-a").map(|s| s.readiness),
            Some(Readiness::Ready)
        );
        assert_eq!(b.get("default", "api", "web-a"), None);
        b.retain_instances("default", "web", |i| i == "web-b");
        assert_eq!(b.get("default", "web", "web-a"), None);
        assert!(b.get("default", "web", "web-b").is_some());
        assert!(b.get("other", "web", "web-a").is_some(), "another project");
        b.forget_group("default", "api");
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn leaving_marks_last_until_the_removal_ends_or_the_instance_is_forgotten() {
        let b = Board::default();
        b.set_leaving("default", "web", "web-a", true);
        b.set_leaving("default", "web", "web-b", true);
        assert!(b.is_leaving("default", "web", "web-a"));
        assert!(!b.is_leaving("other", "web", "web-a"), "another project");
        b.set_leaving("default", "web", "web-a", false);
        assert!(!b.is_leaving("default", "web", "web-a"));
        b.forget_group("default", "web");
        assert!(!b.is_leaving("default", "web", "web-b"));
    }
}
