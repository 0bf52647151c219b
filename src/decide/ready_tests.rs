//! Readiness in the decision: starting instances count and are not measured, instances not
//! ready are unhealthy, instances never ready are removed and replaced at once.

use std::time::Duration;

use super::tests::{at, removed, settled, spec};
use super::*;
use crate::model::{Note, ObservedInstance, Readiness};

fn creates(p: &Plan) -> Vec<Cause> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::Create { cause, .. } => Some(*cause),
            _ => None,
        })
        .collect()
}

fn group(instances: Vec<ObservedInstance>) -> Observation {
    Observation {
        instances,
        ..Default::default()
    }
}

/// A running instance at `percent` of its limit, with `readiness`.
fn with(readiness: Readiness, percent: f64, created: i64) -> ObservedInstance {
    ObservedInstance {
        readiness,
        ..at(percent, created)
    }
}

fn starting(percent: f64, created: i64) -> ObservedInstance {
    with(
        Readiness::Starting {
            why: "connection refused".into(),
        },
        percent,
        created,
    )
}

fn not_ready(created: i64) -> ObservedInstance {
    with(
        Readiness::NotReady {
            why: "HTTP 503".into(),
        },
        40.0,
        created,
    )
}

fn never_ready(created: i64) -> ObservedInstance {
    with(
        Readiness::NeverReady {
            why: "connection refused".into(),
        },
        40.0,
        created,
    )
}

