//! Above `max`: a schedule window that closes above the group's `max` winds down through the
//! scale-down stabilization window and the step limits; a window's lower `max` is reached
//! within the step limits; a `max` lowered in the file is restored at once. Every removal
//! counts in the step accounting, whatever its reason.

use std::time::Duration;

use tokio::time::Instant;

use super::tests::{at, obs, removed, settled, spec, unmeasured};
use super::*;
use crate::model::{InstanceStatus, Window};

const SEC: Duration = Duration::from_secs(1);

/// The instances a plan removes, gone from `o`; returns the causes of their removals.
fn apply(p: &Plan, o: &mut Observation) -> Vec<Cause> {
    let gone = removed(p);
    o.instances.retain(|i| !gone.contains(&i.name.as_str()));
    p.actions
        .iter()
        .filter(|a| matches!(a, Action::Remove { .. }))
        .map(Action::cause)
        .collect()
}

fn window(min: Option<u32>, max: Option<u32>) -> Option<Window> {
    Some(Window { min, max })
}

/// `n` instances at `percent`, while `window` is open.
fn group(n: i64, percent: f64, window: Option<Window>) -> Observation {
    Observation {
        instances: (1..=n).map(|k| at(percent, k)).collect(),
        window,
        ..Default::default()
    }
}

