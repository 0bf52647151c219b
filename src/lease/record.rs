//! A lease as stored (`HOLDER lease=MS until=UNIX_MS` in the store profile's config), where it
//! is stored ([`key`]), and the pure rule that says whether a daemon may take it now
//! ([`claim`]). No IO, no clock: the wall time, how long the stored value has been seen
//! unchanged on the daemon's own clock, and whether its holder is proven dead all come in as
//! arguments.
//!
//! The format stays readable by older daemons, which split a value at its last ` until=` and
//! take the left part for the holder id: to them `HOLDER lease=MS` is the id of another daemon,
//! never their own, and its process is proven dead only when it is (the `lease=` word is one
//! they skip, see [`super::holder::parse`]). A value without `lease=` was written by an older
//! daemon: its length is not known, and the reader's own is assumed.

use std::collections::BTreeMap;
use std::time::Duration;

/// The config key of a group's lease (in the project's lease store) is this prefix plus the
/// group's name (see [`key`]).
pub const KEY_PREFIX: &str = "user.incus-hpa.lease.";

/// How long after its end a lease nobody renewed is removed (by any daemon writing leases in
/// the same project): the key of a group that is no longer declared anywhere goes away.
pub const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The longest lease a daemon may be given (`[daemon] lease`): a longer one read in a record
/// is taken as this long.
pub const LONGEST: Duration = Duration::from_secs(600);

/// The project whose profiles a project without profiles of its own uses.
pub const DEFAULT_PROJECT: &str = "default";

/// The key of the lease of `group` of `project` in a lease store that Incus says lives in
/// `home` (the profile's `project`; empty when not said).
///
/// In the project's own store it is `KEY_PREFIX` + `GROUP`. A project made with
/// `features.profiles=false` has no profiles of its own: Incus serves the default project's,
/// so one store holds the leases of several projects, and there it is `KEY_PREFIX` +
/// `PROJECT.GROUP`. A group's name has no `.` (lowercase letters, digits and `-`), so the part
/// after the key's last `.` is the group and the part before it the project: no two (project,
/// group) pairs share a key, whatever their names.
pub fn key(project: &str, group: &str, home: &str) -> String {
    if shares_store(project, home) {
        format!("{KEY_PREFIX}{project}.{group}")
    } else {
        format!("{KEY_PREFIX}{group}")
    }
}

/// True when the store of `project`, said to live in `home`, is another project's (see
/// [`key`]). Not said (`home` empty): taken as shared, unless `project` is the default one.
pub fn shares_store(project: &str, home: &str) -> bool {
    if home.is_empty() {
        project != DEFAULT_PROJECT
    } else {
        home != project
    }
}

/// A stored lease: who holds it, until when (milliseconds since the Unix epoch), and how long
/// its writer's leases last (`None` in a value written by an older daemon).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub holder: String,
    pub until_ms: i64,
    pub lease: Option<Duration>,
}

impl Record {
    /// Reads `HOLDER [lease=MS ]until=MS`; anything else is no lease.
    pub fn parse(value: &str) -> Option<Record> {
        let (left, until) = value.trim().rsplit_once(" until=")?;
        let until_ms = until.parse().ok()?;
        let length = left.rsplit_once(" lease=").and_then(|(holder, ms)| {
            let ms: u64 = ms.parse().ok()?;
            Some((holder, Duration::from_millis(ms)))
        });
        Some(match length {
            Some((holder, lease)) => Record {
                holder: holder.to_owned(),
                until_ms,
                lease: Some(lease),
            },
            None => Record {
                holder: left.to_owned(),
                until_ms,
                lease: None,
            },
        })
    }

    pub fn value(&self) -> String {
        match self.lease {
            Some(lease) => format!(
                "{} lease={} until={}",
                self.holder,
                ms(lease),
                self.until_ms
            ),
            None => format!("{} until={}", self.holder, self.until_ms),
        }
    }
}