#[test]
fn starting_instances_count_and_hold_a_scale_down() {
    let s = spec(1, 10, 50.0);
    // Two ready at 10 % would go down to 1; the starting one is a missing reading.
    let (mut h, now) = settled(3);
    let o = group(vec![at(10.0, 1), at(10.0, 2), starting(10.0, 3)]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!((p.current, p.healthy, p.starting), (3, 2, 1));
    assert_eq!((p.desired, p.reason), (3, Reason::MetricsMissing));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p.notes.is_empty());

    // Once ready, the same readings scale down.
    let (mut h, now) = settled(3);
    let o = group(vec![
        at(10.0, 1),
        at(10.0, 2),
        with(Readiness::Ready, 10.0, 3),
    ]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!(p.starting, 0);
    assert!(p.desired < 3, "{p:?}");
}

#[test]
fn starting_instances_count_as_zero_on_the_way_up() {
    let s = spec(1, 10, 50.0);
    // 2 at 80 % and 2 starting (their own readings, at 100 %, are not taken): 160 % over 4
    // is 40 %, below the target: kept.
    let (mut h, now) = settled(4);
    let o = group(vec![
        at(80.0, 1),
        at(80.0, 2),
        starting(100.0, 3),
        starting(100.0, 4),
    ]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!((p.current, p.starting), (4, 2));
    assert_eq!(p.utilization, Some(80.0));
    assert_eq!((p.desired, p.reason), (4, Reason::MetricsMissing));
    assert!(p.actions.is_empty(), "{:?}", p.actions);

    // 2 at 100 % and 1 starting: 200 % over 3 is still above: ceil(200 / 50) = 4, and the
    // starting one is not replaced (1 creation, not 2).
    let (mut h, now) = settled(3);
    let o = group(vec![at(100.0, 1), at(100.0, 2), starting(0.0, 3)]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!((p.desired, p.reason), (4, Reason::AboveThreshold));
    assert_eq!(creates(&p), vec![Cause::ScaleUp]);
}

#[test]
fn a_not_ready_instance_is_replaced_and_removed_after_the_grace_period() {
    let s = spec(1, 1, 50.0);
    let (mut h, t0) = settled(1);
    let o = group(vec![not_ready(1)]);
    let p = decide(&s, &o, &mut h, t0);
    assert_eq!((p.current, p.not_ready, p.unhealthy), (0, 1, 0));
    assert_eq!(creates(&p), vec![Cause::Replace]);
    assert!(
        matches!(&p.notes[..], [Note::NotReady { instance, why, grace }]
            if instance == "web-1" && why == "HTTP 503" && *grace == s.unhealthy_grace),
        "{:?}",
        p.notes
    );
    assert_eq!(p.requeue_in, Some(s.unhealthy_grace));

    // Its replacement starts; the one not ready is kept for the grace period, said once.
    let o = group(vec![not_ready(1), starting(0.0, 2)]);
    let p = decide(&s, &o, &mut h, t0 + Duration::from_secs(60));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p.notes.is_empty(), "{:?}", p.notes);
    assert_eq!((p.current, p.starting, p.not_ready), (1, 1, 1));
    assert_eq!(
        p.requeue_in,
        Some(s.unhealthy_grace - Duration::from_secs(60))
    );

    let p = decide(&s, &o, &mut h, t0 + s.unhealthy_grace);
    assert_eq!(
        p.actions,
        vec![Action::Remove {
            name: "web-1".into(),
            cause: Cause::Unhealthy
        }]
    );
}

#[test]
fn a_not_ready_instance_that_recovers_starts_its_grace_again() {
    let s = spec(1, 2, 50.0);
    let (mut h, t0) = settled(2);
    let p = decide(&s, &group(vec![at(40.0, 1), not_ready(2)]), &mut h, t0);
    assert_eq!(p.notes.len(), 1);
    // Ready again: serves, and what was remembered is forgotten.
    let t1 = t0 + Duration::from_secs(200);
    let back = with(Readiness::Ready, 40.0, 2);
    let p = decide(&s, &group(vec![at(40.0, 1), back]), &mut h, t1);
    assert_eq!((p.current, p.not_ready), (2, 0));
    // Not ready again: a new grace period from now, said again.
    let t2 = t1 + Duration::from_secs(200);
    let p = decide(&s, &group(vec![at(40.0, 1), not_ready(2)]), &mut h, t2);
    assert!(matches!(&p.notes[..], [Note::NotReady { grace, .. }] if *grace == s.unhealthy_grace));
    assert!(removed(&p).is_empty(), "{:?}", p.actions);
}

#[test]
fn a_never_ready_instance_is_removed_and_replaced_in_one_pass() {
    let s = spec(2, 5, 50.0);
    let (mut h, now) = settled(2);
    let o = group(vec![at(40.0, 1), never_ready(2)]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!((p.current, p.not_ready, p.unhealthy), (1, 1, 0));
    assert_eq!(creates(&p), vec![Cause::Replace]);
    assert_eq!(
        p.actions.last(),
        Some(&Action::Remove {
            name: "web-2".into(),
            cause: Cause::NeverReady
        })
    );
    assert!(
        matches!(&p.notes[..], [Note::NeverReady { instance, why }]
            if instance == "web-2" && why == "connection refused"),
        "{:?}",
        p.notes
    );
    assert_eq!(Cause::NeverReady.as_str(), "never-ready");
}

#[test]
fn a_protected_never_ready_instance_is_replaced_and_not_removed() {
    let s = spec(2, 5, 50.0);
    let (mut h, now) = settled(2);
    let kept = ObservedInstance {
        protected: true,
        ..never_ready(2)
    };
    let p = decide(&s, &group(vec![at(40.0, 1), kept.clone()]), &mut h, now);
    assert_eq!(creates(&p), vec![Cause::Replace]);
    assert!(removed(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(p.notes.len(), 1);
    // Its replacement runs: nothing more to do, nothing said again.
    let o = group(vec![at(40.0, 1), kept, at(40.0, 3)]);
    let p = decide(&s, &o, &mut h, now + Duration::from_secs(15));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p.notes.is_empty(), "{:?}", p.notes);
    assert_eq!((p.current, p.not_ready), (2, 1));
}

#[test]
fn a_scale_down_removes_starting_instances_first() {
    // Above max 2: the two that go are the starting one (the oldest, which the default
    // newest-first order would keep), then the newest ready one.
    let s = spec(1, 2, 50.0);
    let (mut h, now) = settled(4);
    let o = group(vec![
        starting(40.0, 0),
        at(40.0, 1),
        at(40.0, 2),
        at(40.0, 3),
    ]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!(p.desired, 2);
    assert_eq!(removed(&p), vec!["web-0", "web-3"]);
}

#[test]
fn a_scale_down_leaves_not_ready_instances_to_their_grace_period() {
    // Not ready: not capacity, so removing it would not lower the count; 3 ready above max 2
    // lose one of them, and the one not ready goes when its grace period ends.
    let s = spec(1, 2, 50.0);
    let (mut h, now) = settled(3);
    let o = group(vec![not_ready(0), at(40.0, 1), at(40.0, 2), at(40.0, 3)]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!((p.current, p.not_ready), (3, 1));
    assert_eq!(removed(&p), vec!["web-3"]);
}

#[test]
fn unchecked_and_ready_instances_are_decided_as_before() {
    let s = spec(1, 10, 50.0);
    for readiness in [Readiness::Unchecked, Readiness::Ready] {
        let (mut h, now) = settled(2);
        let o = group(vec![
            with(readiness.clone(), 80.0, 1),
            with(readiness.clone(), 80.0, 2),
        ]);
        let p = decide(&s, &o, &mut h, now);
        assert_eq!(
            (p.current, p.healthy, p.starting, p.not_ready),
            (2, 2, 0, 0)
        );
        assert_eq!(
            (p.desired, p.reason),
            (4, Reason::AboveThreshold),
            "{readiness}"
        );
    }
}
