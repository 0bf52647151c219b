//! `[daemon] host_reserve` against the fake Incus: a scale-up the host cannot hold is held
//! back (`host-headroom`, counted), a smaller reserve lets it through, a steady pass reads
//! nothing, and on a cluster new instances go to a member with room.

use std::sync::Arc;
use std::time::Duration;

use crate::fake::{mem, FakeIncus};
use crate::util::{eventually, run_for, web, Harness};

const MINUTE: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// `web(min, max)` (100 MiB instances, threshold 50 %) keeping `reserve` on each host.
fn reserving(min: u32, max: u32, reserve: &str) -> String {
    web(min, max).replace(
        "interval = \"2s\"",
        &format!("interval = \"2s\"\nhost_reserve = \"{reserve}\""),
    )
}

fn reason(h: &Harness) -> String {
    h.telemetry
        .status()
        .groups
        .first()
        .map_or_else(String::new, |g| g.reason.clone())
}

fn blocked(h: &Harness) -> u64 {
    let text = h.telemetry.metrics();
    let key = "incus_hpa_headroom_blocked_total{group=\"web\",project=\"default\"} ";
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_scale_up_the_host_cannot_hold_is_held_back_and_a_smaller_reserve_lets_it_through() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(10.0));
    fake.set_host_memory("", 4 * GIB, GIB);
    let h = Harness::start(&reserving(1, 5, "512MiB"), fake);
    eventually("min (1) running", MINUTE, || h.fake.running("web") == 1).await;

    // Steady: no pass reads the host.
    run_for(Duration::from_secs(5)).await;
    let reads = h.fake.calls("host_memory");
    run_for(Duration::from_secs(20)).await;
    assert_eq!(
        h.fake.calls("host_memory"),
        reads,
        "a steady pass read the host"
    );

    // 90 MiB of 100 at a 50 % threshold wants 2; the host has 520 MiB available and keeps
    // 512 MiB: 8 MiB is no room for a 90 MiB instance.
    h.fake.set_host_memory("", 4 * GIB, 520 * MIB);
    h.fake.set_group_memory("web", 90.0);
    eventually("host-headroom", MINUTE, || reason(&h) == "host-headroom").await;
    eventually("counted", MINUTE, || blocked(&h) >= 1).await;
    run_for(Duration::from_secs(10)).await;
    assert_eq!(h.fake.running("web"), 1);
    let g = h.telemetry.status().groups[0].clone();
    assert_eq!((g.current, g.desired), (1, 2));
    // Once per pass, each reading the host once.
    let (n, reads) = (blocked(&h), h.fake.calls("host_memory"));
    run_for(Duration::from_secs(10)).await;
    let passes = blocked(&h) - n;
    assert!(passes >= 4, "{passes} passes in 10 s at a 2 s interval");
    assert_eq!(h.fake.calls("host_memory") - reads, passes);

    // A smaller reserve: 264 MiB of room.
    h.reload(&reserving(1, 5, "256MiB"));
    eventually("2 running", MINUTE, || h.fake.running("web") == 2).await;
    eventually("no longer held", MINUTE, || reason(&h) != "host-headroom").await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn below_min_too_when_the_reserve_is_a_percentage_the_host_is_below() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(10.0));
    // 30 % of 4 GiB is 1.2 GiB, above the 1 GiB available.
    fake.set_host_memory("", 4 * GIB, GIB);
    let h = Harness::start(&reserving(2, 5, "30%"), fake);
    eventually("host-headroom", MINUTE, || reason(&h) == "host-headroom").await;
    run_for(Duration::from_secs(10)).await;
    assert_eq!(h.fake.running("web"), 0, "created below the reserve");
    assert!(blocked(&h) >= 1);
    h.reload(&reserving(2, 5, "20%"));
    eventually("min (2) running", MINUTE, || h.fake.running("web") == 2).await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn on_a_cluster_new_instances_go_to_the_members_with_room() {
    let fake = Arc::new(FakeIncus::default());
    fake.cluster(&["m1", "m2", "m3"], &[]);
    *fake.default_memory.lock().unwrap() = Some(mem(10.0));
    // 1 GiB kept on each: m1 and m2 have 50 MiB of room, m3 plenty.
    fake.set_host_memory("m1", 8 * GIB, GIB + 50 * MIB);
    fake.set_host_memory("m2", 8 * GIB, GIB + 50 * MIB);
    fake.set_host_memory("m3", 8 * GIB, 4 * GIB);
    let h = Harness::start(&reserving(3, 6, "1GiB"), fake);
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    assert_eq!(
        h.fake.locations("web"),
        [("m3".to_owned(), 3)].into_iter().collect()
    );
    assert_eq!(blocked(&h), 0);

    // m3 fills up too: a scale-up has nowhere to go.
    h.fake.set_host_memory("m3", 8 * GIB, GIB);
    h.fake.set_group_memory("web", 90.0);
    eventually("host-headroom", MINUTE, || reason(&h) == "host-headroom").await;
    assert_eq!(h.fake.running("web"), 3);
    // m1 frees memory: the additions go there, as far as it has room (3 × 90 MiB).
    h.fake.set_host_memory("m1", 8 * GIB, GIB + 300 * MIB);
    eventually("6 running", MINUTE, || h.fake.running("web") == 6).await;
    run_for(Duration::from_secs(10)).await;
    let on = h.fake.locations("web");
    assert_eq!((on.get("m1"), on.get("m2")), (Some(&3), None), "{on:?}");
    h.shutdown().await;
}
