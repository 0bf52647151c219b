//! The tracker's states, fed checks at chosen times.

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::model::{Probe, Readiness, ReadySpec};

fn spec() -> ReadySpec {
    ReadySpec::with_probe(Probe::Tcp { port: 80 })
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn start(id: &str, at: Instant) -> Start {
    Start { id: id.into(), at }
}

fn ok(s: &str) -> Outcome {
    Ok(s.into())
}

fn err(s: &str) -> Outcome {
    Err(s.into())
}

#[test]
fn starting_until_the_first_pass() {
    let t0 = Instant::now();
    let s = start("a", t0);
    let mut t = Tracker::new(s.clone());
    assert_eq!(t.readiness(), &Readiness::Starting { why: String::new() });
    assert_eq!(
        t.feed(&s, &err("connection refused"), &spec(), t0 + secs(2)),
        None
    );
    assert_eq!(
        t.readiness(),
        &Readiness::Starting {
            why: "connection refused".into()
        }
    );
    let change = t.feed(&s, &ok("HTTP 200"), &spec(), t0 + secs(4));
    assert_eq!(
        change,
        Some(Change::Ready {
            detail: "HTTP 200".into(),
            after: secs(4),
            again: false
        })
    );
    assert_eq!(t.readiness(), &Readiness::Ready);
    // Passing again says nothing new.
    assert_eq!(t.feed(&s, &ok("HTTP 200"), &spec(), t0 + secs(6)), None);
}

#[test]
fn not_ready_after_failures_in_a_row_and_ready_again_on_a_pass() {
    let t0 = Instant::now();
    let s = start("a", t0);
    let mut t = Tracker::new(s.clone());
    let spec = spec(); // 3 failures
    t.feed(&s, &ok("HTTP 200"), &spec, t0 + secs(1));
    assert_eq!(t.feed(&s, &err("HTTP 503"), &spec, t0 + secs(3)), None);
    assert_eq!(t.feed(&s, &err("HTTP 503"), &spec, t0 + secs(5)), None);
    assert_eq!(t.readiness(), &Readiness::Ready, "two failures of three");
    // A pass in between starts the count again.
    t.feed(&s, &ok("HTTP 200"), &spec, t0 + secs(7));
    t.feed(&s, &err("HTTP 503"), &spec, t0 + secs(9));
    t.feed(&s, &err("HTTP 503"), &spec, t0 + secs(11));
    assert_eq!(t.readiness(), &Readiness::Ready);
    let change = t.feed(&s, &err("timed out after 1s"), &spec, t0 + secs(13));
    assert_eq!(
        change,
        Some(Change::NotReady {
            why: "timed out after 1s".into(),
            failed: 3
        })
    );
    assert_eq!(
        t.readiness(),
        &Readiness::NotReady {
            why: "timed out after 1s".into()
        }
    );
    // More failures keep it out, with the latest reason, and say nothing new.
    assert_eq!(t.feed(&s, &err("HTTP 500"), &spec, t0 + secs(15)), None);
    assert_eq!(t.readiness().why(), Some("HTTP 500"));
    // Ready and NotReady are past start_timeout's reach.
    let late = t0 + secs(600);
    let change = t.feed(&s, &ok("HTTP 200"), &spec, late);
    assert_eq!(
        change,
        Some(Change::Ready {
            detail: "HTTP 200".into(),
            after: secs(600),
            again: true
        })
    );
    assert_eq!(t.readiness(), &Readiness::Ready);
}

#[test]
fn one_failure_is_enough_when_failures_is_one() {
    let t0 = Instant::now();
    let s = start("a", t0);
    let mut t = Tracker::new(s.clone());
    let spec = ReadySpec {
        failures: 1,
        ..spec()
    };
    t.feed(&s, &ok("connected"), &spec, t0);
    assert!(matches!(
        t.feed(&s, &err("connection refused"), &spec, t0 + secs(2)),
        Some(Change::NotReady { failed: 1, .. })
    ));
}

#[test]
fn never_ready_once_start_timeout_passed_and_it_stays_so() {
    let t0 = Instant::now();
    let s = start("a", t0);
    let mut t = Tracker::new(s.clone());
    let spec = spec(); // 2 min
    assert_eq!(
        t.feed(&s, &err("connection refused"), &spec, t0 + secs(119)),
        None
    );
    let change = t.feed(&s, &err("connection refused"), &spec, t0 + secs(120));
    let why = "not ready within 2m of its start: connection refused".to_owned();
    assert_eq!(change, Some(Change::NeverReady { why: why.clone() }));
    assert_eq!(t.readiness(), &Readiness::NeverReady { why: why.clone() });
    // A pass that comes after does not undo a failed start.
    assert_eq!(t.feed(&s, &ok("HTTP 200"), &spec, t0 + secs(122)), None);
    assert_eq!(t.readiness(), &Readiness::NeverReady { why });
}

#[test]
fn a_pass_at_the_deadline_is_ready() {
    let t0 = Instant::now();
    let s = start("a", t0);
    let mut t = Tracker::new(s.clone());
    t.feed(&s, &ok("HTTP 204"), &spec(), t0 + secs(120));
    assert_eq!(t.readiness(), &Readiness::Ready);
}

#[test]
fn a_new_start_begins_afresh() {
    let t0 = Instant::now();
    let first = start("2026-12-03T10:00:00Z", t0);
    let mut t = Tracker::new(first.clone());
    t.feed(&first, &ok("HTTP 200"), &spec(), t0 + secs(1));
    assert!(!t.restart(&first));
    // Restarted 5 minutes later: starting, and its start_timeout counts from then.
    let second = start("2026-12-03T10:05:00Z", t0 + secs(300));
    assert_eq!(
        t.feed(&second, &err("connection refused"), &spec(), t0 + secs(302)),
        None
    );
    assert_eq!(
        t.readiness(),
        &Readiness::Starting {
            why: "connection refused".into()
        }
    );
    assert_eq!(t.start(), &second);
    // A NeverReady start is left behind by the next one too.
    t.feed(&second, &err("x"), &spec(), t0 + secs(500));
    assert!(matches!(t.readiness(), Readiness::NeverReady { .. }));
    let third = start("2026-12-03T10:10:00Z", t0 + secs(600));
    assert!(t.restart(&third));
    assert_eq!(t.readiness(), &Readiness::Starting { why: String::new() });
    let change = t.feed(&third, &ok("exit code 0"), &spec(), t0 + secs(603));
    assert_eq!(
        change,
        Some(Change::Ready {
            detail: "exit code 0".into(),
            after: secs(3),
            again: false
        })
    );
}
