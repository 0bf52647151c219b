//! The generator: stable names, the same trace for the same seed, 1–6 hours within the peak,
//! the shapes each family promises, and CSV that reads back as the same trace.

use std::path::Path;

use super::*;
use crate::simulate::Trace;

const PEAK: f64 = 344.0;

#[test]
fn names_are_stable_and_read_back() {
    let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
    assert_eq!(
        names,
        [
            "steps",
            "spikes",
            "ramps",
            "sawtooth-up",
            "sawtooth-down",
            "sines",
            "noise",
            "daily",
            "bursts",
            "sums"
        ]
    );
    for f in Family::ALL {
        assert_eq!(Family::named(f.name()), Some(f));
    }
    assert_eq!(Family::named("all"), None);
}

#[test]
fn a_seed_always_gives_the_same_trace_and_seeds_differ() {
    for f in Family::ALL {
        let a = demand(f, 7, PEAK);
        assert_eq!(a, demand(f, 7, PEAK), "{}", f.name());
        assert_ne!(a, demand(f, 8, PEAK), "{}", f.name());
        assert!(
            (3600..=6 * 3600).contains(&a.len()),
            "{}: {}",
            f.name(),
            a.len()
        );
        assert!(
            a.iter().all(|d| (0.0..=PEAK).contains(d)),
            "{}: outside 0..={PEAK}",
            f.name()
        );
        // Every shape moves.
        let (lo, hi) = a
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), d| (lo.min(*d), hi.max(*d)));
        assert!(hi - lo > 0.05 * PEAK, "{}: {lo}..{hi}", f.name());
    }
}

#[test]
fn a_sawtooth_rises_slowly_and_drops_at_once_and_the_reverse() {
    let jumps = |d: &[f64]| {
        let ups = d.windows(2).filter(|w| w[1] - w[0] > 0.1 * PEAK).count();
        let downs = d.windows(2).filter(|w| w[0] - w[1] > 0.1 * PEAK).count();
        (ups, downs)
    };
    let (ups, downs) = jumps(&demand(Family::SawtoothUp, 1, PEAK));
    assert!(ups == 0 && downs >= 1, "{ups} {downs}");
    let (ups, downs) = jumps(&demand(Family::SawtoothDown, 1, PEAK));
    assert!(downs == 0 && ups >= 1, "{ups} {downs}");
}

#[test]
fn spikes_last_10_to_120_seconds() {
    for seed in 0..20 {
        let d = demand(Family::Spikes, seed, PEAK);
        let base = d[0];
        let mut run = 0;
        for v in &d {
            if *v > base {
                run += 1;
            } else if run > 0 {
                assert!((10..=120).contains(&run), "seed {seed}: {run} s");
                run = 0;
            }
        }
    }
}

#[test]
fn the_csv_reads_back_as_the_same_trace() {
    for f in Family::ALL {
        let d = demand(f, 3, PEAK);
        let text = csv(f, 3, &d);
        let parsed = Trace::parse(Path::new("g.csv"), &text).unwrap();
        let built = Trace::from_demand(&d);
        assert_eq!(parsed.seconds(), d.len() as u64);
        assert_eq!(built.seconds(), d.len() as u64);
        for t in (0..d.len()).step_by(7) {
            assert_eq!(parsed.demand(t as f64), d[t], "{} at {t}", f.name());
            assert_eq!(built.demand(t as f64), d[t], "{} at {t}", f.name());
        }
    }
}

#[test]
fn the_peak_is_what_max_instances_hold_at_the_threshold() {
    let spec = crate::decide::tests::spec(1, 10, 60.0);
    let model = crate::simulate::LoadModel {
        limit_mib: 64.0,
        base_mib: 4.0,
        warmup: std::time::Duration::from_secs(2),
    };
    let peak = peak_mib(&spec, &model).unwrap();
    assert!((peak - 344.0).abs() < 1e-9, "{peak}");
}
