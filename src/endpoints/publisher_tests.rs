//! The publisher with a fake runner and paused time: what runs when, retries and their
//! backoff, reloads, standbys, and removals.

use std::collections::VecDeque;
use std::time::Duration;

use super::*;
use crate::decide::tests::{spec, unmeasured};
use crate::model::{InstanceStatus, ObservedInstance, Readiness};

/// What the fake runner saw: when (since the test's start) and the stdin of each run.
#[derive(Default)]
struct Seen {
    runs: Vec<(Duration, String)>,
    /// The outcomes of the next runs (then success).
    next: VecDeque<Result<(), String>>,
}

fn fake(start: Instant) -> (Runner, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    let runner: Runner = Arc::new(move |_command, _timeout, input| {
        let s = s.clone();
        Box::pin(async move {
            let mut s = lock(&s);
            s.runs.push((
                start.elapsed(),
                String::from_utf8(input).unwrap_or_default(),
            ));
            s.next.pop_front().unwrap_or(Ok(()))
        })
    });
    (runner, seen)
}

fn group() -> GroupSpec {
    let mut s = spec(1, 5, 70.0);
    s.endpoints = Some(EndpointsSpec {
        port: 80,
        command: vec!["/bin/true".into()],
        timeout: Duration::from_secs(2),
        deregistration_delay: Duration::from_secs(1),
    });
    s
}

fn state(s: &GroupSpec) -> DesiredState {
    let mut d = DesiredState::default();
    d.groups.insert(s.name.clone(), s.clone());
    d
}

fn running(created: i64) -> ObservedInstance {
    let mut i = unmeasured(InstanceStatus::Running, created);
    i.address = Some(format!("10.0.0.{created}").parse().unwrap());
    i
}

fn obs(created: &[i64]) -> Observation {
    Observation {
        instances: created.iter().map(|c| running(*c)).collect(),
        ..Default::default()
    }
}

/// Lets the publisher's task run what is due at this instant.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn json(names: &[i64]) -> String {
    let set: Vec<Endpoint> = names
        .iter()
        .map(|c| Endpoint {
            instance: format!("web-{c}"),
            address: format!("10.0.0.{c}"),
            port: 80,
        })
        .collect();
    document("web", "default", &set)
}

#[tokio::test(start_paused = true)]
async fn a_failing_command_is_retried_with_a_doubling_backoff() {
    let t0 = Instant::now();
    let (runner, seen) = fake(t0);
    for i in 0..3 {
        lock(&seen)
            .next
            .push_back(Err(format!("exited with code 1: no {i}")));
    }
    let p = Publisher::with_runner(runner);
    let g = group();
    p.set_desired(&state(&g));
    settle().await;
    assert!(
        lock(&seen).runs.is_empty(),
        "nothing before a pass observed"
    );
    p.observed(&g, &obs(&[1, 2]));
    settle().await;
    let st = p.status("default", "web").unwrap();
    assert!(st.pending);
    assert_eq!(st.error.as_deref(), Some("exited with code 1: no 0"));
    assert!(st.published.is_empty());
    tokio::time::sleep(Duration::from_secs(20)).await;
    let runs = lock(&seen).runs.clone();
    let at: Vec<u64> = runs.iter().map(|(t, _)| t.as_secs()).collect();
    assert_eq!(at, [0, 1, 3, 7], "1s, 2s, 4s after each failure");
    assert!(runs.iter().all(|(_, input)| *input == json(&[1, 2])));
    let st = p.status("default", "web").unwrap();
    assert_eq!((st.pending, st.error), (false, None));
    assert_eq!(st.published.len(), 2);
    // The backoff starts over after a success.
    lock(&seen).next.push_back(Err("again".into()));
    p.observed(&g, &obs(&[1]));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let at: Vec<u64> = lock(&seen).runs.iter().map(|(t, _)| t.as_secs()).collect();
    assert_eq!(at, [0, 1, 3, 7, 20, 21]);
}