/// What [`claim`] says about one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Free, expired, ours, or its holder is proven dead: write this record.
    Take(Record),
    /// Another daemon holds it.
    Wait,
    /// Another daemon holds it until beyond `now` plus its writer's lease and `drift`: a clock
    /// running ahead. It is trusted only until the value has stayed unchanged for that lease
    /// and `drift` on our own clock.
    Skewed,
}

/// Whether `me`, whose leases last `lease`, may take or renew the lease `stored` at `now_ms`
/// (wall clock). Its writer's lease is the one the record says (at most [`LONGEST`]), or
/// `lease` when it says none (an older daemon's).
///
/// - No lease, our own, or one whose holder is proven dead (`dead`): taken.
/// - One whose end lies beyond `now` plus its writer's lease and `drift`: its holder's clock
///   runs ahead of ours (or ran ahead before it died). A live holder rewrites it every third
///   of its lease, so a value seen unchanged (`unchanged_for`, on our own clock) for its
///   writer's lease and `drift` belongs to a holder that stopped renewing: taken then, never
///   trusted longer. A holder with a longer lease than ours is not taken for one whose clock
///   runs ahead, nor is its lease taken between two of its renewals.
/// - Otherwise taken once its end plus `drift` has passed.
pub fn claim(
    stored: Option<&Record>,
    me: &str,
    now_ms: i64,
    lease: Duration,
    drift: Duration,
    unchanged_for: Duration,
    dead: impl Fn(&str) -> bool,
) -> Claim {
    let take = || {
        Claim::Take(Record {
            holder: me.to_owned(),
            until_ms: now_ms.saturating_add(ms(lease)),
            lease: Some(lease),
        })
    };
    let Some(r) = stored else {
        return take();
    };
    if r.holder == me || dead(&r.holder) {
        return take();
    }
    let theirs = r.lease.map_or(lease, |l| l.min(LONGEST));
    if r.until_ms > now_ms.saturating_add(ms(theirs + drift)) {
        return if unchanged_for >= theirs + drift {
            take()
        } else {
            Claim::Skewed
        };
    }
    if r.until_ms.saturating_add(ms(drift)) <= now_ms {
        take()
    } else {
        Claim::Wait
    }
}

