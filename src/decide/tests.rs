//! Table tests for the decision core, with the Kubernetes HPA reference cases and the edges.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::model::{GroupName, InstanceStatus, Memory, ObservedInstance};

const MIB: u64 = 1 << 20;

pub(crate) fn spec(min: u32, max: u32, threshold: f64) -> GroupSpec {
    GroupSpec {
        name: GroupName::parse("web").unwrap(),
        min,
        max,
        memory_threshold: Some(threshold),
        cpu_threshold: None,
        pressure_threshold: None,
        tolerance_up: 0.1,
        tolerance_down: 0.1,
        cpu_limit: None,
        external: vec![],
        schedule: vec![],
        image: "busybox".into(),
        instance_prefix: "web-".into(),
        profiles: vec!["default".into()],
        project: "default".into(),
        config: BTreeMap::new(),
        scale_down_stabilization: Duration::from_secs(300),
        scale_up_stabilization: Duration::ZERO,
        max_scale_up_step: None,
        max_scale_down_step: None,
        stop_timeout: Duration::from_secs(30),
        unhealthy_grace: Duration::from_secs(300),
        restart_backoff: Duration::from_secs(10),
        interval: Duration::from_secs(15),
        warm_pool: 0,
        paused: false,
        scale_down_order: Default::default(),
        policy: crate::model::Policy::Kubernetes,
        drain_command: vec![],
        drain_timeout: Duration::from_secs(30),
        target: None,
        ready: None,
        endpoints: None,
    }
}

/// One running instance at `percent` of a 100 MiB limit, created at `created`.
pub(super) fn at(percent: f64, created: i64) -> ObservedInstance {
    ObservedInstance {
        readiness: Default::default(),
        address: None,
        location: String::new(),
        name: format!("web-{created}"),
        status: InstanceStatus::Running,
        created_at: created,
        since_start: Some(Duration::from_secs(3600)),
        warm: false,
        protected: false,
        memory: Some(Memory {
            usage: (percent * MIB as f64) as u64,
            limit: 100 * MIB,
            oom_kills: None,
            ..Default::default()
        }),
    }
}

pub(crate) fn unmeasured(status: InstanceStatus, created: i64) -> ObservedInstance {
    ObservedInstance {
        readiness: Default::default(),
        address: None,
        location: String::new(),
        name: format!("web-{created}"),
        status,
        created_at: created,
        since_start: Some(Duration::from_secs(3600)),
        warm: false,
        protected: false,
        memory: None,
    }
}

pub(super) fn obs(percents: &[f64]) -> Observation {
    Observation {
        instances: percents
            .iter()
            .enumerate()
            .map(|(i, p)| at(*p, i as i64))
            .collect(),
        foreign: vec![],
        ..Default::default()
    }
}

/// A history whose desired count is `desired`, decided long ago (outside every window and
/// period): no stabilization or step effect.
pub(crate) fn settled(desired: u32) -> (History, Instant) {
    let t0 = Instant::now();
    let mut h = History::default();
    h.record(&spec(0, 1000, 50.0), t0, desired, desired, desired);
    (h, t0 + Duration::from_secs(1000))
}

/// Decides with a settled history whose desired count is the observed capacity.
fn run(spec: &GroupSpec, obs: &Observation) -> Plan {
    let capacity = obs
        .instances
        .iter()
        .filter(|i| i.status.is_healthy() || i.status == InstanceStatus::Stopped)
        .count() as u32;
    let (mut h, now) = settled(capacity);
    decide(spec, obs, &mut h, now)
}

fn observation(instances: Vec<ObservedInstance>) -> Observation {
    Observation {
        instances,
        foreign: vec![],
        ..Default::default()
    }
}

