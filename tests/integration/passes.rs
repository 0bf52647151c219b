//! Passes against the fake Incus: one group never waits for another (a program that hangs, a
//! drain of minutes), a program's value wakes its group when it arrives, a reload during a slow
//! pass applies to the others at once and to that group when its pass returns, and a pass acts
//! only on instances it listed while this daemon held the group's lease.
//!
//! Time is tokio's paused clock; where a real program must answer, the test keeps the clock
//! still (it yields without sleeping) while it waits, so that nothing but the program's answer
//! can make the loop move.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use incus_hpa::lease::Standing;
use incus_hpa::memory::MemorySource;
use incus_hpa::model::Memory;
use tokio::time::Instant;

use crate::fake::{mem, FakeIncus};
use crate::util::{eventually, run_for, web, Harness};

const MINUTE: Duration = Duration::from_secs(60);

/// The value of the sample whose name and labels are `key` (up to its value) in `metrics`; 0
/// when there is none.
fn sample(metrics: &str, key: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// How many passes of `group` ended.
fn passes(h: &Harness, group: &str) -> u64 {
    sample(
        &h.telemetry.metrics(),
        &format!(
            "incus_hpa_reconcile_duration_seconds_count{{group=\"{group}\",project=\"default\"}}"
        ),
    )
}

/// How many passes of `group` started more than 5 ms after they were due.
fn late(h: &Harness, group: &str) -> u64 {
    let labels = format!("group=\"{group}\",project=\"default\"");
    let metrics = h.telemetry.metrics();
    let count = sample(
        &metrics,
        &format!("incus_hpa_pass_delay_seconds_count{{{labels}}}"),
    );
    let on_time = sample(
        &metrics,
        &format!("incus_hpa_pass_delay_seconds_bucket{{le=\"0.005\",{labels}}}"),
    );
    assert!(count > 0, "no pass of {group} in:\n{metrics}");
    count - on_time
}

fn listed(h: &Harness, group: &str) -> bool {
    h.telemetry.status().groups.iter().any(|g| g.name == group)
}

/// `web(min, max)` and a group `jobs` (min 1, max 3) on one external signal: `command`, which
/// gets 60 s (the most a program may have) to answer.
fn beside_a_program(min: u32, max: u32, command: &str) -> String {
    web(min, max)
        + &format!(
            r#"
[groups.jobs]
max = 3
image = "busybox"

[[groups.jobs.external]]
command = {command}
target = 1
timeout = "60s"
"#
        )
}

/// How long the program of `beside_a_program` may run before it is killed.
const PROGRAM_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn a_program_that_hangs_never_delays_another_group() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(10.0));
    let h = Harness::start(&beside_a_program(1, 4, r#"["/bin/sleep", "600"]"#), fake);
    // jobs' program sleeps: its first run, started by jobs' first pass now, cannot end before
    // it is killed at its timeout. Everything below happens before that.
    let hangs_until = Instant::now() + PROGRAM_TIMEOUT;
    let still_hanging = || {
        assert!(
            Instant::now() < hangs_until,
            "jobs' program may have been killed: web waited for it"
        );
    };
    eventually("web at min", MINUTE, || {
        still_hanging();
        h.fake.running("web") == 1
    })
    .await;
    h.fake.set_group_memory("web", 90.0);
    let before = passes(&h, "web");
    eventually("web grows, pass after pass", MINUTE, || {
        still_hanging();
        h.fake.running("web") == 2 && passes(&h, "web") >= before + 5
    })
    .await;
    // jobs' own passes carry on too, its signal unknown: the count held at its min.
    let jobs = passes(&h, "jobs");
    eventually("jobs passes again", MINUTE, || {
        still_hanging();
        passes(&h, "jobs") >= jobs + 3
    })
    .await;
    assert_eq!(h.fake.running("jobs"), 1);
    // Every pass of either group started when it was due (the clock is tokio's, paused).
    assert_eq!((late(&h, "web"), late(&h, "jobs")), (0, 0));
    let status = h.telemetry.status();
    let g = status.groups.iter().find(|g| g.name == "jobs").unwrap();
    assert_eq!(g.signals[0].value, None, "{:?}", g.signals);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_value_that_arrives_wakes_its_group_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    // Answers 3 once `go` exists (looked for every 20 ms of real time).
    let command = format!(
        r#"["/bin/sh", "-c", "while [ ! -e {} ]; do sleep 0.02; done; echo 3"]"#,
        go.display()
    );
    let toml = beside_a_program(1, 4, &command).replace("interval = \"2s\"", "interval = \"1h\"");
    let h = Harness::start(&toml, Arc::new(FakeIncus::default()));
    // No value yet: jobs holds its min.
    eventually("jobs at min", MINUTE, || h.fake.running("jobs") == 1).await;
    run_for(Duration::from_secs(1)).await;
    let creates = h.fake.calls("create");
    std::fs::write(&go, "").unwrap();
    // The clock stands still from here: no interval, no timer can end; only the program's
    // answer can start the pass that creates.
    let frozen = Instant::now();
    let deadline = std::time::Instant::now() + MINUTE;
    while h.fake.calls("create") == creates {
        assert!(
            std::time::Instant::now() < deadline,
            "the program's answer did not wake jobs"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(Instant::now(), frozen, "the clock moved");
    eventually("jobs at 3", MINUTE, || h.fake.running("jobs") == 3).await;
    h.shutdown().await;
}

/// A group `slow` of at most 1 whose removals drain for 5 minutes, beside `web` (adaptive, 1 h
/// interval: only the watch makes it grow between passes), with 2 instances of `slow` there.
fn beside_a_drain(web_min: u32, slow: bool) -> String {
    let mut toml = web(web_min, 4)
        .replace("interval = \"2s\"", "interval = \"1h\"")
        .replace(
            "memory_threshold = 50\n",
            "memory_threshold = 50\npolicy = \"adaptive\"\n",
        );
    if slow {
        toml += r#"
[groups.slow]
min = 1
max = 1
memory_threshold = 50
image = "busybox"
drain_command = ["/bin/true"]
drain_timeout = "5m"
"#;
    }
    toml
}

fn draining() -> Arc<FakeIncus> {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(10.0));
    for name in ["slow-aaaaaa", "slow-bbbbbb"] {
        fake.add_owned("slow", name, "Running");
        fake.set_memory(name, Some(mem(10.0)));
    }
    fake.set_drain(0, Some(Duration::from_secs(600)));
    fake
}

#[tokio::test(start_paused = true)]
async fn a_slow_pass_never_delays_the_watch_nor_another_group() {
    let h = Harness::start(&beside_a_drain(1, true), draining());
    eventually("slow's drain began", MINUTE, || !h.fake.drains().is_empty()).await;
    eventually("web at min", MINUTE, || h.fake.running("web") == 1).await;
    run_for(Duration::from_secs(10)).await;
    // web's instance reaches its limit: the watch wakes web, which grows while slow's pass
    // still drains (its instance is deleted only after the drain).
    h.fake.set_group_memory("web", 99.0);
    eventually("web grows while slow drains", 10 * MINUTE, || {
        assert_eq!(h.fake.managed("slow").len(), 2, "slow's drain ended first");
        h.fake.running("web") > 1
    })
    .await;
    eventually("slow's removal ends", 10 * MINUTE, || {
        h.fake.managed("slow").len() == 1
    })
    .await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_reload_during_a_slow_pass_applies_to_the_others_at_once_and_to_it_when_it_returns() {
    let h = Harness::start(&beside_a_drain(1, true), draining());
    eventually("slow's drain began", MINUTE, || !h.fake.drains().is_empty()).await;
    // slow removed from the file, web's min raised: web grows at once.
    h.reload(&beside_a_drain(2, false));
    eventually("web grows while slow drains", MINUTE, || {
        assert_eq!(h.fake.managed("slow").len(), 2, "slow's drain ended first");
        h.fake.running("web") == 2
    })
    .await;
    assert!(!listed(&h, "slow"));
    // slow declared again: no second pass on it while the first is in flight.
    h.reload(&beside_a_drain(2, true));
    run_for(Duration::from_secs(20)).await;
    assert!(listed(&h, "slow"));
    assert_eq!(h.fake.drains().len(), 1, "two passes of slow at once");
    assert_eq!(h.fake.managed("slow").len(), 2);
    // The first pass ends its removal; the group declared again is reconciled then.
    eventually("slow's removal ends", 10 * MINUTE, || {
        h.fake.managed("slow").len() == 1
    })
    .await;
    eventually("slow reconciled", MINUTE, || {
        let status = h.telemetry.status();
        let slow = status.groups.iter().find(|g| g.name == "slow").unwrap();
        slow.current == 1 && slow.reason != "pending"
    })
    .await;
    assert_eq!(h.fake.drains().len(), 1);
    h.shutdown().await;
}

/// The fake's memory behind a gate: while it is closed, a pass that reads memory waits there,
/// after listing its instances and before deciding.
struct Gate {
    fake: Arc<FakeIncus>,
    closed: AtomicBool,
    waiting: AtomicUsize,
    opened: tokio::sync::Notify,
}

impl Gate {
    fn closed(fake: Arc<FakeIncus>) -> Self {
        Self {
            fake,
            closed: AtomicBool::new(true),
            waiting: AtomicUsize::new(0),
            opened: tokio::sync::Notify::new(),
        }
    }

    fn open(&self) {
        self.closed.store(false, Ordering::SeqCst);
        self.opened.notify_waiters();
    }
}

#[async_trait]
impl MemorySource for Gate {
    async fn read(&self, project: &str, names: &[String]) -> Vec<Option<Memory>> {
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            if !self.closed.load(Ordering::SeqCst) {
                break;
            }
            self.waiting.fetch_add(1, Ordering::SeqCst);
            opened.await;
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.fake.read(project, names).await
    }

    fn usage(&self, project: &str, name: &str) -> Option<u64> {
        self.fake.usage(project, name)
    }

    fn peek(&self, project: &str, name: &str) -> Option<Memory> {
        self.fake.peek(project, name)
    }
}

#[tokio::test(start_paused = true)]
async fn a_standby_that_takes_over_during_its_observation_looks_again() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(10.0));
    let a = Harness::start_as("host-a:1:aaaa", &web(1, 2), fake.clone());
    eventually("a holds web, at 1", MINUTE, || {
        fake.running("web") == 1 && a.leases.holds("default", "web")
    })
    .await;
    // b would keep 2: its first pass lists the one instance, then waits at the gate, in
    // standby.
    let gate = Arc::new(Gate::closed(fake.clone()));
    let b = Harness::start_with("host-b:2:bbbb", &web(2, 2), fake.clone(), gate.clone());
    eventually("b's pass at the gate", MINUTE, || {
        gate.waiting.load(Ordering::SeqCst) > 0
    })
    .await;
    assert!(matches!(
        b.leases.standing("default", "web"),
        Standing::Standby { .. }
    ));
    // Meanwhile a grows web to 2 and shuts down, giving its lease up; b takes it.
    a.reload(&web(2, 2));
    eventually("a at 2", MINUTE, || fake.running("web") == 2).await;
    a.shutdown().await;
    eventually("b holds web", MINUTE, || b.leases.holds("default", "web")).await;
    let creates = fake.calls("create");
    assert_eq!(passes(&b, "web"), 0);
    gate.open();
    // b's pass goes on as the holder: on the one instance it listed before, it would create a
    // third, over max.
    eventually("b's first pass ends", MINUTE, || passes(&b, "web") >= 1).await;
    for _ in 0..100 {
        assert!(fake.managed("web").len() <= 2, "{:?}", fake.managed("web"));
        run_for(Duration::from_millis(100)).await;
    }
    assert_eq!(fake.calls("create"), creates, "b created what a had");
    b.shutdown().await;
}
