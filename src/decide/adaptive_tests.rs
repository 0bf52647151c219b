//! The `adaptive` policy's rules, one test each: the base learned from fresh instances, the
//! count doubled at the limit, the trend carried ahead, the short scale-down window that turns
//! into the group's full one when the load comes back, and the guards it shares with
//! `kubernetes` (bounds, a missing metric never scales down).

use std::time::Duration;

use tokio::time::Instant;

use super::tests::{obs, settled, spec, unmeasured};
use super::*;
use crate::model::{InstanceStatus, Memory, ObservedInstance};

const MIB: u64 = 1 << 20;

fn adaptive(min: u32, max: u32, threshold: f64) -> GroupSpec {
    GroupSpec {
        policy: Policy::Adaptive,
        ..spec(min, max, threshold)
    }
}

/// An instance using `mib` of a 64 MiB limit, started `age` ago.
fn inst(n: i64, mib: u64, age: u64) -> ObservedInstance {
    ObservedInstance {
        location: String::new(),
        name: format!("web-{n}"),
        status: InstanceStatus::Running,
        created_at: n,
        since_start: Some(Duration::from_secs(age)),
        warm: false,
        protected: false,
        memory: Some(Memory {
            usage: mib * MIB,
            limit: 64 * MIB,
            oom_kills: None,
            ..Default::default()
        }),
    }
}

fn of(instances: Vec<ObservedInstance>) -> Observation {
    Observation {
        instances,
        foreign: vec![],
        ..Default::default()
    }
}

#[test]
fn at_the_limit_the_count_at_least_doubles_and_grows_by_four() {
    let s = adaptive(1, 20, 60.0);
    let (mut h, now) = settled(1);
    let p = decide(&s, &of(vec![inst(1, 64, 600)]), &mut h, now);
    // The ratio would say ceil(100 / 60) = 2; the demand behind a capped reading is unknown.
    assert_eq!((p.desired, p.reason), (5, Reason::AtLimit));
    let (mut h, now) = settled(6);
    let six: Vec<_> = (0..6).map(|i| inst(i, 63, 600)).collect();
    assert_eq!(decide(&s, &of(six), &mut h, now).desired, 12);
    // Kubernetes goes by the ratio, and its rate.
    let (mut h, now) = settled(1);
    let k8s = spec(1, 20, 60.0);
    assert_eq!(
        decide(&k8s, &of(vec![inst(1, 64, 600)]), &mut h, now).desired,
        2
    );
}

#[test]
fn the_base_is_learned_from_a_fresh_instance_that_has_no_load_yet() {
    let s = adaptive(1, 20, 60.0);
    let (mut h, now) = settled(4);
    // Three loaded at 36 MiB and one started 5 s ago at 4 MiB: the base is 4 MiB.
    let o = of(vec![
        inst(1, 36, 600),
        inst(2, 36, 600),
        inst(3, 36, 600),
        inst(4, 4, 5),
    ]);
    let p = decide(&s, &o, &mut h, now);
    assert_eq!(h.estimates.base(), 4 * MIB);
    // Demand 3 × 32 = 96 MiB over 34.4 MiB per instance at 60 % of 64 MiB less the base.
    assert_eq!(p.recommendation, 3);
    // A fresh instance that already carries its share is not a base reading.
    let (mut h, now) = settled(4);
    let o = of(vec![
        inst(1, 36, 600),
        inst(2, 36, 600),
        inst(3, 36, 600),
        inst(4, 30, 5),
    ]);
    decide(&s, &o, &mut h, now);
    assert_eq!(h.estimates.base(), 0);
}

#[test]
fn growing_demand_is_met_one_interval_ahead() {
    let s = adaptive(1, 20, 60.0);
    let (mut h, t0) = settled(4);
    // 4 instances, each 5 MiB more every 15 s: the demand grows by 20 MiB per interval.
    let mut last = 0;
    for (k, mib) in [20u64, 25, 30, 35].into_iter().enumerate() {
        let o = of((0..4).map(|i| inst(i, mib, 600)).collect());
        last = decide(&s, &o, &mut h, t0 + Duration::from_secs(15 * k as u64)).recommendation;
    }
    // Now 140 MiB (4 at 35) fits in 4 at 38.4 MiB each; 160 MiB, an interval later, does not.
    assert_eq!(last, 5);
    // The same readings without growth: 4.
    let (mut h, now) = settled(4);
    let o = of((0..4).map(|i| inst(i, 35, 600)).collect());
    assert_eq!(decide(&s, &o, &mut h, now).recommendation, 4);
}

#[test]
fn a_drop_is_let_go_of_after_a_minute_unless_the_load_came_back_before() {
    let s = adaptive(1, 20, 50.0);
    let t0 = Instant::now();
    let (mut h, _) = settled(4);
    let busy = obs(&[50.0; 4]);
    let idle = obs(&[5.0; 4]);
    let at = |s: u64| t0 + Duration::from_secs(s);
    assert_eq!(decide(&s, &busy, &mut h, at(0)).desired, 4);
    assert_eq!(
        decide(&s, &idle, &mut h, at(30)).desired,
        4,
        "within a minute"
    );
    assert_eq!(
        decide(&s, &idle, &mut h, at(61)).desired,
        1,
        "after a minute"
    );
    // The load comes back: it oscillates, and the next drop waits the full window (300 s).
    assert_eq!(decide(&s, &obs(&[100.0]), &mut h, at(90)).desired, 5);
    let four = obs(&[10.0; 5]);
    assert_eq!(decide(&s, &four, &mut h, at(200)).desired, 5);
    assert_eq!(decide(&s, &four, &mut h, at(389)).desired, 5);
    assert_eq!(decide(&s, &four, &mut h, at(391)).desired, 1);
}

#[test]
fn a_missing_metric_never_scales_down_and_bounds_come_first() {
    let s = adaptive(1, 5, 50.0);
    let (mut h, now) = settled(3);
    let mut o = obs(&[5.0, 5.0]);
    o.instances.push(unmeasured(InstanceStatus::Running, 9));
    assert_eq!(decide(&s, &o, &mut h, now).reason, Reason::MetricsMissing);
    let (mut h, now) = settled(7);
    let p = decide(&s, &obs(&[99.0; 7]), &mut h, now);
    assert_eq!((p.desired, p.reason), (5, Reason::AboveMax));
}

#[test]
fn an_oom_kill_since_the_last_pass_counts_as_the_limit() {
    let s = adaptive(1, 20, 60.0);
    let t0 = Instant::now();
    let (mut h, _) = settled(2);
    let with_kills = |k: u64| {
        of((0..2)
            .map(|i| ObservedInstance {
                location: String::new(),
                memory: Some(Memory {
                    oom_kills: Some(k),
                    ..inst(i, 20, 600).memory.unwrap()
                }),
                ..inst(i, 20, 600)
            })
            .collect())
    };
    // 20 of 64 MiB is well under 60 %: a count seen for the first time says nothing.
    let p = decide(&s, &with_kills(3), &mut h, t0);
    assert_eq!(p.desired, 2);
    // The kernel killed in both since: the memory the kill freed does not hide the demand.
    let p = decide(&s, &with_kills(4), &mut h, t0 + Duration::from_secs(15));
    assert_eq!((p.desired, p.reason), (6, Reason::AtLimit));
}