#[test]
fn reference_and_edge_cases() {
    struct Case {
        name: &'static str,
        spec: GroupSpec,
        obs: Observation,
        desired: u32,
        reason: Reason,
    }
    let limitless = |p: f64| ObservedInstance {
        location: String::new(),
        memory: Some(Memory {
            usage: (p * 1e7) as u64,
            limit: 1_000_000_000,
            oom_kills: None,
            ..Default::default()
        }),
        ..at(0.0, 0)
    };
    let cases = [
        Case {
            name: "k8s: 3 at 30/50/70 %, target 30 -> 5",
            spec: spec(1, 10, 30.0),
            obs: obs(&[30.0, 50.0, 70.0]),
            desired: 5,
            reason: Reason::AboveThreshold,
        },
        Case {
            name: "k8s: 102 % of target -> no change",
            spec: spec(1, 10, 50.0),
            obs: obs(&[51.0, 51.0, 51.0]),
            desired: 3,
            reason: Reason::WithinTolerance,
        },
        Case {
            name: "k8s: 5 averaging 28 % (10/30/50/25/25), target 50 -> 3",
            spec: spec(1, 10, 50.0),
            obs: obs(&[10.0, 30.0, 50.0, 25.0, 25.0]),
            desired: 3,
            reason: Reason::BelowThreshold,
        },
        Case {
            name: "0 running, min 2 -> 2",
            spec: spec(2, 5, 70.0),
            obs: Observation::default(),
            desired: 2,
            reason: Reason::BelowMin,
        },
        Case {
            name: "0 running, min 0 -> stays 0",
            spec: spec(0, 5, 70.0),
            obs: Observation::default(),
            desired: 0,
            reason: Reason::NoMetrics,
        },
        Case {
            name: "all at 0 % -> min",
            spec: spec(1, 5, 70.0),
            obs: obs(&[0.0, 0.0, 0.0]),
            desired: 1,
            reason: Reason::BelowThreshold,
        },
        Case {
            name: "above max scales down whatever the memory",
            spec: spec(1, 2, 50.0),
            obs: obs(&[99.0, 99.0, 99.0, 99.0]),
            desired: 2,
            reason: Reason::AboveMax,
        },
        Case {
            name: "clamped to max",
            spec: spec(1, 4, 10.0),
            obs: obs(&[90.0, 90.0]),
            desired: 4,
            reason: Reason::AboveThreshold,
        },
        Case {
            name: "no limit: measured against the host's memory",
            spec: spec(1, 5, 50.0),
            obs: observation(vec![limitless(80.0), limitless(80.0)]),
            desired: 4,
            reason: Reason::AboveThreshold,
        },
        Case {
            name: "a missing metric never scales down",
            spec: spec(1, 5, 50.0),
            obs: observation(vec![
                at(5.0, 1),
                at(5.0, 2),
                unmeasured(InstanceStatus::Running, 3),
            ]),
            desired: 3,
            reason: Reason::MetricsMissing,
        },
        Case {
            name: "missing metrics count as 0 % on the way up: 30/50/70 + one unmeasured, target 30 -> 5",
            spec: spec(1, 10, 30.0),
            obs: observation(vec![
                at(30.0, 1),
                at(50.0, 2),
                at(70.0, 3),
                unmeasured(InstanceStatus::Running, 4),
            ]),
            desired: 5,
            reason: Reason::AboveThreshold,
        },
        Case {
            name: "missing counted as 0 lands within tolerance -> keep",
            spec: spec(1, 10, 50.0),
            obs: observation(vec![
                at(62.0, 1),
                at(50.0, 2),
                unmeasured(InstanceStatus::Stopped, 3),
            ]),
            desired: 3,
            reason: Reason::MetricsMissing,
        },
        Case {
            name: "every metric missing -> keep",
            spec: spec(1, 5, 50.0),
            obs: observation(vec![
                unmeasured(InstanceStatus::Running, 1),
                unmeasured(InstanceStatus::Running, 2),
            ]),
            desired: 2,
            reason: Reason::NoMetrics,
        },
        Case {
            name: "zero limit is a missing metric",
            spec: spec(1, 5, 50.0),
            obs: observation(vec![ObservedInstance {
                location: String::new(),
                memory: Some(Memory { usage: 5, limit: 0, oom_kills: None, ..Default::default() }),
                ..at(0.0, 1)
            }]),
            desired: 1,
            reason: Reason::NoMetrics,
        },
    ];
    for c in cases {
        let plan = run(&c.spec, &c.obs);
        assert_eq!(
            (plan.desired, plan.reason),
            (c.desired, c.reason),
            "{}",
            c.name
        );
    }
}

