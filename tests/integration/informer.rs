//! The informer against the fake Incus: a steady pass asks nothing of Incus, events keep the
//! cache right, a lost event stream and the resync period bring a fresh list, reads for events
//! are coalesced and bounded, projects no group uses are dropped, groups that find a project
//! stale together share one listing.

use std::sync::Arc;
use std::time::Duration;

use incus_hpa::daemon::Event;
use incus_hpa::events::follow;
use incus_hpa::informer::{Store, READS_AT_ONCE};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use crate::fake::{mem, FakeIncus};
use crate::util::{eventually, run_for, web, Harness};

const MINUTE: Duration = Duration::from_secs(60);

/// Requests that are not memory readings (the fake also serves as the memory source).
fn requests(fake: &FakeIncus) -> u64 {
    ["list", "get", "create", "change_state", "delete"]
        .iter()
        .map(|c| fake.calls(c))
        .sum()
}

#[tokio::test(start_paused = true)]
async fn a_steady_pass_sends_no_request_until_the_resync() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(50.0));
    let toml = web(3, 5).replace("[daemon]", "[daemon]\nresync = \"1m\"");
    let h = Harness::start(&toml, fake);
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    run_for(Duration::from_secs(5)).await;
    let before = requests(&h.fake);
    let lists = h.fake.calls("list");
    // 20 passes of 2 s: memory is read, nothing else is asked.
    run_for(Duration::from_secs(40)).await;
    assert_eq!(requests(&h.fake), before, "requests on steady passes");
    // The resync lists once a minute.
    run_for(MINUTE).await;
    let relists = h.fake.calls("list") - lists;
    assert!((1..=2).contains(&relists), "{relists} lists in a minute");
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn changes_behind_its_back_reach_the_cache_by_events() {
    let fake = Arc::new(FakeIncus::default());
    let h = Harness::start(&web(2, 3), fake);
    eventually("2 running", MINUTE, || h.fake.running("web") == 2).await;
    let lists = h.fake.calls("list");
    let victim = h.fake.managed("web")[0].0.clone();
    h.fake.remove(&victim);
    eventually("replaced", MINUTE, || {
        h.fake.running("web") == 2 && !h.fake.exists(&victim)
    })
    .await;
    assert_eq!(h.fake.calls("list"), lists, "no list was needed");
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn events_missed_while_the_stream_was_down_are_caught_by_a_fresh_list() {
    let fake = Arc::new(FakeIncus::default());
    let h = Harness::start(&web(2, 3), fake);
    eventually("2 running", MINUTE, || h.fake.running("web") == 2).await;
    // The stream drops; a deletion happens while nobody follows.
    h.fake.drop_followers();
    let victim = h.fake.managed("web")[0].0.clone();
    h.fake.remove(&victim);
    // The follower reconnects (within 5 s), the cache is listed afresh, the group repaired.
    eventually("replaced after the reconnection", MINUTE, || {
        h.fake.running("web") == 2 && !h.fake.exists(&victim)
    })
    .await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn scale_up_starts_the_warm_pool_first_and_refills_it() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(10.0));
    let toml = web(1, 4).replace("[groups.web.config]", "warm_pool = 2\n[groups.web.config]");
    let h = Harness::start(&toml, fake);
    let stopped = |h: &Harness| {
        h.fake
            .managed("web")
            .iter()
            .filter(|(_, s)| s == "Stopped")
            .count()
    };
    eventually("1 running, 2 warm", MINUTE, || {
        h.fake.running("web") == 1 && stopped(&h) == 2
    })
    .await;
    let warm: Vec<String> = h
        .fake
        .managed("web")
        .into_iter()
        .filter(|(_, s)| s == "Stopped")
        .map(|(n, _)| n)
        .collect();
    let creates = h.fake.calls("create");
    // 1 at 90 % of a 50 % target -> 2: the oldest warm instance starts, the pool refills.
    let busy = h
        .fake
        .managed("web")
        .into_iter()
        .find(|(_, s)| s == "Running")
        .unwrap()
        .0;
    h.fake.set_memory(&busy, Some(mem(90.0)));
    eventually("2 running, the pool full again", MINUTE, || {
        h.fake.running("web") == 2 && stopped(&h) == 2
    })
    .await;
    let started: Vec<String> = h
        .fake
        .managed("web")
        .into_iter()
        .filter(|(n, s)| s == "Running" && warm.contains(n))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(started.len(), 1, "a warm instance was started: {started:?}");
    assert_eq!(
        h.fake.calls("create"),
        creates + 1,
        "one creation: the refill"
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_coming_up_is_read_once_it_settled_never_at_once() {
    let fake = Arc::new(FakeIncus::default());
    let h = Harness::start(&web(1, 3), fake);
    eventually("1 running", MINUTE, || h.fake.running("web") == 1).await;
    run_for(Duration::from_secs(5)).await;
    let reads = h.fake.calls("get");
    // `incus copy`: created, nothing follows. Not read at once; read once it settled.
    let source = h.fake.managed("web")[0].0.clone();
    h.fake.copy(&source, "web-copy");
    run_for(Duration::from_millis(100)).await;
    assert_eq!(h.fake.calls("get"), reads, "read the moment it was created");
    let cached = |h: &Harness| {
        h.store
            .snapshot()
            .remove("default")
            .unwrap_or_default()
            .iter()
            .any(|(n, _)| n == "web-copy")
    };
    eventually("the copy in the cache", MINUTE, || cached(&h)).await;
    assert_eq!(h.fake.calls("get"), reads + 1);
    // `incus launch` by a person: created then started, read once, after it settled.
    let reads = h.fake.calls("get");
    h.fake
        .add("web-manual", "Stopped", &[("user.incus-hpa.group", "web")]);
    h.fake.set_status("web-manual", "Running");
    run_for(incus_hpa::informer::SETTLE * 2).await;
    assert_eq!(h.fake.calls("get"), reads + 1, "read once");
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_daemons_own_creations_are_read_once_by_the_action_not_by_their_events() {
    let fake = Arc::new(FakeIncus::default());
    let h = Harness::start(&web(3, 3), fake);
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    run_for(incus_hpa::informer::SETTLE * 2).await;
    // Each creation emitted created and started; only the action's own read was sent.
    assert_eq!(h.fake.calls("get"), 3);
    // An event that comes once the action is over is read as usual.
    let name = h.fake.managed("web")[0].0.clone();
    h.fake.set_config(&name, "user.note", Some("x"));
    eventually("the update read", MINUTE, || h.fake.calls("get") == 4).await;
    h.shutdown().await;
}

/// The event follower alone over `fake` (no reconcile loop): its cache, with `default` listed,
/// and the events it sends the loop.
async fn follower(fake: &Arc<FakeIncus>) -> (Arc<Store>, UnboundedReceiver<Event>) {
    let store = Arc::new(Store::default());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reconnects = incus_hpa::control::Telemetry::default().reconnects;
    tokio::spawn(follow(
        fake.clone(),
        fake.clone(),
        store.clone(),
        tx,
        reconnects,
    ));
    assert_eq!(rx.recv().await, Some(Event::IncusBack));
    let listed = store.list(fake.as_ref(), "default", Instant::now(), MINUTE);
    assert_eq!(listed.await.unwrap().len(), fake.listing().len());
    (store, rx)
}

/// Waits for `n` wake-ups of groups (each sent once the cache has what its event said).
async fn woken(rx: &mut UnboundedReceiver<Event>, n: usize) {
    for _ in 0..n {
        match rx.recv().await {
            Some(Event::InstanceChanged { .. }) => {}
            other => panic!("expected a wake-up, got {other:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_mass_stop_is_read_a_few_instances_at_a_time() {
    let fake = Arc::new(FakeIncus::default());
    let names: Vec<String> = (0..50).map(|i| format!("web-{i:02}")).collect();
    for n in &names {
        fake.add_owned("web", n, "Running");
    }
    let (store, mut rx) = follower(&fake).await;
    fake.set_read_time(Some(Duration::from_millis(100)));
    for n in &names {
        fake.set_status(n, "Stopped");
    }
    woken(&mut rx, 50).await;
    assert_eq!(fake.calls("get"), 50, "one read per instance");
    let most = fake.most_reads_at_once();
    assert!(
        (1..=READS_AT_ONCE).contains(&most),
        "{most} reads in flight at once"
    );
    let cached = store.snapshot().remove("default").unwrap_or_default();
    assert_eq!(cached.len(), 50);
    assert!(cached.iter().all(|(_, s)| s == "Stopped"), "{cached:?}");
}

#[tokio::test(start_paused = true)]
async fn events_for_one_instance_are_coalesced_and_the_newest_state_is_read() {
    let fake = Arc::new(FakeIncus::default());
    fake.add_owned("web", "web-a", "Running");
    let (store, mut rx) = follower(&fake).await;
    fake.set_read_time(Some(Duration::from_secs(1)));
    fake.set_config("web-a", "user.note", Some("0"));
    // Nine more changes while the first read is in flight (it answers what it saw first).
    eventually("the first read sent", MINUTE, || fake.calls("get") == 1).await;
    for i in 1..10 {
        fake.set_config("web-a", "user.note", Some(&i.to_string()));
    }
    // Its groups woken once the first read is done, and again once the one after the last
    // event is: not once per event.
    woken(&mut rx, 2).await;
    let reads = fake.calls("get");
    assert!((1..=2).contains(&reads), "{reads} reads for 10 events");
    let cached = store.instances("default", Instant::now(), Duration::MAX);
    let note = cached.unwrap()[0].config.get("user.note").cloned();
    assert_eq!(note.as_deref(), Some("9"), "the cache has the last state");
}

#[tokio::test(start_paused = true)]
async fn a_project_no_group_uses_any_more_is_dropped_and_its_events_are_not_read() {
    let fake = Arc::new(FakeIncus::default());
    let h = Harness::start(&web(1, 3), fake);
    eventually("1 running", MINUTE, || h.fake.running("web") == 1).await;
    run_for(incus_hpa::informer::SETTLE * 2).await;
    assert!(h.store.follows("default"));
    // The group moves to another project (where it wants nothing).
    let moved = web(0, 3).replace(
        "image = \"busybox\"",
        "image = \"busybox\"\nproject = \"staging\"",
    );
    h.reload(&moved);
    eventually("default dropped", MINUTE, || !h.store.follows("default")).await;
    eventually("staging listed", MINUTE, || h.store.follows("staging")).await;
    let reads = h.fake.calls("get");
    let left = h.fake.managed("web")[0].0.clone();
    h.fake.set_config(&left, "user.note", Some("x"));
    h.fake.set_status(&left, "Stopped");
    run_for(incus_hpa::informer::SETTLE * 2).await;
    assert_eq!(
        h.fake.calls("get"),
        reads,
        "events of a dropped project were read"
    );
    assert!(!h.store.follows("default"));
    assert!(!h.store.snapshot().contains_key("default"));
    h.shutdown().await;
}

/// The tasks alive on this test's runtime.
fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test(start_paused = true)]
async fn a_storm_of_events_is_taken_in_without_a_task_per_event() {
    let fake = Arc::new(FakeIncus::default());
    let names: Vec<String> = (0..300).map(|i| format!("web-{i:03}")).collect();
    for n in &names {
        fake.add_owned("web", n, "Running");
    }
    let (store, mut rx) = follower(&fake).await;
    let before = tasks();
    fake.set_read_time(Some(Duration::from_millis(100)));
    for n in &names {
        fake.set_status(n, "Stopped");
    }
    // The first wake-up comes once the first reads are done: by then the follower has taken
    // every event off the stream.
    woken(&mut rx, 1).await;
    let during = tasks();
    assert!(
        during <= before + READS_AT_ONCE,
        "{during} tasks alive for 300 events ({before} before them)"
    );
    eventually("every instance read", MINUTE, || {
        let cached = store.snapshot().remove("default").unwrap_or_default();
        cached.len() == 300 && cached.iter().all(|(_, s)| s == "Stopped")
    })
    .await;
    assert_eq!(fake.calls("get"), 300, "one read per instance");
}

#[tokio::test(start_paused = true)]
async fn groups_that_find_the_project_stale_together_share_one_listing() {
    let fake = Arc::new(FakeIncus::default());
    let groups = ["a", "b", "c"];
    for g in groups {
        fake.add_owned(g, &format!("{g}-1"), "Running");
    }
    fake.set_list_time(Some(Duration::from_secs(1)));
    let store = Store::default();
    let now = Instant::now();
    let found = futures_util::future::join_all(
        groups.map(|g| store.list_group(fake.as_ref(), "default", g, now, MINUTE)),
    )
    .await;
    assert_eq!(fake.calls("list"), 1, "one listing for the three groups");
    for (g, found) in groups.iter().zip(found) {
        let names: Vec<String> = found.unwrap().into_iter().map(|i| i.name.clone()).collect();
        assert_eq!(names, [format!("{g}-1")]);
    }
}
