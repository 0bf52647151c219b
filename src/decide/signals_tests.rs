//! Each signal's rule on tables of readings, and how the group combines them, under a paused
//! clock.

use std::time::Duration;

use tokio::time::Instant;

use super::super::tests::{at, spec};
use super::*;
use crate::decide::{decide, History};
use crate::model::{ExternalSpec, Observation, Window};

/// A group with CPU (limit 1 CPU, threshold 50 %) and no memory signal.
fn cpu_group(min: u32, max: u32) -> GroupSpec {
    GroupSpec {
        memory_threshold: None,
        cpu_threshold: Some(50.0),
        cpu_limit: Some(1.0),
        ..spec(min, max, 50.0)
    }
}

/// `n` instances whose CPU counters stand at `ns`.
fn with_cpu(n: usize, ns: u64) -> Observation {
    Observation {
        instances: (0..n)
            .map(|k| {
                let mut i = at(10.0, k as i64);
                if let Some(m) = &mut i.memory {
                    m.cpu_ns = Some(ns);
                }
                i
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn cpu_counts_from_the_second_reading_and_follows_the_kubernetes_rule() {
    let s = cpu_group(1, 10);
    let mut h = History::default();
    let t0 = Instant::now();
    // First pass: no rate yet, the count is held.
    let p = decide(&s, &with_cpu(2, 0), &mut h, t0);
    assert_eq!((p.desired, p.reason), (2, Reason::NoMetrics));
    assert_eq!(p.signals[0].wants, None);
    // 10 s later each instance used 9 s of CPU: 90 % of one CPU, threshold 50 %:
    // ceil(2 × 90 / 50) = 4.
    let t1 = t0 + Duration::from_secs(10);
    let p = decide(&s, &with_cpu(2, 9_000_000_000), &mut h, t1);
    assert_eq!((p.desired, p.reason), (4, Reason::CpuAboveThreshold));
    let cpu = &p.signals[0];
    assert_eq!(cpu.name, "cpu");
    assert!((cpu.value.unwrap() - 90.0).abs() < 1e-6, "{cpu:?}");
}

#[tokio::test(start_paused = true)]
async fn a_cpu_counter_that_went_back_is_a_missing_reading() {
    let s = cpu_group(1, 10);
    let mut h = History::default();
    let t0 = Instant::now();
    decide(&s, &with_cpu(2, 50_000_000_000), &mut h, t0);
    let p = decide(
        &s,
        &with_cpu(2, 1_000),
        &mut h,
        t0 + Duration::from_secs(10),
    );
    assert_eq!((p.desired, p.reason), (2, Reason::NoMetrics));
}

#[test]
fn the_cpu_rule_holds_within_each_directions_tolerance() {
    let s = GroupSpec {
        tolerance_up: 0.2,
        tolerance_down: 0.05,
        ..cpu_group(1, 10)
    };
    // (rates, base) → (wants, reason)
    let cases: &[(&[f64], u32, u32, Reason)] = &[
        (&[59.0, 59.0], 2, 2, Reason::WithinTolerance), // +18 %: inside the band up
        (&[61.0, 61.0], 2, 3, Reason::CpuAboveThreshold), // +22 %
        (&[48.0, 48.0], 2, 2, Reason::WithinTolerance), // −4 %
        (&[20.0, 20.0], 2, 1, Reason::CpuBelowThreshold),
    ];
    for (rates, base, wants, reason) in cases {
        let rates: Vec<Option<f64>> = rates.iter().map(|r| Some(*r)).collect();
        let v = cpu(&s, *base, &rates, 0).unwrap();
        assert_eq!(
            (v.state.wants, v.reason),
            (Some(*wants), *reason),
            "{rates:?}"
        );
    }
}

#[test]
fn an_instance_without_a_cpu_rate_never_lets_cpu_lower_the_count() {
    let s = cpu_group(1, 10);
    let v = cpu(&s, 3, &[Some(10.0), None, Some(10.0)], 0).unwrap();
    assert_eq!((v.state.wants, v.reason), (Some(3), Reason::MetricsMissing));
    // Going up, the unmeasured one counts as 0 %: 2 × 90 % over 3 instances is still above.
    let v = cpu(&s, 3, &[Some(90.0), None, Some(90.0)], 0).unwrap();
    assert_eq!(
        (v.state.wants, v.reason),
        (Some(4), Reason::CpuAboveThreshold)
    );
}

fn pressured(values: &[Option<f64>]) -> Vec<ObservedInstance> {
    values
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let mut i = at(10.0, k as i64);
            if let Some(m) = &mut i.memory {
                m.pressure = *p;
            }
            i
        })
        .collect()
}

#[test]
fn pressure_grows_in_proportion_holds_in_between_and_lets_go_below_half() {
    let s = GroupSpec {
        memory_threshold: None,
        pressure_threshold: Some(20.0),
        ..spec(1, 10, 50.0)
    };
    // (pressures, base) → (wants, reason)
    let cases: &[(&[Option<f64>], u32, u32, Reason)] = &[
        (
            &[Some(40.0), Some(40.0)],
            2,
            4,
            Reason::PressureAboveThreshold,
        ),
        (&[Some(15.0), Some(15.0)], 2, 2, Reason::WithinTolerance),
        (&[Some(10.0), Some(10.0)], 2, 2, Reason::WithinTolerance),
        (
            &[Some(2.0), Some(2.0)],
            2,
            0,
            Reason::PressureBelowThreshold,
        ),
        // A missing reading: below half holds instead of letting go.
        (&[Some(2.0), None], 2, 2, Reason::MetricsMissing),
        // …but high pressure on the one measured still grows the group.
        (&[Some(60.0), None], 2, 6, Reason::PressureAboveThreshold),
    ];
    for (values, base, wants, reason) in cases {
        let instances = pressured(values);
        let readings: Vec<(&ObservedInstance, Memory)> =
            instances.iter().map(|i| (i, i.memory.unwrap())).collect();
        let v = pressure(&s, *base, &readings, 0).unwrap();
        assert_eq!(
            (v.state.wants, v.reason),
            (Some(*wants), *reason),
            "{values:?}"
        );
    }
}

#[test]
fn an_external_value_wants_its_quotient_with_the_tolerance_band() {
    let s = GroupSpec {
        external: vec![ExternalSpec {
            command: vec!["/bin/true".into()],
            target: 20.0,
            timeout: Duration::from_secs(5),
        }],
        ..spec(1, 10, 50.0)
    };
    let cases: &[(Option<f64>, u32, Option<u32>, Reason)] = &[
        (Some(130.0), 2, Some(7), Reason::ExternalAboveTarget),
        (Some(41.0), 2, Some(2), Reason::WithinTolerance),
        (Some(10.0), 2, Some(1), Reason::ExternalBelowTarget),
        (Some(0.0), 2, Some(0), Reason::ExternalBelowTarget),
        (None, 2, None, Reason::NoMetrics),
    ];
    for (value, base, wants, reason) in cases {
        let v = &external(&s, *base, &[*value])[0];
        assert_eq!((v.state.wants, v.reason), (*wants, *reason), "{value:?}");
        assert_eq!(v.state.name, "external 1");
    }
}

fn voted(wants: Option<u32>, reason: Reason, missing: bool) -> Vote {
    Vote {
        state: SignalState {
            name: "x".into(),
            value: None,
            target: 1.0,
            wants,
        },
        reason,
        missing,
    }
}

#[test]
fn the_group_takes_the_highest_wish_and_a_missing_reading_never_lowers_it() {
    use Reason::*;
    type Case<'a> = (&'a [(Option<u32>, Reason, bool)], u32, (u32, Reason));
    let cases: &[Case] = &[
        // The highest wins, with its reason.
        (
            &[
                (Some(2), BelowThreshold, false),
                (Some(5), CpuAboveThreshold, false),
            ],
            3,
            (5, CpuAboveThreshold),
        ),
        // All lower: the highest of them.
        (
            &[
                (Some(2), BelowThreshold, false),
                (Some(1), CpuBelowThreshold, false),
            ],
            3,
            (2, BelowThreshold),
        ),
        // A signal without a reading holds the count.
        (
            &[(Some(1), BelowThreshold, false), (None, NoMetrics, true)],
            3,
            (3, MetricsMissing),
        ),
        // …but does not stop another from raising it.
        (
            &[
                (Some(6), ExternalAboveTarget, false),
                (None, NoMetrics, true),
            ],
            3,
            (6, ExternalAboveTarget),
        ),
        // No reading at all: the count is kept.
        (&[(None, NoMetrics, true)], 3, (3, NoMetrics)),
    ];
    for (votes, base, expected) in cases {
        let votes: Vec<Vote> = votes.iter().map(|(w, r, m)| voted(*w, *r, *m)).collect();
        assert_eq!(combine(&votes, *base), *expected, "{votes:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_open_window_raises_min_and_closes_back_to_the_normal_rules() {
    let s = spec(1, 5, 50.0);
    let mut h = History::default();
    let t0 = Instant::now();
    let idle = Observation {
        instances: vec![at(10.0, 1)],
        window: Some(Window {
            min: Some(4),
            max: None,
        }),
        ..Default::default()
    };
    let p = decide(&s, &idle, &mut h, t0);
    assert_eq!((p.desired, p.reason), (4, Reason::ScheduleMin));
    assert_eq!(p.actions.len(), 3);
    // A window whose min is above the group's max raises the max with it.
    let p = decide(
        &s,
        &Observation {
            window: Some(Window {
                min: Some(8),
                max: None,
            }),
            ..idle.clone()
        },
        &mut History::default(),
        t0,
    );
    assert_eq!(p.desired, 8);
    // Closed: the count is held by the scale-down window, not dropped at once.
    let four = Observation {
        instances: (1..=4).map(|k| at(10.0, k)).collect(),
        ..Default::default()
    };
    let p = decide(&s, &four, &mut h, t0 + Duration::from_secs(15));
    assert_eq!((p.desired, p.reason), (4, Reason::Stabilizing));
}

#[tokio::test(start_paused = true)]
async fn a_window_max_lowers_the_count_at_once() {
    let s = spec(1, 10, 50.0);
    let obs = Observation {
        instances: (1..=6).map(|k| at(50.0, k)).collect(),
        window: Some(Window {
            min: None,
            max: Some(3),
        }),
        ..Default::default()
    };
    let p = decide(&s, &obs, &mut History::default(), Instant::now());
    assert_eq!((p.desired, p.reason), (3, Reason::ScheduleMax));
}