#[test]
fn utilization_is_the_mean_of_measured_instances() {
    let plan = run(&spec(1, 10, 30.0), &obs(&[30.0, 50.0, 70.0]));
    assert!((plan.utilization.unwrap() - 50.0).abs() < 1e-6);
    assert_eq!(plan.current, 3);
    let up = Action::Create {
        cause: Cause::ScaleUp,
        target: None,
    };
    assert_eq!(plan.actions, vec![up.clone(), up]);
}

#[test]
fn scale_down_waits_for_the_stabilization_window() {
    let s = spec(1, 10, 50.0);
    let t0 = Instant::now();
    let mut h = History::default();
    // Busy: 4 instances at 50 % -> keep 4.
    let p = decide(&s, &obs(&[50.0; 4]), &mut h, t0);
    assert_eq!(p.desired, 4);
    // Load gone: recommendation 1, held at 4 during the window.
    for secs in [15, 150, 299] {
        let now = t0 + Duration::from_secs(secs);
        let p = decide(&s, &obs(&[5.0; 4]), &mut h, now);
        assert_eq!(
            (p.desired, p.reason),
            (4, Reason::Stabilizing),
            "at {secs}s"
        );
        assert_eq!(p.recommendation, 1);
        assert!(p.actions.is_empty());
    }
    // Once the busy recommendation has left the window, scale down to the highest left (1).
    let now = t0 + Duration::from_secs(301);
    let p = decide(&s, &obs(&[5.0; 4]), &mut h, now);
    assert_eq!((p.desired, p.reason), (1, Reason::BelowThreshold));
    assert!(p.actions.iter().all(|a| a.cause() == Cause::ScaleDown));
}

#[test]
fn a_fresh_history_is_seeded_with_the_current_count() {
    let s = spec(1, 10, 50.0);
    let t0 = Instant::now();
    let mut h = History::default();
    let p = decide(&s, &obs(&[1.0; 3]), &mut h, t0);
    assert_eq!((p.desired, p.reason), (3, Reason::Stabilizing));
    let p = decide(&s, &obs(&[1.0; 3]), &mut h, t0 + Duration::from_secs(10));
    assert_eq!(p.desired, 3, "no scale-down right after a restart");
    let p = decide(&s, &obs(&[1.0; 3]), &mut h, t0 + Duration::from_secs(301));
    assert_eq!(p.desired, 1);
}

#[test]
fn without_a_scale_down_window_a_fresh_history_scales_down_at_once() {
    let s = GroupSpec {
        scale_down_stabilization: Duration::ZERO,
        ..spec(1, 10, 50.0)
    };
    let p = decide(&s, &obs(&[1.0; 3]), &mut History::default(), Instant::now());
    assert_eq!((p.desired, p.reason), (1, Reason::BelowThreshold));
}

#[test]
fn scale_up_is_immediate_by_default_and_can_be_stabilized() {
    let mut s = spec(1, 10, 50.0);
    let t0 = Instant::now();
    assert_eq!(
        decide(&s, &obs(&[100.0; 2]), &mut History::default(), t0).desired,
        4
    );

    s.scale_up_stabilization = Duration::from_secs(60);
    let mut h = History::default();
    decide(&s, &obs(&[50.0; 2]), &mut h, t0);
    let now = t0 + Duration::from_secs(30);
    let p = decide(&s, &obs(&[100.0; 2]), &mut h, now);
    assert_eq!((p.desired, p.reason), (2, Reason::StabilizingUp));
}