/// Runs passes every `every` from `from` until `until`, acting on each plan; returns when
/// each removal happened and its cause.
fn run(
    s: &GroupSpec,
    o: &mut Observation,
    h: &mut History,
    from: Instant,
    until: Instant,
    every: Duration,
) -> Vec<(Instant, Cause, Reason)> {
    let mut out = Vec::new();
    let mut t = from;
    while t < until {
        let p = decide(s, o, h, t);
        assert!(
            p.actions.iter().all(|a| matches!(a, Action::Remove { .. })),
            "{:?}",
            p.actions
        );
        out.extend(apply(&p, o).into_iter().map(|c| (t, c, p.reason)));
        t += every;
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_window_closing_above_max_winds_down_a_step_per_interval_after_the_stabilization_window()
{
    // The example: max 10, a window with max 30, the load took the count to 25.
    let s = GroupSpec {
        max_scale_down_step: Some(1),
        scale_down_stabilization: Duration::from_secs(300),
        interval: Duration::from_secs(15),
        ..spec(1, 10, 50.0)
    };
    let (mut h, t0) = settled(25);
    let mut o = group(25, 50.0, window(None, Some(30)));
    for k in 0..4 {
        let p = decide(&s, &o, &mut h, t0 + k * s.interval);
        assert_eq!((p.desired, p.actions.len()), (25, 0), "window open");
    }
    let last_open = t0 + 3 * s.interval;
    // The window closes; passes every 5 s (an event may wake the group between intervals).
    o.window = None;
    let closed = t0 + 4 * s.interval;
    let p = decide(&s, &o, &mut h, closed);
    assert_eq!(
        (p.desired, p.reason, p.recommendation),
        (25, Reason::WindowClosed, 10)
    );
    assert!(p.actions.is_empty(), "held by the stabilization window");
    let removals = run(&s, &mut o, &mut h, closed, closed + 900 * SEC, 5 * SEC);
    assert_eq!(o.instances.len(), 10, "down to max at the end");
    assert_eq!(removals.len(), 15);
    // Nothing goes before the last recommendation of 25 has left the stabilization window.
    assert!(removals[0].0 >= last_open + s.scale_down_stabilization);
    // Then one per interval, as scale-downs.
    for pair in removals.windows(2) {
        assert!(pair[1].0 - pair[0].0 >= s.interval, "{pair:?}");
    }
    for (_, cause, reason) in &removals {
        assert_eq!((*cause, *reason), (Cause::ScaleDown, Reason::WindowClosed));
    }
    // At max, the usual rules again.
    let p = decide(&s, &o, &mut h, closed + 900 * SEC);
    assert_eq!((p.desired, p.reason), (10, Reason::WithinTolerance));
}

#[tokio::test(start_paused = true)]
async fn a_window_min_above_max_closes_one_step_per_interval() {
    // The reproduction on Incus: a window (min 6) closing above max = 2, a step of 1.
    let s = GroupSpec {
        max_scale_down_step: Some(1),
        scale_down_stabilization: Duration::ZERO,
        interval: Duration::from_secs(2),
        ..spec(1, 2, 50.0)
    };
    let (mut h, t0) = settled(6);
    let mut o = group(6, 50.0, window(Some(6), None));
    let p = decide(&s, &o, &mut h, t0);
    assert_eq!(
        (p.desired, p.actions.len()),
        (6, 0),
        "held by the window's min"
    );
    o.window = None;
    let removals = run(&s, &mut o, &mut h, t0 + SEC, t0 + 60 * SEC, SEC / 2);
    assert_eq!(o.instances.len(), 2);
    assert_eq!(removals.len(), 4);
    for pair in removals.windows(2) {
        assert!(pair[1].0 - pair[0].0 >= s.interval, "{pair:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_max_lowered_in_the_file_is_restored_at_once_and_counts_in_the_steps() {
    let s = GroupSpec {
        max_scale_down_step: Some(1),
        scale_down_stabilization: Duration::ZERO,
        interval: Duration::from_secs(15),
        ..spec(1, 10, 50.0)
    };
    let (mut h, t0) = settled(8);
    let mut o = group(8, 50.0, None);
    let p = decide(&s, &o, &mut h, t0);
    assert_eq!(p.desired, 8);
    // max 10 -> 5 in the file: 3 go in one pass, whatever the step.
    let lowered = GroupSpec {
        max: 5,
        ..s.clone()
    };
    let p = decide(&lowered, &o, &mut h, t0 + SEC);
    assert_eq!(
        (p.desired, p.reason, p.step_limited),
        (5, Reason::AboveMax, false)
    );
    assert_eq!(apply(&p, &mut o), vec![Cause::AboveMax; 3]);
    // The load drops: those 3 removals used the interval's step, so nothing more goes in it.
    for i in &mut o.instances {
        *i = at(1.0, i.created_at);
    }
    for secs in [2, 5, 10, 15] {
        let p = decide(&lowered, &o, &mut h, t0 + secs * SEC);
        assert!(removed(&p).is_empty(), "at {secs}s: {:?}", p.actions);
        assert!(p.step_limited, "at {secs}s");
    }
    // One interval after them, the next step.
    let p = decide(&lowered, &o, &mut h, t0 + 16 * SEC);
    assert_eq!(apply(&p, &mut o), vec![Cause::ScaleDown]);
}

#[tokio::test(start_paused = true)]
async fn a_max_lowered_in_the_file_during_a_wind_down_is_restored_at_once() {
    let s = GroupSpec {
        max_scale_down_step: Some(1),
        scale_down_stabilization: Duration::ZERO,
        interval: Duration::from_secs(15),
        ..spec(1, 10, 50.0)
    };
    let (mut h, t0) = settled(20);
    let mut o = group(20, 50.0, window(None, Some(30)));
    decide(&s, &o, &mut h, t0);
    o.window = None;
    let p = decide(&s, &o, &mut h, t0 + s.interval);
    assert_eq!((p.desired, p.reason), (19, Reason::WindowClosed));
    apply(&p, &mut o);
    // The wind-down holds a step per interval; a max lowered in the file does not wait.
    let lowered = GroupSpec {
        max: 5,
        ..s.clone()
    };
    let p = decide(&lowered, &o, &mut h, t0 + s.interval + SEC);
    assert_eq!((p.desired, p.reason), (5, Reason::AboveMax));
    assert_eq!(apply(&p, &mut o).len(), 14);
    // A max raised in the file during a wind-down lets the wind-down go on to it.
    let (mut h, t0) = settled(20);
    let mut o = group(20, 50.0, window(None, Some(30)));
    decide(&s, &o, &mut h, t0);
    o.window = None;
    let raised = GroupSpec {
        max: 15,
        ..s.clone()
    };
    let p = decide(&raised, &o, &mut h, t0 + s.interval);
    assert_eq!((p.desired, p.reason), (19, Reason::WindowClosed));
}

#[tokio::test(start_paused = true)]
async fn a_window_lowering_max_removes_within_the_step_limits_without_stabilization() {
    let s = GroupSpec {
        max_scale_down_step: Some(1),
        scale_down_stabilization: Duration::from_secs(300),
        interval: Duration::from_secs(15),
        ..spec(1, 10, 50.0)
    };
    let (mut h, t0) = settled(6);
    let mut o = group(6, 50.0, None);
    decide(&s, &o, &mut h, t0);
    o.window = window(None, Some(3));
    // Not held by the stabilization window: the operator's calendar. One per interval.
    let removals = run(&s, &mut o, &mut h, t0 + SEC, t0 + 60 * SEC, 5 * SEC);
    assert_eq!(o.instances.len(), 3);
    let times: Vec<_> = removals.iter().map(|(t, _, _)| *t - t0).collect();
    assert_eq!(times, vec![SEC, 16 * SEC, 31 * SEC]);
    assert!(removals.iter().all(|(_, _, r)| *r == Reason::ScheduleMax));
    // Without step limits, at once (still without stabilization).
    let s = GroupSpec {
        max_scale_down_step: None,
        ..s
    };
    let (mut h, t0) = settled(6);
    let mut o = group(6, 50.0, window(None, Some(3)));
    let p = decide(&s, &o, &mut h, t0);
    assert_eq!((p.desired, p.reason), (3, Reason::ScheduleMax));
    assert_eq!(apply(&p, &mut o).len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_daemon_that_remembers_nothing_restores_max_at_once() {
    // A restarted daemon cannot tell a closed window from a max lowered in the file.
    let s = GroupSpec {
        max_scale_down_step: Some(1),
        ..spec(1, 10, 50.0)
    };
    let p = decide(
        &s,
        &group(25, 50.0, None),
        &mut History::default(),
        Instant::now(),
    );
    assert_eq!((p.desired, p.reason), (10, Reason::AboveMax));
}

#[tokio::test(start_paused = true)]
async fn an_unhealthy_removal_counts_in_the_step_accounting() {
    let s = GroupSpec {
        max_scale_down_step: Some(1),
        scale_down_stabilization: Duration::ZERO,
        interval: Duration::from_secs(15),
        ..spec(1, 10, 50.0)
    };
    // 4 serve at the threshold; a fifth is in error (its replacement is among the 4).
    let (mut h, t0) = settled(4);
    let mut o = obs(&[50.0; 4]);
    o.instances.push(unmeasured(InstanceStatus::Error, 9));
    let p = decide(&s, &o, &mut h, t0);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    // After its grace period it goes; the load drops in the same pass: one removal only.
    for i in o.instances.iter_mut().filter(|i| i.status.is_healthy()) {
        *i = at(1.0, i.created_at);
    }
    let gone = t0 + s.unhealthy_grace;
    let p = decide(&s, &o, &mut h, gone);
    assert_eq!(apply(&p, &mut o), vec![Cause::Unhealthy]);
    assert!(p.step_limited);
    // Nor later in that interval.
    let p = decide(&s, &o, &mut h, gone + 10 * SEC);
    assert!(removed(&p).is_empty(), "{:?}", p.actions);
    // The next interval, the scale-down's step.
    let p = decide(&s, &o, &mut h, gone + 16 * SEC);
    assert_eq!(apply(&p, &mut o), vec![Cause::ScaleDown]);
}

#[tokio::test(start_paused = true)]
async fn a_crash_loop_removal_counts_in_the_step_accounting() {
    let s = GroupSpec {
        max_scale_down_step: Some(1),
        scale_down_stabilization: Duration::ZERO,
        interval: Duration::from_secs(15),
        ..spec(1, 10, 50.0)
    };
    let (mut h, t0) = settled(3);
    let mut busy = obs(&[50.0; 3]);
    busy.instances[0].since_start = Some(SEC);
    let mut down = busy.clone();
    down.instances[0] = ObservedInstance {
        status: InstanceStatus::Stopped,
        since_start: Some(2 * SEC),
        memory: None,
        ..busy.instances[0].clone()
    };
    // web-0 crashes CRASH_LIMIT times in a row, 2 s after each start.
    let mut t = t0;
    for _ in 1..CRASH_LIMIT {
        decide(&s, &busy, &mut h, t);
        decide(&s, &down, &mut h, t + SEC);
        t += Duration::from_secs(600);
    }
    decide(&s, &busy, &mut h, t);
    // The last crash retires it while the load drops: that removal is the interval's step.
    for i in &mut down.instances[1..] {
        *i = at(1.0, i.created_at);
    }
    let p = decide(&s, &down, &mut h, t + SEC);
    assert_eq!(
        apply(&p, &mut down),
        vec![Cause::CrashLoop],
        "{:?}",
        p.actions
    );
    let p = decide(&s, &down, &mut h, t + 10 * SEC);
    assert!(removed(&p).is_empty(), "{:?}", p.actions);
    let p = decide(&s, &down, &mut h, t + 17 * SEC);
    assert_eq!(apply(&p, &mut down), vec![Cause::ScaleDown]);
}

#[tokio::test(start_paused = true)]
async fn a_standby_that_takes_the_group_during_a_wind_down_goes_on_gradually() {
    let s = GroupSpec {
        max_scale_down_step: Some(1),
        scale_down_stabilization: Duration::ZERO,
        interval: Duration::from_secs(15),
        ..spec(1, 10, 50.0)
    };
    // A standby decides every pass and acts on none: it saw the window.
    let mut h = History::default();
    let t0 = Instant::now();
    let mut o = group(20, 50.0, window(None, Some(30)));
    let standby = |h: &mut History, o: &Observation, t: Instant| {
        let before = h.clone();
        decide(&s, o, h, t);
        h.not_acted(&before);
    };
    standby(&mut h, &o, t0);
    o.window = None;
    standby(&mut h, &o, t0 + s.interval);
    // The holder removed one; then the standby takes the group.
    o.instances.pop();
    standby(&mut h, &o, t0 + 2 * s.interval);
    let p = decide(&s, &o, &mut h, t0 + 3 * s.interval);
    assert_eq!((p.desired, p.reason), (18, Reason::WindowClosed));
    assert_eq!(removed(&p).len(), 1);
}