pub(super) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Removes the lease keys of `config` (of every project the store holds) that ended more than
/// [`STALE_AFTER`] before `now_ms`.
pub fn forget_stale(config: &mut BTreeMap<String, String>, now_ms: i64) {
    let limit = now_ms - ms(STALE_AFTER);
    config.retain(|k, v| {
        !k.starts_with(KEY_PREFIX) || Record::parse(v).is_none_or(|r| r.until_ms >= limit)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);
    const DRIFT: Duration = Duration::from_secs(3);

    /// A record of `by`'s, written by a daemon whose leases last [`LEASE`].
    fn held(by: &str, until_ms: i64) -> Record {
        Record {
            holder: by.into(),
            until_ms,
            lease: Some(LEASE),
        }
    }

    #[test]
    fn leases_ended_a_day_ago_are_forgotten_and_nothing_else() {
        let day = ms(STALE_AFTER);
        let old = Record {
            lease: None,
            ..held("h:3:c", 1_000)
        };
        let mut config: BTreeMap<String, String> = [
            ("user.incus-hpa.lease.old", held("h:1:a", 1_000).value()),
            (
                "user.incus-hpa.lease.staging.old",
                held("h:1:a", 999).value(),
            ),
            ("user.incus-hpa.lease.older", old.value()),
            (
                "user.incus-hpa.lease.recent",
                held("h:2:b", 2 * day).value(),
            ),
            (
                "user.incus-hpa.lease.staging.recent",
                held("h:2:b", 2 * day).value(),
            ),
            ("user.incus-hpa.lease.odd", "not a record".to_owned()),
            ("user.other", "1".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        forget_stale(&mut config, 1_000 + day + 1);
        let keys: Vec<&str> = config.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "user.incus-hpa.lease.odd",
                "user.incus-hpa.lease.recent",
                "user.incus-hpa.lease.staging.recent",
                "user.other"
            ]
        );
    }

    #[test]
    fn records_read_back_what_they_write() {
        let r = held("web-1:42:ab12 boot=x pidns=1 start=2", 1_700_000_000_000);
        assert_eq!(
            r.value(),
            "web-1:42:ab12 boot=x pidns=1 start=2 lease=15000 until=1700000000000"
        );
        assert_eq!(Record::parse(&r.value()), Some(r.clone()));
        // An older daemon's: no length.
        let old = Record { lease: None, ..r };
        assert_eq!(
            old.value(),
            "web-1:42:ab12 boot=x pidns=1 start=2 until=1700000000000"
        );
        assert_eq!(Record::parse(&old.value()), Some(old));
        assert_eq!(Record::parse("garbage"), None);
        assert_eq!(Record::parse("h until=soon"), None);
        assert_eq!(
            Record::parse("h lease=long until=5"),
            Some(Record {
                holder: "h lease=long".into(),
                until_ms: 5,
                lease: None
            })
        );
    }

    /// Today's record read as incus-hpa 0.4 reads it (`rsplit_once(" until=")`, the holder the
    /// left part), and judged by its rule: another daemon's live lease, never free, expired,
    /// its own or a dead holder's.
    #[test]
    fn an_older_daemon_reads_a_new_record_as_another_daemons_live_lease() {
        use super::super::holder;
        let id = holder::Identity {
            boot: "boot-a".into(),
            pidns: 7,
            pid: 42,
            start: 9,
        };
        let me = holder::with_identity("web-1:42:ab12", &id);
        let now = 100_000;
        let new = Record {
            holder: me.clone(),
            until_ms: now + 600_000,
            lease: Some(Duration::from_secs(600)),
        };
        let value = new.value();
        let (left, until) = value.trim().rsplit_once(" until=").unwrap();
        let until: i64 = until.parse().unwrap();
        assert_eq!(until, now + 600_000);
        // Not its own id, whatever the older daemon's is (the same process cannot be both).
        assert_ne!(left, me);
        // Its identity reads as the writer's: proven dead only if the writer is.
        assert_eq!(holder::parse(left), Some(id));
        assert_eq!(holder::short(left), "web-1:42:ab12");
        // The older rule on it, with its own lease the same (its only safe set-up): a lease
        // that runs, not free, expired nor skewed.
        let old_rule = Record {
            holder: left.to_owned(),
            until_ms: until,
            lease: None,
        };
        let older = |now_ms| {
            claim(
                Some(&old_rule),
                "host-b:2:bbbb",
                now_ms,
                Duration::from_secs(600),
                Duration::from_secs(120),
                Duration::ZERO,
                |_| false,
            )
        };
        assert_eq!(older(now), Claim::Wait);
        assert_eq!(older(now + 600_000 + 119_999), Claim::Wait);
    }

    #[test]
    fn a_lease_is_taken_when_free_expired_past_the_margin_or_ours() {
        let now = 100_000;
        let mine = Claim::Take(held("me", now + 15_000));
        let take = |stored: Option<Record>| {
            claim(
                stored.as_ref(),
                "me",
                now,
                LEASE,
                DRIFT,
                Duration::ZERO,
                |h| h == "dead",
            )
        };
        assert_eq!(take(None), mine);
        assert_eq!(take(Some(held("me", now + 1))), mine);
        // Another's, still running or within the drift margin after its end: not ours.
        assert_eq!(take(Some(held("b", now + 1))), Claim::Wait);
        assert_eq!(take(Some(held("b", now - 2_999))), Claim::Wait);
        // Past its end and the margin: ours.
        assert_eq!(take(Some(held("b", now - 3_000))), mine);
        // A holder proven dead: ours at once.
        assert_eq!(take(Some(held("dead", now + 9_000))), mine);
    }

    #[test]
    fn an_end_beyond_one_lease_is_trusted_for_one_lease_at_most() {
        let now = 100_000;
        let far = Some(held("ahead", now + 3_600_000));
        let after = |seen: Duration| claim(far.as_ref(), "me", now, LEASE, DRIFT, seen, |_| false);
        // Written by a clock an hour ahead: not trusted as an end, but not taken at once.
        assert_eq!(after(Duration::ZERO), Claim::Skewed);
        assert_eq!(
            after(LEASE + DRIFT - Duration::from_millis(1)),
            Claim::Skewed
        );
        // Unchanged for a lease and its margin: nobody renews it.
        assert_eq!(after(LEASE + DRIFT), Claim::Take(held("me", now + 15_000)));
        // Exactly one lease and its margin ahead is still an ordinary lease.
        let edge = Some(held("b", now + 18_000));
        assert_eq!(
            claim(edge.as_ref(), "me", now, LEASE, DRIFT, LEASE * 9, |_| false),
            Claim::Wait
        );
    }

    /// A daemon with the default 15 s reads the lease of a holder given 600 s: it runs for ten
    /// minutes, and the holder renews it every 200 s. It is judged by the holder's length.
    #[test]
    fn a_lease_is_judged_by_its_writers_length_not_the_readers() {
        let now = 100_000;
        let long = Duration::from_secs(600);
        let theirs = Record {
            holder: "long".into(),
            until_ms: now + 600_000,
            lease: Some(long),
        };
        let read = |stored: &Record, now_ms, seen| {
            claim(Some(stored), "me", now_ms, LEASE, DRIFT, seen, |_| false)
        };
        // Renewed just now, and unchanged for 199 s: its holder renews it in a second.
        assert_eq!(read(&theirs, now, Duration::ZERO), Claim::Wait);
        assert_eq!(read(&theirs, now, Duration::from_secs(199)), Claim::Wait);
        // Not renewed: taken at its end and our margin, not before.
        assert_eq!(
            read(&theirs, now + 602_999, Duration::from_secs(603)),
            Claim::Wait
        );
        assert!(matches!(
            read(&theirs, now + 603_000, Duration::from_secs(603)),
            Claim::Take(_)
        ));
        // Its clock runs ahead: trusted for its length and our margin, counted on our clock.
        let ahead = Record {
            until_ms: now + 3_600_000,
            ..theirs.clone()
        };
        assert_eq!(read(&ahead, now, Duration::from_secs(602)), Claim::Skewed);
        assert!(matches!(
            read(&ahead, now, Duration::from_secs(603)),
            Claim::Take(_)
        ));
        // A length past the longest a daemon may have counts as the longest.
        let absurd = Record {
            lease: Some(Duration::from_secs(86_400)),
            until_ms: now + 86_400_000,
            ..theirs.clone()
        };
        assert!(matches!(
            read(&absurd, now, Duration::from_secs(603)),
            Claim::Take(_)
        ));
        // An older daemon's record says no length: ours is assumed, as before.
        let old = Record {
            lease: None,
            ..theirs
        };
        assert_eq!(read(&old, now, Duration::ZERO), Claim::Skewed);
        assert!(matches!(read(&old, now, LEASE + DRIFT), Claim::Take(_)));
    }

    #[test]
    fn keys_carry_the_project_in_a_store_shared_by_projects() {
        // Its own store: the group's name alone, as every version wrote it.
        assert_eq!(key("default", "web", "default"), "user.incus-hpa.lease.web");
        assert_eq!(key("staging", "web", "staging"), "user.incus-hpa.lease.web");
        // The default project's store, used by a project without profiles of its own.
        assert_eq!(
            key("staging", "web", "default"),
            "user.incus-hpa.lease.staging.web"
        );
        // Not said: shared unless the project is the default one.
        assert_eq!(key("default", "web", ""), "user.incus-hpa.lease.web");
        assert_eq!(key("a.b", "c", ""), "user.incus-hpa.lease.a.b.c");
        // No two pairs of one store share a key: the group is after the last dot.
        let pairs = [
            ("default", "a-b"),
            ("a", "b"),
            ("a.b", "c"),
            ("a", "b-c"),
            ("a-b", "c"),
        ];
        let keys: std::collections::BTreeSet<String> =
            pairs.iter().map(|(p, g)| key(p, g, "default")).collect();
        assert_eq!(keys.len(), pairs.len(), "{keys:?}");
    }
}
