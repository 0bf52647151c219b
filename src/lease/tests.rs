//! What a daemon keeps of its leases: nothing of groups it no longer manages; how long a new
//! lease waits to be confirmed.

use std::sync::Arc;
use std::time::Duration;

use super::*;

fn leases() -> Leases {
    let clocks = Clocks {
        wall: Arc::new(|| 1_000_000),
        mono: Arc::new(|| Duration::from_secs(100)),
    };
    Leases::with("me".into(), None, Duration::from_secs(15), clocks)
}

#[test]
fn what_is_known_of_a_group_no_longer_managed_is_forgotten() {
    let l = leases();
    l.set_groups([("default", "web"), ("default", "db"), ("staging", "api")]);
    let now = Duration::from_secs(100);
    let far = Record {
        holder: "ahead:1:aaaa".into(),
        until_ms: 9_000_000,
        lease: Some(Duration::from_secs(15)),
    };
    for (p, g) in [("default", "web"), ("default", "db"), ("staging", "api")] {
        let at = (p.to_owned(), g.to_owned());
        lock(&l.standing).insert(at.clone(), Standing::Confirming);
        lock(&l.taken).insert(
            at,
            Take {
                read: now,
                wrote: now,
            },
        );
        l.unchanged_for(p, g, false, "x until=1", now);
        l.unchanged_for(p, g, true, "y until=1", now);
        l.say_skew(p, g, &far, 1_000_000);
    }
    l.say(
        "staging",
        Err(LeaseError::Store(StoreProblem::NotOurs {
            project: "staging".into(),
        })),
    );
    // `db` leaves the file, and so does the project `staging`.
    l.set_groups([("default", "web")]);
    let web = ("default".to_owned(), "web".to_owned());
    assert_eq!(
        lock(&l.standing).keys().collect::<Vec<_>>(),
        [&web],
        "standing"
    );
    assert_eq!(lock(&l.taken).keys().collect::<Vec<_>>(), [&web], "taken");
    assert_eq!(lock(&l.skew_said).keys().collect::<Vec<_>>(), [&web]);
    let mut seen: Vec<_> = lock(&l.seen).keys().cloned().collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("default".to_owned(), "web".to_owned(), false),
            ("default".to_owned(), "web".to_owned(), true)
        ]
    );
    assert!(lock(&l.refused).is_empty());
    assert_eq!(l.groups().keys().collect::<Vec<_>>(), ["default"]);
}

#[test]
fn a_new_lease_is_confirmed_a_renewal_later_and_never_more_than_five_seconds() {
    let with = |lease: u64| {
        let clocks = Clocks {
            wall: Arc::new(|| 1_000_000),
            mono: Arc::new(|| Duration::from_secs(100)),
        };
        Leases::with("me".into(), None, Duration::from_secs(lease), clocks).confirm_after()
    };
    assert_eq!(with(3), Duration::from_secs(1));
    assert_eq!(with(15), Duration::from_secs(5));
    // A lease of 600 s renews every 200 s; its new holder acts 5 s after taking it.
    assert_eq!(with(600), CONFIRM_MAX);
}