#[test]
fn removal_takes_stopped_first_then_the_newest() {
    let s = spec(1, 2, 50.0);
    let mut o = obs(&[10.0, 10.0, 10.0]);
    o.instances.push(unmeasured(InstanceStatus::Stopped, 0));
    o.instances[3].name = "web-stopped".into();
    let p = run(&s, &o);
    assert_eq!(p.reason, Reason::AboveMax);
    let remove = |name: &str| Action::Remove {
        name: name.into(),
        cause: Cause::AboveMax,
    };
    assert_eq!(p.actions, vec![remove("web-stopped"), remove("web-2")]);
}

#[test]
fn stopped_instances_are_started_again() {
    let s = spec(2, 5, 50.0);
    let o = observation(vec![at(50.0, 1), unmeasured(InstanceStatus::Stopped, 2)]);
    let p = run(&s, &o);
    assert_eq!(p.desired, 2);
    assert_eq!(
        p.actions,
        vec![Action::Start {
            name: "web-2".into(),
            cause: Cause::Restart,
        }]
    );
}

#[test]
fn a_deleted_instance_is_replaced_without_changing_the_desired_count() {
    let (mut h, now) = settled(3);
    let p = decide(&spec(1, 5, 50.0), &obs(&[50.0, 50.0]), &mut h, now);
    assert_eq!((p.current, p.desired), (2, 3));
    assert_eq!(
        p.actions,
        vec![Action::Create {
            cause: Cause::Replace,
            target: None,
        }]
    );
}

#[test]
fn a_plan_not_acted_on_leaves_the_next_pass_to_bring_the_group_to_min() {
    // A daemon whose lease of a new group is not read back yet decides 2 creations and makes
    // none: the next pass creates them for `min`, not as replacements.
    let s = spec(2, 5, 50.0);
    let (mut h, now) = (History::default(), Instant::now());
    let before = h.clone();
    let p = decide(&s, &obs(&[]), &mut h, now);
    assert_eq!((p.desired, p.reason), (2, Reason::BelowMin));
    h.not_acted(&before);
    let p = decide(&s, &obs(&[]), &mut h, now + Duration::from_secs(15));
    assert_eq!((p.desired, p.reason), (2, Reason::BelowMin));
    let causes: Vec<_> = p.actions.iter().map(Action::cause).collect();
    assert_eq!(causes, [Cause::BelowMin, Cause::BelowMin]);
    // Acted on, the desired count stands: an instance gone is then replaced.
    let p = decide(&s, &obs(&[40.0]), &mut h, now + Duration::from_secs(30));
    let causes: Vec<_> = p.actions.iter().map(Action::cause).collect();
    assert_eq!(causes, [Cause::Replace]);
}

#[test]
fn history_forgets_old_entries() {
    let t0 = Instant::now();
    let s = GroupSpec {
        scale_down_stabilization: Duration::from_secs(60),
        ..spec(1, 5, 50.0)
    };
    let mut h = History::default();
    for k in 0..100 {
        let p = if k % 2 == 0 { 10.0 } else { 90.0 };
        decide(&s, &obs(&[p]), &mut h, t0 + Duration::from_secs(k * 10));
    }
    assert!(h.len() <= 10, "{}", h.len());
}

