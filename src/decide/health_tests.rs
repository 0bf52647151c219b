//! Table and sequence tests for health: unhealthy instances, crash loops, failed starts, surplus.

use std::time::Duration;

use super::tests::{at, obs, removed, settled, spec, unmeasured};
use super::*;
use crate::model::{GroupSpec, InstanceStatus, Note, ObservedInstance};

const SEC: Duration = Duration::from_secs(1);

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
        foreign: vec![],
        ..Default::default()
    }
}

#[test]
fn an_unhealthy_instance_is_replaced_and_removed_after_the_grace_period() {
    for status in [
        InstanceStatus::Error,
        InstanceStatus::Frozen,
        InstanceStatus::Transition,
    ] {
        let s = spec(1, 1, 50.0);
        let (mut h, t0) = settled(1);
        let o = group(vec![unmeasured(status, 1)]);
        // In error: at once. Frozen or in a transition: once it has stayed so for a moment
        // (an `incus copy` freezes its source briefly); meanwhile it counts, unmeasured.
        let confirmed = if status == InstanceStatus::Error {
            t0
        } else {
            let p = decide(&s, &o, &mut h, t0);
            assert_eq!((p.current, p.unhealthy), (1, 0), "{status}");
            assert!(p.actions.is_empty() && p.notes.is_empty(), "{status}");
            assert_eq!(p.requeue_in, Some(UNHEALTHY_CONFIRM));
            t0 + UNHEALTHY_CONFIRM
        };
        let p = decide(&s, &o, &mut h, confirmed);
        assert_eq!((p.current, p.unhealthy, p.desired), (0, 1, 1), "{status}");
        assert_eq!(creates(&p), vec![Cause::Replace], "{status}: replaced");
        assert!(
            matches!(&p.notes[..], [Note::Unhealthy { instance, .. }] if instance == "web-1"),
            "{:?}",
            p.notes
        );
        assert_eq!(
            p.requeue_in,
            Some(s.unhealthy_grace - (confirmed - t0)),
            "{status}"
        );

        // Its replacement runs; the unhealthy one is kept during the grace period (the group
        // surges above max by its unhealthy instances only), then removed.
        let o = group(vec![unmeasured(status, 1), at(40.0, 2)]);
        let p = decide(&s, &o, &mut h, t0 + 60 * SEC);
        assert!(p.actions.is_empty(), "{status}: {:?}", p.actions);
        assert!(p.notes.is_empty(), "reported once");
        let p = decide(&s, &o, &mut h, t0 + s.unhealthy_grace);
        assert_eq!(
            p.actions,
            vec![Action::Remove {
                name: "web-1".into(),
                cause: Cause::Unhealthy
            }]
        );
    }
}

