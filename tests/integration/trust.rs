//! Trust, against the fake Incus: ownership by identity, health, crash loops, failed starts,
//! name collisions, the daemon's own events, reloads of every key, recovery after an outage.

use std::sync::Arc;
use std::time::Duration;

use incus_hpa::daemon::Event;
use incus_hpa::model::{MemorySourceKind, GROUP_KEY};

use crate::fake::{mem, FakeIncus, CRASHES};
use crate::util::{eventually, run_for, web, Harness};

const MINUTE: Duration = Duration::from_secs(60);

fn changed(h: &Harness, name: &str) {
    h.events
        .send(Event::InstanceChanged {
            project: "default".into(),
            name: name.into(),
        })
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn copies_renames_and_detached_instances_are_never_touched() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(1.0));
    let h = Harness::start(&web(2, 2).replace("60s", "1s"), fake);
    eventually("2 running", MINUTE, || h.fake.running("web") == 2).await;
    let names: Vec<String> = h.fake.managed("web").into_iter().map(|(n, _)| n).collect();

    // `incus copy`, `incus rename` and `incus config unset … user.incus-hpa.group`.
    h.fake.copy(&names[0], "web-debug");
    h.fake.rename(&names[1], "web-renamed");
    changed(&h, &names[1]);
    eventually("the renamed one replaced", MINUTE, || {
        h.fake.running("web") == 3 // the replacement, web-renamed and (not running) web-debug
            || h.fake.managed("web").len() == 4
    })
    .await;
    let detached = names[0].clone();
    h.fake.set_config(&detached, GROUP_KEY, None);
    changed(&h, &detached);
    eventually("the detached one replaced", MINUTE, || {
        h.fake
            .managed("web")
            .iter()
            .filter(|(n, s)| n.starts_with("web-") && n.len() == 10 && s == "Running")
            .count()
            == 2
    })
    .await;

    // Scale down to 0..1 with memory at 1 %: only the daemon's own go.
    h.reload(&web(0, 1).replace("60s", "1s"));
    run_for(Duration::from_secs(30)).await;
    for name in ["web-debug", "web-renamed", &detached] {
        assert!(h.fake.exists(name), "{name} was touched");
    }
    assert_eq!(
        h.fake.get_instance("web-debug").unwrap().status,
        "Stopped",
        "a stopped copy is not started either"
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_frozen_instance_is_replaced_and_removed_after_its_grace() {
    let fake = Arc::new(FakeIncus::default());
    let toml = web(1, 1).replace(
        "[groups.web.config]",
        "unhealthy_grace = \"2m\"\n[groups.web.config]",
    );
    let h = Harness::start(&toml, fake);
    eventually("1 running", MINUTE, || h.fake.running("web") == 1).await;
    let frozen = h.fake.managed("web")[0].0.clone();
    h.fake.set_status(&frozen, "Frozen");
    changed(&h, &frozen);
    // Confirmed frozen after 5 s (a copy freezes its source for a moment), then replaced.
    eventually("a replacement running", Duration::from_secs(8), || {
        h.fake.running("web") == 1 && h.fake.managed("web").len() == 2
    })
    .await;
    run_for(Duration::from_secs(100)).await;
    assert!(h.fake.exists(&frozen), "kept during its grace period");
    eventually("removed after its grace", MINUTE, || {
        !h.fake.exists(&frozen)
    })
    .await;
    assert_eq!(h.fake.running("web"), 1);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_crash_loop_backs_off_and_is_replaced_after_a_few_crashes() {
    let fake = Arc::new(FakeIncus::default());
    let toml = web(1, 1)
        .replace("image = \"busybox\"", &format!("image = \"{CRASHES}\""))
        .replace("interval = \"2s\"", "interval = \"1s\"")
        .replace(
            "[groups.web.config]",
            "restart_backoff = \"2s\"\n[groups.web.config]",
        );
    let h = Harness::start(&toml, fake);
    eventually("the first instance created", MINUTE, || {
        h.fake.calls("create") >= 1
    })
    .await;
    // Without a backoff it would restart every second: 60 starts in a minute. With it, each
    // instance is restarted after 0, 2, 4 and 8 s, then replaced on its 5th crash.
    run_for(MINUTE).await;
    let starts = h.fake.calls("change_state");
    let creates = h.fake.calls("create");
    assert!(starts <= 20, "{starts} starts in a minute");
    assert!(
        creates >= 2,
        "replaced after a few crashes ({creates} creations)"
    );
    assert!(creates <= 5, "{creates} creations in a minute");
    assert!(
        h.fake.managed("web").len() <= 1,
        "replaced instances are removed: {:?}",
        h.fake.managed("web")
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_that_fails_to_start_is_retried_and_never_deleted() {
    let fake = Arc::new(FakeIncus::default());
    fake.add_owned("web", "web-old001", "Stopped");
    fake.add_owned("web", "web-old002", "Stopped");
    fake.set_starts_fail(true);
    let h = Harness::start(&web(2, 2), fake);
    run_for(Duration::from_secs(90)).await;
    assert!(h.fake.exists("web-old001") && h.fake.exists("web-old002"));
    let starts = h.fake.calls("change_state");
    assert!(starts >= 4, "retried ({starts} starts)");
    assert!(starts <= 14, "with a backoff ({starts} starts in 90 s)");
    assert_eq!(
        h.fake.managed("web").len(),
        2,
        "{:?}",
        h.fake.managed("web")
    );
    // The bridge comes up: both start, nothing else is created.
    h.fake.set_starts_fail(false);
    eventually("both started", Duration::from_secs(90), || {
        h.fake.running("web") == 2
    })
    .await;
    assert_eq!(h.fake.managed("web").len(), 2);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_name_collision_never_deletes_the_existing_instance() {
    let fake = Arc::new(FakeIncus::default());
    fake.add("someone-else", "Running", &[]);
    fake.collide_next_create();
    let h = Harness::start(&web(1, 1), fake);
    eventually("1 running", MINUTE, || h.fake.running("web") == 1).await;
    // The collision left the person's instance under the name the daemon had drawn.
    let all = h.fake.calls("create");
    assert!(all >= 2, "the collision failed one creation");
    assert_eq!(h.fake.calls("delete"), 0, "nothing was deleted");
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn own_events_do_not_speed_up_a_stepped_scale_down() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(1.0));
    let stepped = |min: u32| {
        web(min, 6)
            .replace("interval = \"2s\"", "interval = \"8s\"")
            .replace("60s", "0s")
            .replace(
                "[groups.web.config]",
                "max_scale_down_step = 1\n[groups.web.config]",
            )
    };
    let h = Harness::start(&stepped(4), fake);
    eventually("4 running", MINUTE, || h.fake.running("web") == 4).await;
    h.reload(&stepped(1));
    // Every removal's stop and delete events come back at once, as Incus sends them.
    let mut seen = h.fake.managed("web").len();
    let start = tokio::time::Instant::now();
    let mut removals = Vec::new();
    while h.fake.managed("web").len() > 1 {
        assert!(start.elapsed() < 2 * MINUTE, "no progress");
        for (name, _) in h.fake.managed("web") {
            changed(&h, &name);
        }
        let n = h.fake.managed("web").len();
        if n < seen {
            removals.push(start.elapsed());
            seen = n;
        }
        run_for(Duration::from_millis(200)).await;
    }
    for pair in removals.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_secs(7),
            "two removals within one interval: {removals:?}"
        );
    }
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_reload_applies_every_daemon_key_and_a_moved_group_is_left_alone() {
    let fake = Arc::new(FakeIncus::default());
    let h = Harness::start(
        &web(1, 3).replace("interval = \"2s\"", "interval = \"1h\""),
        fake,
    );
    eventually("1 running", MINUTE, || h.fake.running("web") == 1).await;
    // Each pass reads the memory of the running instance (no list: the cache serves).
    let passes = || h.fake.calls("memory_state");
    let before = passes();
    // A shorter interval reschedules the group; a new memory source is used.
    h.reload(&web(1, 3).replace(
        "interval = \"2s\"",
        "interval = \"2s\"\nmemory_source = \"api\"",
    ));
    eventually(
        "reconciled on the new interval",
        Duration::from_secs(10),
        || passes() >= before + 3,
    )
    .await;
    assert_eq!(
        *h.sources.lock().unwrap(),
        vec![MemorySourceKind::Auto, MemorySourceKind::Api]
    );
    // The group moves to another project: its instances in `default` are left alone.
    let before = h.fake.managed("web");
    h.reload(&web(1, 3).replace("[groups.web]", "[groups.web]\nproject = \"elsewhere\""));
    run_for(Duration::from_secs(20)).await;
    for (name, _) in &before {
        assert!(h.fake.exists(name), "{name} was touched after the move");
    }
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_group_backing_off_on_an_outage_is_retried_as_soon_as_incus_is_back() {
    let fake = Arc::new(FakeIncus::default());
    let h = Harness::start(
        &web(1, 3).replace("interval = \"2s\"", "interval = \"1h\""),
        fake,
    );
    eventually("1 running", MINUTE, || h.fake.running("web") == 1).await;
    h.fake.set_unreachable(true);
    // Failures back off 1 s, 2 s, 4 s … : after 5 minutes the next retry is minutes away.
    h.reload(&web(2, 3).replace("interval = \"2s\"", "interval = \"1h\""));
    run_for(Duration::from_secs(300)).await;
    h.fake.set_unreachable(false);
    h.events.send(Event::IncusBack).unwrap();
    // Its lease ran out meanwhile: taken anew at once, and acted on once confirmed, a
    // renewal (5 s) later.
    eventually(
        "acts within seconds of Incus being back",
        Duration::from_secs(8),
        || h.fake.running("web") == 2,
    )
    .await;
    h.shutdown().await;
}