pub(super) fn removed(p: &Plan) -> Vec<&str> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::Remove { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn scale_down_order_newest_oldest_or_least_memory() {
    // 4 at 20, 5, 30, 10 % against 50 %: 65 / 50 -> 2 of 4 go (above max 2 to be quick).
    let o = obs(&[20.0, 5.0, 30.0, 10.0]);
    let mut s = spec(1, 2, 50.0);
    assert_eq!(removed(&run(&s, &o)), vec!["web-3", "web-2"]);
    s.scale_down_order = ScaleDownOrder::Oldest;
    assert_eq!(removed(&run(&s, &o)), vec!["web-0", "web-1"]);
    s.scale_down_order = ScaleDownOrder::LeastMemory;
    assert_eq!(removed(&run(&s, &o)), vec!["web-1", "web-3"]);
    // Unmeasured instances go last under least-memory; stopped ones always first.
    let mut o = obs(&[20.0, 5.0]);
    o.instances.push(unmeasured(InstanceStatus::Running, 2));
    o.instances.push(unmeasured(InstanceStatus::Stopped, 3));
    let s = ScaleDownOrder::LeastMemory;
    let p = run(
        &GroupSpec {
            scale_down_order: s,
            ..spec(1, 2, 50.0)
        },
        &o,
    );
    assert_eq!(removed(&p), vec!["web-3", "web-1"]);
}

#[test]
fn a_scale_down_takes_from_the_member_holding_the_most_of_the_group() {
    // Six instances at 10 %: three on m1, two on m2, one on m3; max 3 takes three away.
    let mut o = obs(&[10.0; 6]);
    for (i, m) in o
        .instances
        .iter_mut()
        .zip(["m1", "m1", "m1", "m2", "m2", "m3"])
    {
        i.location = m.into();
    }
    let s = spec(1, 3, 50.0);
    // Newest first within a member: web-2 (m1), then m1 and m2 tie at two: the newest of
    // them, web-4 (m2), then web-1 (m1). One is left on each member.
    assert_eq!(removed(&run(&s, &o)), vec!["web-2", "web-4", "web-1"]);
    // Oldest first: web-0 (m1), then m1 and m2 tie: web-1 (m1, the older), then web-3 (m2).
    let s = GroupSpec {
        scale_down_order: ScaleDownOrder::Oldest,
        ..spec(1, 3, 50.0)
    };
    assert_eq!(removed(&run(&s, &o)), vec!["web-0", "web-1", "web-3"]);
    // A stopped instance still goes first, wherever it is.
    o.instances[5].status = InstanceStatus::Stopped;
    o.instances[5].memory = None;
    let s = spec(1, 3, 50.0);
    assert_eq!(removed(&run(&s, &o))[0], "web-5");
}

#[test]
fn protected_instances_count_but_are_never_removed_and_the_decision_says_so() {
    let mut o = obs(&[10.0, 10.0, 10.0]);
    o.instances[2].protected = true;
    o.instances[1].protected = true;
    // Above max 1: two must go, only web-0 may.
    let p = run(&spec(1, 1, 50.0), &o);
    assert_eq!(p.current, 3, "protected instances count");
    assert_eq!(removed(&p), vec!["web-0"]);
    assert_eq!((p.reason, p.protected), (Reason::Protected, 1));
    // Nothing protected in the way: the usual reason.
    let p = run(&spec(1, 2, 50.0), &o);
    assert_eq!(removed(&p), vec!["web-0"]);
    assert_eq!((p.reason, p.protected), (Reason::AboveMax, 0));
    // Not even a crash-looping or long-unhealthy one is removed (it is replaced).
    let mut o = observation(vec![unmeasured(InstanceStatus::Error, 0)]);
    o.instances[0].protected = true;
    let s = GroupSpec {
        unhealthy_grace: Duration::ZERO,
        ..spec(1, 3, 50.0)
    };
    let (mut h, now) = settled(1);
    decide(&s, &o, &mut h, now);
    let p = decide(&s, &o, &mut h, now + Duration::from_secs(10));
    assert!(removed(&p).is_empty(), "{:?}", p.actions);
    assert!(p.actions.iter().any(|a| matches!(a, Action::Create { .. })));
}

#[test]
fn a_paused_group_is_decided_and_reported_but_nothing_is_done() {
    let s = GroupSpec {
        paused: true,
        ..spec(1, 5, 50.0)
    };
    let p = run(&s, &obs(&[90.0, 90.0]));
    assert_eq!(
        (p.desired, p.reason, p.paused),
        (4, Reason::AboveThreshold, true)
    );
    assert!(p.actions.is_empty());
    let mut o = obs(&[10.0]);
    o.instances.push(unmeasured(InstanceStatus::Stopped, 1));
    assert!(run(&s, &o).actions.is_empty(), "not even a restart");
}

#[test]
fn the_tolerance_band_includes_both_edges_exactly() {
    // (ratio − 1).abs() is 0.10000000000000009 at 55/50: Kubernetes keeps the count.
    for (p, threshold) in [
        (55.0, 50.0),
        (66.0, 60.0),
        (77.0, 70.0),
        (88.0, 80.0),
        (45.0, 50.0),
    ] {
        let plan = run(&spec(1, 10, threshold), &obs(&[p; 3]));
        assert_eq!(
            (plan.desired, plan.reason),
            (3, Reason::WithinTolerance),
            "{p} % against {threshold}"
        );
    }
    let plan = run(&spec(1, 10, 50.0), &obs(&[56.0; 3]));
    assert_eq!((plan.desired, plan.reason), (4, Reason::AboveThreshold));
}

#[test]
fn utilization_is_total_usage_over_total_limits() {
    // 90 of 100 MiB and 30 of 300 MiB: 120 of 400 MiB is 30 %, where the mean of the two
    // percentages (90 and 10) would say 50 % and ask for 4 at a 30 % target.
    let sized = |used: u64, limit: u64, created| ObservedInstance {
        location: String::new(),
        memory: Some(Memory {
            usage: used * MIB,
            limit: limit * MIB,
            oom_kills: None,
            ..Default::default()
        }),
        ..at(0.0, created)
    };
    let o = observation(vec![sized(90, 100, 1), sized(30, 300, 2)]);
    let plan = run(&spec(1, 10, 30.0), &o);
    assert!((plan.utilization.unwrap() - 30.0).abs() < 1e-9);
    assert_eq!((plan.desired, plan.reason), (2, Reason::WithinTolerance));
    // A reading above its limit counts at the limit.
    let over = observation(vec![sized(150, 100, 1), sized(0, 100, 2)]);
    assert!((run(&spec(1, 10, 50.0), &over).utilization.unwrap() - 50.0).abs() < 1e-9);
}

#[test]
fn without_a_scale_down_window_nothing_holds_a_scale_down_on_any_pass() {
    let s = GroupSpec {
        scale_down_stabilization: Duration::ZERO,
        ..spec(1, 10, 50.0)
    };
    let t0 = Instant::now();
    let mut h = History::default();
    let p = decide(&s, &obs(&[30.0; 4]), &mut h, t0);
    assert_eq!(p.desired, 3, "the first pass");
    let p = decide(&s, &obs(&[20.0; 3]), &mut h, t0 + Duration::from_secs(15));
    assert_eq!(p.desired, 2, "the second pass");
}

#[test]
fn kubernetes_scales_up_by_at_most_four_or_double_per_15_seconds() {
    let s = spec(1, 20, 10.0);
    let (mut h, t0) = settled(2);
    // 2 at 100 % of a 10 % target asks for 20: +4 (more than +100 %).
    let p = decide(&s, &obs(&[100.0; 2]), &mut h, t0);
    assert_eq!((p.recommendation, p.desired, p.step_limited), (20, 6, true));
    // Later passes within the same 15 s add nothing.
    let p = decide(&s, &obs(&[100.0; 6]), &mut h, t0 + Duration::from_secs(5));
    assert_eq!(p.desired, 6);
    // The next period: +100 % of 6.
    let p = decide(&s, &obs(&[100.0; 6]), &mut h, t0 + Duration::from_secs(16));
    assert_eq!(p.desired, 12);
    // An explicit max_scale_up_step replaces the default rate.
    let stepped = GroupSpec {
        max_scale_up_step: Some(1),
        ..s.clone()
    };
    let (mut h, t0) = settled(2);
    assert_eq!(decide(&stepped, &obs(&[100.0; 2]), &mut h, t0).desired, 3);
}
