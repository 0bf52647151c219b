//! A lease as stored (`HOLDER until=UNIX_MS` in the store profile's config) and the pure rule
//! that says whether a daemon may take it now ([`claim`]). No IO, no clock: the wall time,
//! how long the stored value has been seen unchanged on the daemon's own clock, and whether
//! its holder is proven dead all come in as arguments.

use std::collections::BTreeMap;
use std::time::Duration;

/// The config key of a group's lease (in the project's lease store) is this prefix plus the
/// group's name.
pub const KEY_PREFIX: &str = "user.incus-hpa.lease.";

/// How long after its end a lease nobody renewed is removed (by any daemon writing leases in
/// the same project): the key of a group that is no longer declared anywhere goes away.
pub const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A stored lease: who holds it, until when (milliseconds since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub holder: String,
    pub until_ms: i64,
}

impl Record {
    /// Reads `HOLDER until=MS`; anything else is no lease.
    pub fn parse(value: &str) -> Option<Record> {
        let (holder, until) = value.trim().rsplit_once(" until=")?;
        Some(Record {
            holder: holder.to_owned(),
            until_ms: until.parse().ok()?,
        })
    }

    pub fn value(&self) -> String {
        format!("{} until={}", self.holder, self.until_ms)
    }
}

/// What [`claim`] says about one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Free, expired, ours, or its holder is proven dead: write this record.
    Take(Record),
    /// Another daemon holds it.
    Wait,
    /// Another daemon holds it until beyond `now + lease + drift`: a clock running ahead. It is
    /// trusted only until the value has stayed unchanged for `lease + drift` on our own clock.
    Skewed,
}

/// Whether `me` may take or renew the lease `stored` at `now_ms` (wall clock).
///
/// - No lease, our own, or one whose holder is proven dead (`dead`): taken.
/// - One whose end lies beyond `now + lease + drift`: its holder's clock runs ahead of ours
///   (or ran ahead before it died). A live holder rewrites it every third of a lease, so a
///   value seen unchanged (`unchanged_for`, on our own clock) for `lease + drift` belongs to a
///   holder that stopped renewing: taken then, never trusted longer.
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
        })
    };
    let Some(r) = stored else {
        return take();
    };
    if r.holder == me || dead(&r.holder) {
        return take();
    }
    if r.until_ms > now_ms.saturating_add(ms(lease + drift)) {
        return if unchanged_for >= lease + drift {
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

/// Removes the lease keys of `config` that ended more than [`STALE_AFTER`] before `now_ms`.
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

    fn held(by: &str, until_ms: i64) -> Record {
        Record {
            holder: by.into(),
            until_ms,
        }
    }

    #[test]
    fn leases_ended_a_day_ago_are_forgotten_and_nothing_else() {
        let day = ms(STALE_AFTER);
        let mut config: BTreeMap<String, String> = [
            ("user.incus-hpa.lease.old", held("h:1:a", 1_000).value()),
            (
                "user.incus-hpa.lease.recent",
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
                "user.other"
            ]
        );
    }

    #[test]
    fn records_read_back_what_they_write() {
        let r = held("web-1:42:ab12 boot=x pidns=1 start=2", 1_700_000_000_000);
        assert_eq!(Record::parse(&r.value()), Some(r));
        assert_eq!(Record::parse("garbage"), None);
        assert_eq!(Record::parse("h until=soon"), None);
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
}
