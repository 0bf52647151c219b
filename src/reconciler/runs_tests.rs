//! The background runs on real programs (`/bin/sh -c`), on tokio's real clock: a pass takes
//! what there is and never waits, one run of a signal at a time, a value stands an interval
//! and a timeout, and a cancelled run gives nothing.

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::model::GroupSpec;

/// A group with one external signal, `script` run by `/bin/sh -c`, a 10 s interval and a 30 s
/// timeout.
fn group(script: &str) -> GroupSpec {
    GroupSpec {
        interval: Duration::from_secs(10),
        external: vec![ExternalSpec {
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            target: 1.0,
            timeout: Duration::from_secs(30),
        }],
        ..crate::decide::tests::spec(1, 10, 60.0)
    }
}

#[tokio::test]
async fn a_pass_never_waits_and_a_signal_runs_once_at_a_time() {
    let spec = group("sleep 30");
    let mut runs = Runs::default();
    let now = Instant::now();
    assert_eq!(runs.for_pass(&spec, now), vec![None]);
    assert_eq!(runs.in_flight(), 1);
    // Due again by the interval, still running: not started twice.
    assert_eq!(runs.for_pass(&spec, now + spec.interval * 2), vec![None]);
    assert_eq!(runs.in_flight(), 1);
    runs.stop();
    assert_eq!(runs.in_flight(), 0);
}

#[tokio::test]
async fn a_value_stands_an_interval_and_a_timeout() {
    let spec = group("echo 4");
    let (interval, timeout) = (spec.interval, spec.external[0].timeout);
    let mut runs = Runs::default();
    let now = Instant::now();
    assert_eq!(runs.for_pass(&spec, now), vec![None]);
    let ran = runs.next().await;
    assert_eq!(
        runs.ended(ran, Some(&spec)),
        Some(((spec.name.clone(), 0), Some(4.0)))
    );
    // Within the interval: the value, and no new run.
    assert_eq!(runs.for_pass(&spec, now + interval / 2), vec![Some(4.0)]);
    assert_eq!(runs.in_flight(), 0);
    // An interval later: a new run, and the value while it runs.
    assert_eq!(runs.for_pass(&spec, now + interval), vec![Some(4.0)]);
    assert_eq!(runs.in_flight(), 1);
    // Past the interval and the timeout of the run after it: unknown.
    assert_eq!(runs.for_pass(&spec, now + interval + timeout), vec![None]);
    runs.stop();
}

#[tokio::test]
async fn a_cancelled_run_gives_nothing_and_a_failure_counts_as_a_run() {
    let mut runs = Runs::default();
    let now = Instant::now();
    runs.for_pass(&group("echo 4"), now);
    // The program changed: the run of the old one is cancelled, the new one runs.
    runs.retain(|_| false);
    let spec = group("exit 3");
    runs.for_pass(&spec, now);
    let ran = runs.next().await;
    assert_eq!(
        runs.ended(ran, Some(&spec)),
        Some(((spec.name.clone(), 0), None))
    );
    assert_eq!(runs.for_pass(&spec, now), vec![None]);
    assert_eq!(
        runs.in_flight(),
        0,
        "a failed run is retried an interval later"
    );
}
