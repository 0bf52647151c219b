//! Step limits: how many instances a scale-up adds and a scale-down removes per `interval`,
//! however many passes run, and however far the desired count moved while nothing could be
//! done (a pause).

use std::time::Duration;

use super::tests::{obs, removed, settled, spec};
use super::*;

#[test]
fn step_limits_cut_metric_driven_changes_only() {
    let mut s = spec(1, 10, 50.0);
    s.max_scale_up_step = Some(2);
    s.max_scale_down_step = Some(1);
    // 2 at 100 % of a 50 % target -> 4, within the step.
    let (mut h, now) = settled(2);
    let p = decide(&s, &obs(&[100.0, 100.0]), &mut h, now);
    assert_eq!((p.desired, p.step_limited), (4, false));
    // 3 at 100 % -> 6, cut to 3 + 2.
    let (mut h, now) = settled(3);
    let p = decide(&s, &obs(&[100.0; 3]), &mut h, now);
    assert_eq!((p.desired, p.recommendation, p.step_limited), (5, 6, true));
    // 6 nearly idle -> 1, cut to 6 - 1.
    let s0 = GroupSpec {
        scale_down_stabilization: Duration::ZERO,
        ..s.clone()
    };
    let (mut h, now) = settled(6);
    let p = decide(&s0, &obs(&[1.0; 6]), &mut h, now);
    assert_eq!((p.desired, p.step_limited), (5, true));
    assert_eq!(p.actions.len(), 1);
    // Bounds are restored in one pass whatever the limits.
    let (mut h, now) = settled(0);
    let p = decide(
        &spec_with_steps(3, 10),
        &Observation::default(),
        &mut h,
        now,
    );
    assert_eq!((p.desired, p.step_limited), (3, false));
    let (mut h, now) = settled(6);
    let p = decide(&spec_with_steps(1, 2), &obs(&[1.0; 6]), &mut h, now);
    assert_eq!((p.desired, p.step_limited), (2, false));
}

#[test]
fn step_limits_hold_per_interval_however_many_passes_run() {
    let s = GroupSpec {
        max_scale_down_step: Some(1),
        scale_down_stabilization: Duration::ZERO,
        interval: Duration::from_secs(8),
        ..spec(1, 10, 50.0)
    };
    let (mut h, t0) = settled(4);
    let mut o = obs(&[1.0; 4]);
    let p = decide(&s, &o, &mut h, t0);
    assert_eq!(p.desired, 3);
    o.instances.pop();
    // Events wake the group three more times within the same 8 s: no further removal.
    for secs in [1, 2, 7] {
        let p = decide(&s, &o, &mut h, t0 + Duration::from_secs(secs));
        assert_eq!((p.desired, p.step_limited), (3, true), "at {secs}s");
        assert!(p.actions.is_empty());
    }
    // One interval later, the next one.
    let p = decide(&s, &o, &mut h, t0 + Duration::from_secs(8));
    assert_eq!(p.desired, 2);
}

#[test]
fn step_limits_bound_removals_after_a_pause_however_far_the_count_moved() {
    // Paused at 4 while min drops to 1: passes go on deciding, nothing is removed.
    let paused = GroupSpec {
        max_scale_down_step: Some(1),
        scale_down_stabilization: Duration::ZERO,
        interval: Duration::from_secs(5),
        paused: true,
        ..spec(1, 10, 50.0)
    };
    let (mut h, t0) = settled(4);
    let o = obs(&[1.0; 4]);
    for k in 0..20 {
        let p = decide(&paused, &o, &mut h, t0 + Duration::from_secs(5 * k));
        assert!(p.actions.is_empty());
        assert_eq!(p.desired, 3, "never more than a step from the 4 there are");
    }
    // Resumed: one removal per interval, however many passes run.
    let s = GroupSpec {
        paused: false,
        ..paused
    };
    let mut o = o;
    let mut t = t0 + Duration::from_secs(100);
    for left in [3usize, 2, 1] {
        let p = decide(&s, &o, &mut h, t);
        assert_eq!(removed(&p).len(), 1, "at {left} left: {:?}", p.actions);
        o.instances.pop();
        let p = decide(&s, &o, &mut h, t + Duration::from_secs(1));
        assert!(removed(&p).is_empty(), "{:?}", p.actions);
        t += Duration::from_secs(5);
    }
    assert_eq!(o.instances.len(), 1);
    // The same after failed deletes: the count does not run ahead of what runs.
    let (mut h, t0) = settled(4);
    let o = obs(&[1.0; 4]);
    for k in 0..5 {
        let p = decide(&s, &o, &mut h, t0 + Duration::from_secs(5 * k));
        assert_eq!(removed(&p).len(), 1, "pass {k}: {:?}", p.actions);
    }
}

#[test]
fn step_limits_bound_additions_after_a_pause_too() {
    let paused = GroupSpec {
        max_scale_up_step: Some(1),
        interval: Duration::from_secs(5),
        paused: true,
        ..spec(1, 10, 50.0)
    };
    let (mut h, t0) = settled(2);
    let o = obs(&[100.0; 2]);
    for k in 0..10 {
        let p = decide(&paused, &o, &mut h, t0 + Duration::from_secs(5 * k));
        assert_eq!(p.desired, 3);
    }
    let s = GroupSpec {
        paused: false,
        ..paused
    };
    let p = decide(&s, &o, &mut h, t0 + Duration::from_secs(60));
    assert_eq!(p.actions.len(), 1, "{:?}", p.actions);
}

fn spec_with_steps(min: u32, max: u32) -> GroupSpec {
    GroupSpec {
        max_scale_up_step: Some(1),
        max_scale_down_step: Some(1),
        ..spec(min, max, 50.0)
    }
}
