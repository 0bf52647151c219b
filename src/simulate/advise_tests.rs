//! Advice on synthetic histories finds the size they were built for, and never one under which
//! the group would have been at its limit or overloaded longer.

use std::time::Duration;

use super::*;
use crate::decide::tests::spec;

fn model(limit_mib: f64) -> LoadModel {
    LoadModel {
        limit_mib,
        base_mib: 4.0,
        warmup: Duration::from_secs(2),
    }
}

/// Six hours of passes every 15 s of `count` instances using `each` MiB each (base included),
/// and `spike` MiB each for a minute every hour.
fn history(count: u32, each: f64, spike: f64) -> Vec<Record> {
    (0..6 * 240)
        .map(|k| {
            let use_each = if k % 240 < 4 { spike } else { each };
            Record {
                limit_mib: Some(128.0),
                ..Record::sample(
                    1_800_000_000_000 + k * 15_000,
                    count,
                    Some(use_each * f64::from(count)),
                )
            }
        })
        .collect()
}

fn clock() -> Clock {
    Clock::without_windows(crate::simulate::start())
}

#[test]
fn a_steady_load_is_advised_the_size_it_fits() {
    // Two instances of 128 MiB at 60 %, each using 57 MiB (4 of base): 96 MiB holds each at
    // 59 %, two of them 192 MiB in all, where 64 or 80 would need a third and 112 or more
    // reserve more.
    let s = spec(2, 10, 60.0);
    let advice = advise(&s, &history(2, 57.0, 57.0), &model(128.0), &clock()).unwrap();
    assert_eq!(advice.current.limit_mib, 128.0);
    assert_eq!(advice.advised.limit_mib, 96.0, "{advice:#?}");
    assert_eq!((advice.advised.fewest, advice.advised.most), (2, 2));
    assert!(advice.advised.memory_gib_hours < advice.current.memory_gib_hours);
    assert_eq!(advice.candidates.first().map(|c| c.limit_mib), Some(64.0));
    assert!((advice.hours - 6.0).abs() < 0.01, "{}", advice.hours);
}

#[test]
fn no_size_is_advised_under_which_the_group_would_have_suffered_longer() {
    // Spikes that the group's own size absorbs: a smaller one would be at its limit.
    let s = spec(2, 10, 60.0);
    let advice = advise(&s, &history(2, 40.0, 110.0), &model(128.0), &clock()).unwrap();
    assert!(advice.advised.oom_s <= advice.current.oom_s);
    assert!(advice.advised.overload_s <= advice.current.overload_s);
    for c in &advice.candidates {
        if c.memory_gib_hours < advice.advised.memory_gib_hours {
            assert!(
                c.oom_s > advice.current.oom_s || c.overload_s > advice.current.overload_s,
                "{c:?} reserved less and suffered no longer: it should have been advised"
            );
        }
    }
}

#[test]
fn a_group_not_scaled_on_memory_gets_no_advice() {
    let s = crate::model::GroupSpec {
        memory_threshold: None,
        cpu_threshold: Some(50.0),
        ..spec(1, 10, 60.0)
    };
    assert!(advise(&s, &history(2, 40.0, 40.0), &model(128.0), &clock()).is_err());
}