#[test]
fn the_backoff_stops_doubling_at_a_minute() {
    let g = group();
    let mut st = State::new(&g, g.endpoints.as_ref().unwrap());
    let now = Instant::now();
    for _ in 0..10 {
        st.ended(Vec::new(), Err("no".into()), now);
    }
    assert_eq!(st.backoff, BACKOFF_MAX);
    assert_eq!(st.retry_at, Some(now + BACKOFF_MAX));
}

#[tokio::test(start_paused = true)]
async fn the_same_set_runs_once_until_a_reload_and_a_standby_runs_nothing() {
    let t0 = Instant::now();
    let (runner, seen) = fake(t0);
    let p = Publisher::with_runner(runner);
    let g = group();
    p.set_desired(&state(&g));
    p.observed(&g, &obs(&[]));
    settle().await;
    assert_eq!(
        lock(&seen).runs.len(),
        1,
        "an empty set is published at start"
    );
    p.observed(&g, &obs(&[]));
    settle().await;
    assert_eq!(lock(&seen).runs.len(), 1, "unchanged");
    p.set_desired(&state(&g));
    p.observed(&g, &obs(&[]));
    settle().await;
    assert_eq!(lock(&seen).runs.len(), 2, "a reload publishes again");
    // Standing by: nothing runs, whatever is observed.
    p.standby(&g);
    p.observed(&g, &obs(&[3]));
    p.standby(&g);
    settle().await;
    assert_eq!(lock(&seen).runs.len(), 2);
    assert!(p.status("default", "web").unwrap().published.is_empty());
    // Taking over: the set found is published, unchanged or not.
    p.observed(&g, &obs(&[]));
    settle().await;
    assert_eq!(lock(&seen).runs.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_removal_publishes_the_set_without_its_instance_or_is_held() {
    let t0 = Instant::now();
    let (runner, seen) = fake(t0);
    let p = Publisher::with_runner(runner);
    let g = group();
    p.set_desired(&state(&g));
    p.observed(&g, &obs(&[1, 2]));
    settle().await;
    assert_eq!(p.leave(&g, "web-9").await, Ok(Left::NotInSet));
    assert_eq!(p.leave(&g, "web-2").await, Ok(Left::Deregistered));
    assert_eq!(lock(&seen).runs.last().unwrap().1, json(&[1]));
    p.done(&g, "web-2", true);
    settle().await;
    assert_eq!(lock(&seen).runs.len(), 2, "gone: not published again");
    // A failing command holds the removal and puts the instance back.
    lock(&seen).next.push_back(Err("exited with code 1".into()));
    assert_eq!(
        p.leave(&g, "web-1").await,
        Err("exited with code 1".to_owned())
    );
    assert!(lock(&state_of(&p, &g)).leaving.is_empty());
    let st = p.status("default", "web").unwrap();
    assert_eq!(st.published.len(), 1, "still the set with web-1");
    assert!(!st.pending, "what is published is what is wanted");
}

fn state_of(p: &Publisher, g: &GroupSpec) -> Arc<Mutex<State>> {
    p.entry(g, |e| e.state.clone()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_start_publishes_the_set_it_finds_not_an_empty_one_first() {
    let t0 = Instant::now();
    let (runner, seen) = fake(t0);
    let p = Publisher::with_runner(runner);
    let g = group();
    p.set_desired(&state(&g));
    // The first pass after a start: the instances are not checked yet.
    let mut first = obs(&[1, 2]);
    for i in &mut first.instances {
        i.readiness = Readiness::Starting { why: String::new() };
    }
    p.observed(&g, &first);
    settle().await;
    assert!(
        lock(&seen).runs.is_empty(),
        "nothing known: nothing published"
    );
    assert!(p.leave(&g, "web-1").await.is_err(), "no removal before");
    // Checked: the set found.
    p.observed(&g, &obs(&[1, 2]));
    settle().await;
    assert_eq!(lock(&seen).runs[0].1, json(&[1, 2]));
    // Never known: published as it is after SETTLE.
    p.standby(&g);
    p.observed(&g, &first);
    tokio::time::sleep(SETTLE).await;
    p.observed(&g, &first);
    settle().await;
    assert_eq!(lock(&seen).runs.len(), 2);
    assert_eq!(lock(&seen).runs[1].1, json(&[]));
}