#[test]
fn a_moment_frozen_is_never_removed_nor_replaced() {
    // Scale-down from 3 to 1 while one instance is frozen by someone's `incus copy`: the
    // scale-down waits (its reading is missing), and it is not the one chosen.
    let s = GroupSpec {
        scale_down_stabilization: Duration::ZERO,
        ..spec(1, 5, 50.0)
    };
    let (mut h, now) = settled(3);
    let o = group(vec![
        at(1.0, 1),
        at(1.0, 2),
        unmeasured(InstanceStatus::Frozen, 3),
    ]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!((p.desired, p.reason), (3, Reason::MetricsMissing));
    assert!(p.actions.is_empty());
}

#[test]
fn ready_is_healthy_and_measured() {
    let ready = |p: f64, n: i64| ObservedInstance {
        status: InstanceStatus::Ready,
        ..at(p, n)
    };
    let s = spec(1, 10, 30.0);
    let (mut h, now) = settled(3);
    let p = decide(
        &s,
        &group(vec![ready(30.0, 1), ready(50.0, 2), ready(70.0, 3)]),
        &mut h,
        now,
    );
    assert_eq!(
        (p.healthy, p.desired),
        (3, 5),
        "the Kubernetes case, with Ready instances"
    );
}

#[test]
fn a_thawed_instance_makes_a_surplus_and_the_newest_goes() {
    // Desired 1 (and max 1): the frozen instance was replaced, then thawed.
    for max in [1, 5] {
        let (mut h, now) = settled(1);
        let p = decide(&spec(1, max, 50.0), &obs(&[20.0, 20.0]), &mut h, now);
        assert_eq!(
            p.actions,
            vec![Action::Remove {
                name: "web-1".into(),
                cause: Cause::Surplus
            }],
            "max {max}"
        );
    }
}

/// An instance that stops `ran` after each start.
fn crashed(ran: Duration) -> ObservedInstance {
    ObservedInstance {
        since_start: Some(ran),
        ..unmeasured(InstanceStatus::Stopped, 1)
    }
}

#[test]
fn a_crash_loop_is_restarted_with_a_doubling_backoff_then_replaced() {
    let s = spec(1, 3, 50.0);
    let (mut h, mut now) = settled(1);
    h.created("web-1");
    let down = group(vec![crashed(2 * SEC)]);
    let up = group(vec![ObservedInstance {
        since_start: Some(SEC),
        ..at(10.0, 1)
    }]);
    // Crash 1: restarted at once.
    let p = decide(&s, &down, &mut h, now);
    assert_eq!(
        p.actions,
        vec![Action::Start {
            name: "web-1".into(),
            cause: Cause::CrashLoop
        }]
    );
    assert!(matches!(
        p.notes[..],
        [Note::CrashLoop { crashes: 1, restart_in: Some(d), .. }] if d.is_zero()
    ));
    h.started(&s, "web-1", true, now);
    // Crashes 2, 3, 4: restarted after 10 s, 20 s, 40 s; meanwhile it still counts (no
    // replacement: one would meet the same fate) and the group is looked at again when due.
    for (crash, wait) in [(2, 10), (3, 20), (4, 40)] {
        decide(&s, &up, &mut h, now + SEC);
        let p = decide(&s, &down, &mut h, now + 2 * SEC);
        assert_eq!(p.actions, vec![], "crash {crash}: waits");
        assert_eq!(
            p.requeue_in,
            Some(Duration::from_secs(wait)),
            "crash {crash}"
        );
        assert!(matches!(
            p.notes[..],
            [Note::CrashLoop { crashes, restart_in: Some(d), .. }]
                if crashes == crash && d == Duration::from_secs(wait)
        ));
        now += Duration::from_secs(wait) + 2 * SEC;
        let p = decide(&s, &down, &mut h, now);
        assert_eq!(
            p.actions.len(),
            1,
            "crash {crash}: restarted after its backoff"
        );
        assert!(p.notes.is_empty());
        h.started(&s, "web-1", true, now);
    }
    // Crash 5: replaced.
    decide(&s, &up, &mut h, now + SEC);
    let p = decide(&s, &down, &mut h, now + 2 * SEC);
    assert!(matches!(
        p.notes[..],
        [Note::CrashLoop {
            crashes: 5,
            restart_in: None,
            ..
        }]
    ));
    assert_eq!(
        p.actions,
        vec![
            Action::Create {
                cause: Cause::Replace,
                target: None,
            },
            Action::Remove {
                name: "web-1".into(),
                cause: Cause::CrashLoop
            }
        ]
    );
}

#[test]
fn a_stop_after_a_long_run_is_no_crash_and_forgives_earlier_ones() {
    let s = spec(1, 3, 50.0);
    let (mut h, now) = settled(1);
    h.created("web-1");
    decide(&s, &group(vec![crashed(2 * SEC)]), &mut h, now);
    h.started(&s, "web-1", true, now);
    let p = decide(
        &s,
        &group(vec![crashed(CRASH_WINDOW)]),
        &mut h,
        now + 90 * SEC,
    );
    assert!(p.notes.is_empty(), "{:?}", p.notes);
    assert_eq!(
        p.actions,
        vec![Action::Start {
            name: "web-1".into(),
            cause: Cause::Restart
        }]
    );
    // Stopped at start-up (never seen running by this daemon): restarted, no crash counted.
    let (mut h, now) = settled(1);
    let p = decide(&s, &group(vec![crashed(SEC)]), &mut h, now);
    assert!(p.notes.is_empty());
    assert_eq!(p.actions[0].cause(), Cause::Restart);
}

#[test]
fn a_failed_start_is_retried_with_backoff_and_never_removed() {
    let s = spec(1, 1, 50.0);
    let (mut h, now) = settled(2);
    let o = group(vec![unmeasured(InstanceStatus::Stopped, 1), at(1.0, 2)]);
    h.started(&s, "web-1", false, now);
    // Above max with a healthy instance and one that cannot start: the healthy one stays
    // counted, the one that failed to start is not chosen for removal.
    let p = decide(&s, &o, &mut h, now + SEC);
    assert!(
        p.actions
            .iter()
            .all(|a| !matches!(a, Action::Remove { name, .. } if name == "web-1")),
        "{:?}",
        p.actions
    );
    let s = spec(1, 3, 50.0);
    let (mut h, now) = settled(1);
    let o = group(vec![unmeasured(InstanceStatus::Stopped, 1)]);
    for (failures, wait) in [(1u32, 10u64), (2, 20)] {
        h.started(&s, "web-1", false, now);
        let p = decide(&s, &o, &mut h, now);
        assert_eq!(p.actions, vec![], "after {failures} failure(s)");
        assert_eq!(p.requeue_in, Some(Duration::from_secs(wait)));
        let p = decide(&s, &o, &mut h, now + Duration::from_secs(wait));
        assert_eq!(
            p.actions,
            vec![Action::Start {
                name: "web-1".into(),
                cause: Cause::StartRetry
            }]
        );
    }
}

#[test]
fn an_instance_whose_start_keeps_failing_is_replaced_left_in_place_and_holds_nothing_back() {
    let s = GroupSpec {
        scale_down_stabilization: Duration::ZERO,
        ..spec(1, 3, 50.0)
    };
    let (mut h, now) = settled(2);
    // web-1 cannot start; web-2 and web-3 run.
    let o = group(vec![
        unmeasured(InstanceStatus::Stopped, 1),
        at(40.0, 2),
        at(40.0, 3),
    ]);
    for _ in 1..START_FAILURE_LIMIT {
        h.started(&s, "web-1", false, now);
    }
    // Two failures: still capacity, unmeasured, so the group does not shrink meanwhile.
    let p = decide(&s, &o, &mut h, now);
    assert_eq!((p.current, p.failing.len()), (3, 0));
    h.started(&s, "web-1", false, now);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!(p.failing, vec!["web-1"]);
    assert_eq!(p.current, 2, "no longer capacity");
    assert!(
        matches!(&p.notes[..], [Note::FailingStart { instance, failures: 3, retry_in }]
            if instance == "web-1" && *retry_in == Duration::from_secs(40)),
        "{:?}",
        p.notes
    );
    assert!(removed(&p).is_empty(), "never removed: {:?}", p.actions);
    assert_eq!(p.requeue_in, Some(Duration::from_secs(40)));
    // Said once; its start is still tried after the backoff.
    let later = now + Duration::from_secs(40);
    let p = decide(&s, &o, &mut h, later);
    assert!(p.notes.is_empty(), "{:?}", p.notes);
    assert!(p.actions.contains(&Action::Start {
        name: "web-1".into(),
        cause: Cause::StartRetry
    }));
    // Load gone: the group scales down although web-1 has no reading, and web-1 stays.
    let idle = group(vec![
        unmeasured(InstanceStatus::Stopped, 1),
        at(1.0, 2),
        at(1.0, 3),
    ]);
    h.started(&s, "web-1", false, later);
    let p = decide(&s, &idle, &mut h, later + SEC);
    assert_eq!(p.desired, 1, "{:?}", p.reason);
    assert_eq!(removed(&p), vec!["web-3"]);
    // Below its desired count (load on target) it is replaced, within max.
    let (mut h, now) = settled(3);
    for _ in 0..START_FAILURE_LIMIT {
        h.started(&s, "web-1", false, now);
    }
    let o = group(vec![
        unmeasured(InstanceStatus::Stopped, 1),
        at(50.0, 2),
        at(50.0, 3),
    ]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!(creates(&p), vec![Cause::Replace]);
}

#[test]
fn a_transition_is_confirmed_before_removal_whatever_the_grace() {
    let s = GroupSpec {
        unhealthy_grace: Duration::ZERO,
        ..spec(1, 2, 50.0)
    };
    let (mut h, t0) = settled(1);
    // Seen once stopping (an `incus restart` in progress): counted, never removed yet.
    let o = group(vec![unmeasured(InstanceStatus::Transition, 1)]);
    let p = decide(&s, &o, &mut h, t0);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.current, 1);
    let p = decide(&s, &o, &mut h, t0 + SEC);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    // Running again: nothing happened.
    let p = decide(&s, &group(vec![at(40.0, 1)]), &mut h, t0 + 2 * SEC);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    // Stuck for the confirmation: removed at once (a zero grace), and replaced.
    decide(&s, &o, &mut h, t0 + 3 * SEC);
    let p = decide(&s, &o, &mut h, t0 + 3 * SEC + UNHEALTHY_CONFIRM);
    assert_eq!(removed(&p), vec!["web-1"]);
    assert_eq!(creates(&p), vec![Cause::Replace]);
}

#[test]
fn a_creation_incus_did_not_finish_telling_is_counted_and_left_alone() {
    let s = spec(1, 3, 50.0);
    let (mut h, now) = settled(2);
    h.creating("web-2", now);
    let o = group(vec![at(40.0, 1), unmeasured(InstanceStatus::Stopped, 2)]);
    let p = decide(&s, &o, &mut h, now + SEC);
    assert_eq!(p.current, 2, "counted");
    assert!(
        p.actions.is_empty(),
        "neither started nor replaced: {:?}",
        p.actions
    );
    assert_eq!(p.requeue_in, Some(CREATING_MAX - SEC));
    // Running at last: an ordinary instance.
    let o = group(vec![at(40.0, 1), at(40.0, 2)]);
    let p = decide(&s, &o, &mut h, now + 30 * SEC);
    assert!(p.actions.is_empty());
    // Never seen running within the bound: an ordinary stopped instance, started.
    let (mut h, now) = settled(2);
    h.creating("web-2", now);
    let o = group(vec![at(40.0, 1), unmeasured(InstanceStatus::Stopped, 2)]);
    let p = decide(&s, &o, &mut h, now + CREATING_MAX);
    assert_eq!(
        p.actions,
        vec![Action::Start {
            name: "web-2".into(),
            cause: Cause::Restart
        }]
    );
}

#[test]
fn backoffs_double_up_to_their_cap() {
    let base = Duration::from_secs(10);
    let delays: Vec<u64> = (1..=8)
        .map(|n| health::restart_delay(base, n).as_secs())
        .collect();
    assert_eq!(delays, [0, 10, 20, 40, 80, 160, 300, 300]);
    assert_eq!(health::retry_delay(base, 1), base);
    assert_eq!(
        health::retry_delay(base, u32::MAX),
        crate::model::RESTART_BACKOFF_MAX
    );
}

fn warm(n: i64) -> ObservedInstance {
    ObservedInstance {
        warm: true,
        protected: false,
        ..unmeasured(InstanceStatus::Stopped, n)
    }
}

#[test]
fn the_warm_pool_is_filled_used_first_and_never_counted() {
    let s = GroupSpec {
        warm_pool: 2,
        paused: false,
        scale_down_order: Default::default(),
        drain_command: vec![],
        drain_timeout: Duration::from_secs(30),
        target: None,
        ..spec(1, 5, 50.0)
    };
    // Empty pool: filled, after everything else.
    let (mut h, now) = settled(1);
    let p = decide(&s, &obs(&[40.0]), &mut h, now);
    assert_eq!(p.actions, vec![Action::CreateWarm { target: None }; 2]);
    // A full pool is neither capacity nor measured nor restarted.
    let o = group(vec![at(40.0, 1), warm(2), warm(3)]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!((p.current, p.warm, p.unhealthy), (1, 2, 0));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    // Scale-up to 3: the two warm ones (oldest first) are started, the pool refilled.
    let o = group(vec![at(100.0, 1), warm(3), warm(2)]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!(p.desired, 2);
    assert_eq!(
        p.actions,
        vec![
            Action::Promote {
                name: "web-2".into(),
                cause: Cause::ScaleUp
            },
            Action::CreateWarm { target: None },
        ]
    );
    // Scale-down never puts a running instance back in the pool; a smaller pool shrinks.
    let s0 = GroupSpec {
        warm_pool: 1,
        paused: false,
        scale_down_order: Default::default(),
        drain_command: vec![],
        drain_timeout: Duration::from_secs(30),
        target: None,
        scale_down_stabilization: Duration::ZERO,
        ..spec(1, 5, 50.0)
    };
    let (mut h, now) = settled(2);
    let o = group(vec![at(1.0, 1), at(1.0, 2), warm(3), warm(4)]);
    let p = decide(&s0, &o, &mut h, now);
    let remove = |n: &str, cause| Action::Remove {
        name: n.into(),
        cause,
    };
    assert_eq!(
        p.actions,
        vec![
            remove("web-2", Cause::ScaleDown),
            remove("web-3", Cause::WarmPool)
        ]
    );
}
