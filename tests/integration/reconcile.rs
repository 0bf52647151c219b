//! The daemon loop against the fake Incus: scaling, ownership, failures, reloads, shutdown.

use std::sync::Arc;
use std::time::Duration;

use incus_hpa::model::GROUP_KEY;

use crate::fake::{mem, FakeIncus, CREATE_TIME, FAILS_TO_START, MISSING_IMAGE};
use crate::util::{eventually, run_for, web, within, Harness};

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn starts_from_zero_and_reaches_min() {
    let h = Harness::start(&web(2, 5), Arc::new(FakeIncus::default()));
    eventually("2 running", MINUTE, || h.fake.running("web") == 2).await;
    for (name, _) in h.fake.managed("web") {
        assert!(
            name.starts_with("web-") && name.len() == "web-".len() + 6,
            "{name}"
        );
        let i = h.fake.get_instance(&name).unwrap();
        assert_eq!(i.config["limits.memory"], "100MiB");
        assert_eq!(i.config[GROUP_KEY], "web");
    }
    run_for(Duration::from_secs(10)).await;
    assert_eq!(h.fake.running("web"), 2, "stays at min");
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn scales_up_on_memory_then_down_after_the_window() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(10.0));
    let h = Harness::start(&web(1, 4), fake);
    eventually("1 running", MINUTE, || h.fake.running("web") == 1).await;

    // 1 instance at 150 % of the 50 % target -> ceil(1 × 90 / 50) = 2.
    h.fake.set_group_memory("web", 90.0);
    eventually("scaled up to 2", MINUTE, || h.fake.running("web") == 2).await;
    let first_two = h.fake.managed("web");

    // Both busy: 2 × 90 / 50 -> 4 (max).
    h.fake.set_group_memory("web", 90.0);
    eventually("scaled up to 4", MINUTE, || h.fake.running("web") == 4).await;

    // Load gone: held during the 60 s window, then down to min, newest removed first.
    h.fake.set_group_memory("web", 1.0);
    run_for(Duration::from_secs(40)).await;
    assert_eq!(
        h.fake.running("web"),
        4,
        "held during the stabilization window"
    );
    eventually("back to min", MINUTE, || h.fake.running("web") == 1).await;
    let left = &h.fake.managed("web")[0].0;
    assert!(
        first_two.iter().any(|(n, _)| n == left),
        "the oldest survives"
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn never_touches_instances_it_did_not_create() {
    let fake = Arc::new(FakeIncus::default());
    fake.add("web-manual", "Running", &[]);
    fake.add("web-other", "Running", &[(GROUP_KEY, "WEB")]); // case differs: not ours
    fake.add("web-stopped", "Stopped", &[(GROUP_KEY, "webby")]);
    fake.add("api-1", "Running", &[(GROUP_KEY, "api")]);
    let h = Harness::start(&web(0, 1), fake);
    // max 1 with 0 managed: nothing to do; then min 2 max 2; then back to 0..1.
    run_for(Duration::from_secs(5)).await;
    h.reload(&web(2, 2));
    eventually("2 managed", MINUTE, || h.fake.running("web") == 2).await;
    h.fake.set_group_memory("web", 0.0);
    h.reload(&web(0, 1).replace("60s", "1s"));
    eventually("down to 1", MINUTE, || h.fake.managed("web").len() == 1).await;
    for name in ["web-manual", "web-other", "web-stopped", "api-1"] {
        assert!(h.fake.exists(name), "{name} was touched");
    }
    assert_eq!(
        h.fake.get_instance("web-stopped").unwrap().status,
        "Stopped"
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn missing_metrics_never_scale_down() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(1.0));
    let h = Harness::start(&web(3, 5).replace("60s", "1s"), fake);
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    h.reload(&web(1, 5).replace("60s", "1s"));
    let victim = h.fake.managed("web")[0].0.clone();
    h.fake.set_memory(&victim, None);
    run_for(Duration::from_secs(30)).await;
    assert_eq!(
        h.fake.running("web"),
        3,
        "no scale-down while a reading is missing"
    );
    h.fake.set_memory(&victim, Some(mem(1.0)));
    eventually("down to 1 once readings are back", MINUTE, || {
        h.fake.running("web") == 1
    })
    .await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_group_does_not_stop_the_others_and_leaves_nothing_behind() {
    let toml = format!(
        "{}\n[groups.bad]\nmax = 2\nmemory_threshold = 50\nimage = \"{FAILS_TO_START}\"\n\
         [groups.gone]\nmax = 2\nmemory_threshold = 50\nimage = \"{MISSING_IMAGE}\"\n",
        web(2, 3)
    );
    let h = Harness::start(&toml, Arc::new(FakeIncus::default()));
    eventually("web reaches min", MINUTE, || h.fake.running("web") == 2).await;
    run_for(Duration::from_secs(30)).await;
    assert!(
        h.fake.managed("bad").is_empty(),
        "a failed start is cleaned up"
    );
    assert!(h.fake.managed("gone").is_empty());
    // Backoff: far fewer attempts than one per 2 s interval over 30 s (1+2+4+8+16 s).
    let creates = h.fake.calls("create");
    assert!(creates <= 2 + 2 * 6, "{creates} create calls");
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn stopped_managed_instances_are_started_again() {
    let fake = Arc::new(FakeIncus::default());
    fake.add_owned("web", "web-left01", "Stopped");
    let h = Harness::start(&web(1, 3), fake);
    eventually("restarted", MINUTE, || h.fake.running("web") == 1).await;
    assert_eq!(
        h.fake.managed("web"),
        vec![("web-left01".to_owned(), "Running".to_owned())],
        "started, not replaced"
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn incus_outage_is_survived() {
    let h = Harness::start(&web(1, 3), Arc::new(FakeIncus::default()));
    eventually("1 running", MINUTE, || h.fake.running("web") == 1).await;
    h.fake.set_down(true);
    run_for(Duration::from_secs(20)).await;
    h.fake.set_down(false);
    h.reload(&web(2, 3));
    eventually("acts again after the outage", MINUTE, || {
        h.fake.running("web") == 2
    })
    .await;
    assert!(!h.task.is_finished());
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_bad_reload_keeps_the_last_good_state_and_a_removed_group_is_left_alone() {
    let h = Harness::start(&web(1, 3), Arc::new(FakeIncus::default()));
    eventually("1 running", MINUTE, || h.fake.running("web") == 1).await;
    h.reload("[groups.web]\nmax = 0\n");
    run_for(Duration::from_secs(5)).await;
    assert_eq!(h.fake.running("web"), 1);
    h.reload(&web(3, 3));
    eventually("raised min applied", MINUTE, || h.fake.running("web") == 3).await;
    h.reload("[daemon]\ninterval = \"2s\"\n");
    run_for(Duration::from_secs(30)).await;
    assert_eq!(
        h.fake.running("web"),
        3,
        "instances of a removed group are left alone"
    );
    // Nothing of it is left in the metrics and the status: its counters go with it.
    let metrics = h.telemetry.metrics();
    assert!(!metrics.contains("group=\"web\""), "{metrics}");
    assert!(h.telemetry.status().groups.is_empty());
    let state = h.shutdown().await;
    assert!(state.groups.is_empty());
}

#[tokio::test(start_paused = true)]
async fn shutdown_finishes_the_action_in_flight_and_starts_no_new_one() {
    let one_at_a_time = web(5, 5).replace("[daemon]", "[daemon]\nmax_parallel_actions = 1");
    let h = Harness::start(&one_at_a_time, Arc::new(FakeIncus::default()));
    // Creations take 200 ms each, from when the lease is confirmed: ask to stop during the
    // third one (the first is seen within 100 ms of its start).
    eventually("the first creation", MINUTE, || h.fake.calls("create") >= 1).await;
    run_for(CREATE_TIME * 2).await;
    let Harness {
        events, task, fake, ..
    } = h;
    events.send(incus_hpa::daemon::Event::Shutdown).unwrap();
    within(MINUTE, task).await.unwrap();
    assert_eq!(
        fake.running("web"),
        3,
        "the third creation completed, no fourth began"
    );
    assert_eq!(fake.calls("create"), 3);
}

#[tokio::test(start_paused = true)]
async fn actions_run_four_at_a_time_and_a_shutdown_lets_those_in_flight_finish() {
    let h = Harness::start(&web(10, 10), Arc::new(FakeIncus::default()));
    // Four creations at once (the default), 200 ms each: stop during the second wave (the
    // first is seen within 100 ms of its start).
    eventually("the first wave", MINUTE, || h.fake.calls("create") >= 1).await;
    run_for(CREATE_TIME).await;
    assert_eq!(h.fake.calls("create"), 8, "two waves of four");
    let Harness {
        events, task, fake, ..
    } = h;
    events.send(incus_hpa::daemon::Event::Shutdown).unwrap();
    within(MINUTE, task).await.unwrap();
    assert_eq!(
        fake.running("web"),
        8,
        "the second wave completed, no third began"
    );
}

#[tokio::test(start_paused = true)]
async fn waiting_for_incus_remembers_a_reload_and_honours_a_shutdown() {
    use incus_hpa::daemon::{wait_for_incus, Event, Waited};
    use incus_hpa::reconciler::Context;

    let fake = Arc::new(FakeIncus::default());
    let memory = fake.clone();
    let ctx = Context {
        incus: fake.clone(),
        store: Default::default(),
        memory: std::sync::Arc::new(move |_| memory.clone()),
        stop: Default::default(),
        telemetry: Default::default(),
        leases: std::sync::Arc::new(incus_hpa::lease::Leases::new(Duration::from_secs(15))),
        ready: Default::default(),
        endpoints: Default::default(),
    };
    fake.set_down(true);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(Event::Reload).unwrap();
    let up = fake.clone();
    tokio::spawn(async move {
        run_for(Duration::from_secs(10)).await;
        up.set_down(false);
    });
    let waited = within(MINUTE, wait_for_incus(&ctx, &mut rx)).await;
    assert_eq!(waited, Waited::Ready { reload: true });
    assert!(fake.calls("server_version") > 2, "retried while down");

    fake.set_down(true);
    tx.send(Event::Shutdown).unwrap();
    assert_eq!(
        within(MINUTE, wait_for_incus(&ctx, &mut rx)).await,
        Waited::Shutdown
    );
}

#[tokio::test(start_paused = true)]
async fn an_instance_event_wakes_its_groups_but_not_one_backing_off() {
    use incus_hpa::daemon::Event;
    let toml = web(2, 3).replace("interval = \"2s\"", "interval = \"1h\"")
        + &format!(
            "\n[groups.bad]\nmax = 2\nmemory_threshold = 50\nimage = \"{FAILS_TO_START}\"\n"
        );
    let h = Harness::start(&toml, Arc::new(FakeIncus::default()));
    eventually("2 running", MINUTE, || h.fake.running("web") == 2).await;
    let creates = h.fake.calls("create");

    // Someone deletes one; Incus says so: replaced long before the 1 h interval.
    let victim = h.fake.managed("web")[0].0.clone();
    h.fake.remove(&victim);
    h.events
        .send(Event::InstanceChanged {
            project: "default".into(),
            name: victim.clone(),
        })
        .unwrap();
    eventually("replaced", MINUTE, || h.fake.running("web") == 2).await;
    assert!(!h.fake.exists(&victim));

    // A storm of events does not make the failing group retry faster than its backoff
    // (1 s, 2 s, 4 s … over these 10 s: at most a handful of attempts).
    for _ in 0..50 {
        h.events
            .send(Event::InstanceChanged {
                project: "default".into(),
                name: "bad-x1y2z3".into(),
            })
            .unwrap();
        run_for(Duration::from_millis(200)).await;
    }
    let bad_attempts = h.fake.calls("create") - creates - 1;
    assert!(
        bad_attempts <= 5,
        "{bad_attempts} attempts for the failing group"
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn removals_never_run_beside_creations_in_a_pass() {
    let toml = web(2, 4).replace(
        "[groups.web.config]",
        "unhealthy_grace = \"0s\"\n[groups.web.config]",
    );
    let h = Harness::start(&toml, Arc::new(FakeIncus::default()));
    eventually("2 running", MINUTE, || h.fake.running("web") == 2).await;
    // Both in error: one pass replaces them (creations) and removes them (grace 0).
    for (name, _) in h.fake.managed("web") {
        h.fake.set_status(&name, "Error");
    }
    eventually("2 new ones running, the broken gone", MINUTE, || {
        h.fake.running("web") == 2 && h.fake.managed("web").len() == 2
    })
    .await;
    assert_eq!(
        h.fake.overlaps(),
        0,
        "a stop or delete ran beside a creation"
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_reading_at_the_limit_wakes_an_adaptive_group_long_before_its_interval() {
    // Both instances fill up to their limit, or to 58 % (above 50 % and its tolerance, 0.1),
    // or to 53 % (within it), between two passes of the 1 h interval: the watch reads it, and
    // the adaptive group grows at once at the limit and above the tolerance; Kubernetes waits
    // for its next period.
    for (policy, percent, wakes) in [
        ("adaptive", 99.0, true),
        ("adaptive", 58.0, true),
        ("adaptive", 53.0, false),
        ("kubernetes", 99.0, false),
    ] {
        let toml = web(2, 6)
            .replace("interval = \"2s\"", "interval = \"1h\"")
            .replace(
                "memory_threshold = 50\n",
                &format!("memory_threshold = 50\npolicy = \"{policy}\"\n"),
            );
        let fake = Arc::new(FakeIncus::default());
        *fake.default_memory.lock().unwrap() = Some(mem(30.0));
        let h = Harness::start(&toml, fake);
        eventually("2 running", MINUTE, || h.fake.running("web") == 2).await;
        run_for(Duration::from_secs(10)).await;
        h.fake.set_group_memory("web", percent);
        run_for(Duration::from_secs(30)).await;
        assert_eq!(h.fake.running("web") > 2, wakes, "{policy} at {percent} %");
        h.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn instances_a_pass_added_that_reach_their_limit_too_wake_the_next_pass() {
    // Every instance fills up to its limit as soon as it runs, on a 1 h interval. The first
    // pass creates one; at its limit, it wakes the next, which triples it (one held down may
    // be just over); the two added reach their limit too, which wakes the next pass at once
    // (3 → 7), and so on to the group's max: within seconds, not once an hour.
    let toml = web(1, 12)
        .replace("interval = \"2s\"", "interval = \"1h\"")
        .replace(
            "memory_threshold = 50\n",
            "memory_threshold = 50\npolicy = \"adaptive\"\n",
        );
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(99.5));
    let h = Harness::start(&toml, fake);
    eventually("12 running", MINUTE, || h.fake.running("web") == 12).await;
    h.shutdown().await;
}
