//! Table tests for the decision core, with the Kubernetes HPA reference cases and the edges.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::model::{GroupName, Memory, ObservedInstance};

const MIB: u64 = 1 << 20;

fn spec(min: u32, max: u32, threshold: f64) -> GroupSpec {
    GroupSpec {
        name: GroupName::parse("web").unwrap(),
        min,
        max,
        memory_threshold: threshold,
        tolerance: 0.1,
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
    }
}

/// One running instance at `percent` of a 100 MiB limit, created at `created`.
fn at(percent: f64, created: i64) -> ObservedInstance {
    ObservedInstance {
        name: format!("web-{created}"),
        status: InstanceStatus::Running,
        created_at: created,
        memory: Some(Memory {
            usage: (percent * MIB as f64) as u64,
            limit: 100 * MIB,
        }),
    }
}

fn unmeasured(status: InstanceStatus, created: i64) -> ObservedInstance {
    ObservedInstance {
        name: format!("web-{created}"),
        status,
        created_at: created,
        memory: None,
    }
}

fn obs(percents: &[f64]) -> Observation {
    Observation {
        instances: percents
            .iter()
            .enumerate()
            .map(|(i, p)| at(*p, i as i64))
            .collect(),
    }
}

/// A history that already saw `rec` long ago (outside every window): no stabilization effect.
fn settled() -> (History, Instant) {
    let t0 = Instant::now();
    let mut h = History::default();
    let p = Plan {
        current: 0,
        desired: 0,
        utilization: None,
        recommendation: 0,
        reason: Reason::NoMetrics,
        step_limited: false,
        actions: vec![],
    };
    h.record(t0, &p, Duration::from_secs(3600));
    (h, t0 + Duration::from_secs(1000))
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
        memory: Some(Memory {
            usage: (p * 1e7) as u64,
            limit: 1_000_000_000,
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
            obs: Observation {
                instances: vec![limitless(80.0), limitless(80.0)],
            },
            desired: 4,
            reason: Reason::AboveThreshold,
        },
        Case {
            name: "a missing metric never scales down",
            spec: spec(1, 5, 50.0),
            obs: Observation {
                instances: vec![
                    at(5.0, 1),
                    at(5.0, 2),
                    unmeasured(InstanceStatus::Running, 3),
                ],
            },
            desired: 3,
            reason: Reason::MetricsMissing,
        },
        Case {
            name: "missing metrics count as 0 % on the way up: 30/50/70 + one unmeasured, target 30 -> 5",
            spec: spec(1, 10, 30.0),
            obs: Observation {
                instances: vec![
                    at(30.0, 1),
                    at(50.0, 2),
                    at(70.0, 3),
                    unmeasured(InstanceStatus::Running, 4),
                ],
            },
            desired: 5,
            reason: Reason::AboveThreshold,
        },
        Case {
            name: "missing counted as 0 lands within tolerance -> keep",
            spec: spec(1, 10, 50.0),
            obs: Observation {
                instances: vec![at(60.0, 1), at(50.0, 2), unmeasured(InstanceStatus::Other, 3)],
            },
            desired: 3,
            reason: Reason::MetricsMissing,
        },
        Case {
            name: "every metric missing -> keep",
            spec: spec(1, 5, 50.0),
            obs: Observation {
                instances: vec![
                    unmeasured(InstanceStatus::Running, 1),
                    unmeasured(InstanceStatus::Running, 2),
                ],
            },
            desired: 2,
            reason: Reason::NoMetrics,
        },
        Case {
            name: "zero limit is a missing metric",
            spec: spec(1, 5, 50.0),
            obs: Observation {
                instances: vec![ObservedInstance {
                    memory: Some(Memory { usage: 5, limit: 0 }),
                    ..at(0.0, 1)
                }],
            },
            desired: 1,
            reason: Reason::NoMetrics,
        },
    ];
    for c in cases {
        let (h, now) = settled();
        let plan = decide(&c.spec, &c.obs, &h, now);
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
    let (h, now) = settled();
    let plan = decide(&spec(1, 10, 30.0), &obs(&[30.0, 50.0, 70.0]), &h, now);
    assert!((plan.utilization.unwrap() - 50.0).abs() < 1e-6);
    assert_eq!(plan.current, 3);
    assert_eq!(plan.actions, vec![Action::Create, Action::Create]);
}

#[test]
fn scale_down_waits_for_the_stabilization_window() {
    let s = spec(1, 10, 50.0);
    let t0 = Instant::now();
    let mut h = History::default();
    // Busy: 4 instances at 50 % -> keep 4.
    let p = decide(&s, &obs(&[50.0; 4]), &h, t0);
    assert_eq!(p.desired, 4);
    h.record(t0, &p, s.scale_down_stabilization);
    // Load gone: recommendation 1, held at 4 during the window.
    for secs in [15, 150, 299] {
        let now = t0 + Duration::from_secs(secs);
        let p = decide(&s, &obs(&[5.0; 4]), &h, now);
        assert_eq!(
            (p.desired, p.reason),
            (4, Reason::Stabilizing),
            "at {secs}s"
        );
        assert_eq!(p.recommendation, 1);
        assert!(p.actions.is_empty());
        h.record(now, &p, s.scale_down_stabilization);
    }
    // Once the busy recommendation has left the window, scale down to the highest left (1).
    let now = t0 + Duration::from_secs(301);
    let p = decide(&s, &obs(&[5.0; 4]), &h, now);
    assert_eq!((p.desired, p.reason), (1, Reason::BelowThreshold));
}

#[test]
fn a_fresh_history_is_seeded_with_the_current_count() {
    let s = spec(1, 10, 50.0);
    let t0 = Instant::now();
    let mut h = History::default();
    let p = decide(&s, &obs(&[1.0; 3]), &h, t0);
    assert_eq!((p.desired, p.reason), (3, Reason::Stabilizing));
    h.record(t0, &p, s.scale_down_stabilization);
    let p = decide(&s, &obs(&[1.0; 3]), &h, t0 + Duration::from_secs(10));
    assert_eq!(p.desired, 3, "no scale-down right after a restart");
    let p = decide(&s, &obs(&[1.0; 3]), &h, t0 + Duration::from_secs(301));
    assert_eq!(p.desired, 1);
}

#[test]
fn scale_up_is_immediate_by_default_and_can_be_stabilized() {
    let mut s = spec(1, 10, 50.0);
    let t0 = Instant::now();
    let h = History::default();
    assert_eq!(decide(&s, &obs(&[100.0; 2]), &h, t0).desired, 4);

    s.scale_up_stabilization = Duration::from_secs(60);
    let mut h = History::default();
    let p = decide(&s, &obs(&[50.0; 2]), &h, t0);
    h.record(t0, &p, Duration::from_secs(300));
    let now = t0 + Duration::from_secs(30);
    let p = decide(&s, &obs(&[100.0; 2]), &h, now);
    assert_eq!((p.desired, p.reason), (2, Reason::StabilizingUp));
}

#[test]
fn removal_takes_stopped_first_then_the_newest() {
    let s = spec(1, 2, 50.0);
    let mut o = obs(&[10.0, 10.0, 10.0]);
    o.instances.push(unmeasured(InstanceStatus::Stopped, 0));
    o.instances[3].name = "web-stopped".into();
    let (h, now) = settled();
    let p = decide(&s, &o, &h, now);
    assert_eq!(p.reason, Reason::AboveMax);
    assert_eq!(
        p.actions,
        vec![
            Action::Remove {
                name: "web-stopped".into()
            },
            Action::Remove {
                name: "web-2".into()
            },
        ]
    );
}

#[test]
fn stopped_instances_are_started_again() {
    let s = spec(2, 5, 50.0);
    let o = Observation {
        instances: vec![at(50.0, 1), unmeasured(InstanceStatus::Stopped, 2)],
    };
    let (h, now) = settled();
    let p = decide(&s, &o, &h, now);
    assert_eq!(p.desired, 2);
    assert_eq!(
        p.actions,
        vec![Action::Start {
            name: "web-2".into()
        }]
    );
}

#[test]
fn history_forgets_old_entries() {
    let t0 = Instant::now();
    let mut h = History::default();
    let p = decide(&spec(1, 5, 50.0), &obs(&[50.0]), &h, t0);
    for s in 0..100 {
        h.record(
            t0 + Duration::from_secs(s * 10),
            &p,
            Duration::from_secs(60),
        );
    }
    assert!(h.entries.len() <= 8);
}

#[test]
fn step_limits_cut_metric_driven_changes_only() {
    let mut s = spec(1, 10, 50.0);
    s.max_scale_up_step = Some(2);
    s.max_scale_down_step = Some(1);
    let (h, now) = settled();
    // 2 at 100 % of a 50 % target -> 4, cut to 2 + 2.
    let p = decide(&s, &obs(&[100.0, 100.0]), &h, now);
    assert_eq!((p.desired, p.step_limited), (4, false));
    let p = decide(&s, &obs(&[100.0; 3]), &h, now);
    assert_eq!((p.desired, p.recommendation, p.step_limited), (5, 6, true));
    // 6 nearly idle -> 1, cut to 6 - 1.
    let p = decide(&s, &obs(&[1.0; 6]), &h, now);
    assert_eq!((p.desired, p.step_limited), (5, true));
    assert_eq!(p.actions.len(), 1);
    // Bounds are restored in one pass whatever the limits.
    let p = decide(&spec_with_steps(3, 10), &Observation::default(), &h, now);
    assert_eq!((p.desired, p.step_limited), (3, false));
    let p = decide(&spec_with_steps(1, 2), &obs(&[1.0; 6]), &h, now);
    assert_eq!((p.desired, p.step_limited), (2, false));
}

fn spec_with_steps(min: u32, max: u32) -> GroupSpec {
    GroupSpec {
        max_scale_up_step: Some(1),
        max_scale_down_step: Some(1),
        ..spec(min, max, 50.0)
    }
}
