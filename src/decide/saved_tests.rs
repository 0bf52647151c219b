//! A saved history read back decides as the one that was saved: over generated traces of every
//! family, a run restarted every few minutes (its history saved, written as JSON, read back)
//! gives the same count every second as the run that never stopped.

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::decide::tests::spec;
use crate::decide::History;
use crate::model::GroupSpec;
use crate::simulate::generate::Family;
use crate::simulate::{families, simulate_between, Clock, LoadModel, SimPolicy, Trace};

const MODEL: LoadModel = LoadModel {
    limit_mib: 64.0,
    base_mib: 4.0,
    warmup: Duration::from_secs(2),
};

/// `h` written out at `now` and read back `gone` later.
fn restarted(s: &GroupSpec, h: &History, now: Instant, gone: Duration) -> History {
    let json = serde_json::to_string(&h.save(now)).unwrap();
    let saved: Saved = serde_json::from_str(&json).unwrap();
    assert_eq!(saved, h.save(now), "the JSON gives back what was saved");
    History::resume(s, &saved, gone, now + gone)
}

#[test]
fn a_restart_mid_trace_decides_as_no_restart() {
    let s = GroupSpec {
        interval: Duration::from_secs(5),
        policy: crate::model::Policy::Adaptive,
        ..spec(1, 12, 60.0)
    };
    let clock = Clock::without_windows(crate::simulate::start());
    let mut restarts = 0;
    for family in Family::ALL {
        for seed in 1..=1 {
            let trace = Trace::from_demand(&families::trace(&s, &MODEL, family, seed).unwrap());
            let run = |every: Option<u64>, restarts: &mut u32| {
                simulate_between(
                    &s,
                    &trace,
                    &MODEL,
                    SimPolicy::Default,
                    &clock,
                    &mut |t, h, now| {
                        if every.is_some_and(|e| t > 0 && t % e == 0) {
                            *h = restarted(&s, h, now, Duration::ZERO);
                            *restarts += 1;
                        }
                    },
                )
            };
            let steady = run(None, &mut restarts);
            let again = run(Some(235), &mut restarts);
            assert_eq!(
                steady.timeline,
                again.timeline,
                "{} seed {seed}: a restart changed a decision",
                family.name()
            );
            assert_eq!(steady.scores, again.scores);
        }
    }
    assert!(restarts > 50, "{restarts} restarts");
}

/// Two passes' worth of history: a recommendation, a change, a demand sample.
fn lived(s: &GroupSpec, t0: Instant) -> History {
    let mut h = History::default();
    h.record(s, t0, 2, 3, 3);
    h.record(s, t0 + Duration::from_secs(15), 3, 4, 4);
    h.estimates
        .past
        .push_back((t0 + Duration::from_secs(15), 1e8));
    h
}

#[test]
fn times_are_read_back_on_the_readers_clock() {
    let s = spec(1, 10, 60.0);
    let t0 = Instant::now();
    let h = lived(&s, t0);
    let saved_at = t0 + Duration::from_secs(20);
    let later = restarted(&s, &h, saved_at, Duration::from_secs(60));
    // 5 s before the save, read 60 s after it: 65 s before the reader's now.
    let now = saved_at + Duration::from_secs(60);
    assert_eq!(
        later
            .estimates
            .past
            .back()
            .map(|(t, _)| now.duration_since(*t)),
        Some(Duration::from_secs(65))
    );
    assert_eq!(later.desired(), Some(4));
    assert_eq!(later.recommendations.len(), 3);
}

#[test]
fn a_history_older_than_the_scale_down_window_keeps_what_was_learned_not_the_count() {
    let s = spec(1, 10, 60.0);
    let t0 = Instant::now();
    let h = lived(&s, t0);
    let saved_at = t0 + Duration::from_secs(20);
    let later = restarted(&s, &h, saved_at, Duration::from_secs(301));
    assert_eq!(later.desired(), None);
    assert!(later.is_fresh());
    assert_eq!(later.estimates.past.len(), 1);
}

#[test]
fn a_deadline_after_the_save_stays_after_it() {
    let t0 = Instant::now();
    let at_later = t0 + Duration::from_secs(30);
    assert_eq!(ago(t0, at_later), -30_000_000_000);
    assert_eq!(
        at(t0, Duration::from_secs(10), -30_000_000_000),
        Some(t0 + Duration::from_secs(20))
    );
}

#[test]
fn a_summary_is_bounded_and_never_holds_less_than_the_whole() {
    // 1,000 recommendations over 1,000 s, one high in the middle, and 1,000 demand samples.
    let recs: Vec<(Ago, u32)> = (0..1000i64)
        .map(|k| {
            (
                (1000 - k) * 1_000_000_000,
                if k == 500 { 9 } else { 2 + (k % 3) as u32 },
            )
        })
        .collect();
    let mut saved = History::default().save(Instant::now());
    saved.recommendations = recs.clone();
    saved.estimates.past = recs
        .iter()
        .map(|(a, r)| (*a, f64::from(*r) * 10.0))
        .collect();
    let summary = saved.summary(32);
    assert!(summary.recommendations.len() <= 32);
    assert!(summary.estimates.past.len() <= 32);
    assert!(summary.instances.is_empty() && summary.cpu.is_empty());
    // For every window ending now, the highest the summary holds is at least the whole's.
    for back in (0..=1000i64).step_by(7) {
        let within = |v: &[(Ago, u32)]| {
            v.iter()
                .filter(|(a, _)| *a <= back * 1_000_000_000)
                .map(|(_, r)| *r)
                .max()
        };
        assert!(
            within(&summary.recommendations) >= within(&recs),
            "window of {back} s"
        );
    }
    assert_eq!(
        summary.recommendations.iter().map(|(_, r)| *r).max(),
        Some(9)
    );
    // Short series are kept whole.
    let short = History::default().save(Instant::now());
    assert_eq!(short.summary(32), short);
}

#[test]
fn a_history_of_an_earlier_daemon_with_room_for_surges_is_read_and_its_fields_still_written() {
    let s = spec(1, 10, 60.0);
    let t0 = Instant::now();
    let saved_at = t0 + Duration::from_secs(20);
    let h = lived(&s, t0);
    let mut json: serde_json::Value = serde_json::to_value(h.save(saved_at)).unwrap();
    // Written: the fields an earlier daemon reads, empty.
    let e = &json["estimates"];
    assert_eq!(
        (&e["surges"], &e["returns"], &e["room"]),
        (
            &serde_json::json!([]),
            &serde_json::json!([]),
            &serde_json::Value::Null
        )
    );
    // Read: what an earlier daemon kept room for is left aside; the rest is taken back.
    json["estimates"]["surges"] = serde_json::json!([[5_000_000_000_i64, 6.0e7]]);
    json["estimates"]["returns"] = serde_json::json!([[5_000_000_000_i64, 6.0e7]]);
    json["estimates"]["room"] = serde_json::json!(57.2);
    let earlier: Saved = serde_json::from_value(json).unwrap();
    let later = History::resume(&s, &earlier, Duration::ZERO, saved_at);
    assert_eq!(later.save(saved_at), h.save(saved_at));
    // And a history written without them (as a later daemon may) is read too.
    let mut json: serde_json::Value = serde_json::to_value(h.save(saved_at)).unwrap();
    for key in ["surges", "returns", "room"] {
        json["estimates"].as_object_mut().unwrap().remove(key);
    }
    let without: Saved = serde_json::from_value(json).unwrap();
    assert_eq!(without, h.save(saved_at));
}
