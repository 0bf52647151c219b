//! Each group's history on disk: a daemon stopped and started again resumes every group from
//! it and decides as if it had never stopped; its passes are on disk as rows.

use std::sync::Arc;
use std::time::Duration;

use crate::fake::{mem, FakeIncus};
use crate::util::{eventually, run_for, Harness};

const MINUTE: Duration = Duration::from_secs(60);

/// A group `web` (Kubernetes' rule, a 60 s scale-down window) whose history is kept in `dir`.
fn web(dir: &std::path::Path) -> String {
    format!(
        r#"
[daemon]
interval = "2s"
state_directory = "{}"

[groups.web]
min = 1
max = 6
memory_threshold = 50
image = "busybox"
policy = "kubernetes"
scale_down_stabilization = "60s"

[groups.web.config]
"limits.memory" = "100MiB"
"#,
        dir.display()
    )
}

#[tokio::test(start_paused = true)]
async fn a_restarted_daemon_holds_a_drop_for_what_is_left_of_the_window_not_a_new_one() {
    let state = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(80.0));
    let h = Harness::start(&web(state.path()), fake.clone());
    eventually("scaled up to 4", MINUTE, || h.fake.running("web") >= 4).await;
    let high = h.fake.running("web");
    // The load drops; 30 s of the 60 s window pass, and the daemon is restarted.
    *fake.default_memory.lock().unwrap() = Some(mem(5.0));
    h.fake.set_group_memory("web", 5.0);
    run_for(Duration::from_secs(30)).await;
    assert_eq!(h.fake.running("web"), high, "held within the window");
    h.shutdown().await;
    let group = state.path().join("groups/web");
    let passes = std::fs::read_to_string(group.join("passes.csv")).unwrap();
    assert!(passes.lines().count() > 15, "a row per pass:\n{passes}");
    assert!(group.join("learned.json").exists());

    let h = Harness::start(&web(state.path()), fake);
    // The window ends 30 s after the restart: a daemon that forgot would hold 60 s.
    eventually(
        "down to 1 when the window that began before the restart ends",
        Duration::from_secs(45),
        || h.fake.running("web") == 1,
    )
    .await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn without_a_state_directory_a_restart_holds_a_whole_window_again() {
    let state = tempfile::tempdir().unwrap();
    let toml = web(state.path()).replace(
        &format!("state_directory = \"{}\"\n", state.path().display()),
        "",
    );
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(80.0));
    let h = Harness::start(&toml, fake.clone());
    eventually("scaled up to 4", MINUTE, || h.fake.running("web") >= 4).await;
    let high = h.fake.running("web");
    h.fake.set_group_memory("web", 5.0);
    run_for(Duration::from_secs(30)).await;
    h.shutdown().await;
    let h = Harness::start(&toml, fake);
    run_for(Duration::from_secs(45)).await;
    assert_eq!(
        h.fake.running("web"),
        high,
        "a new history holds a whole window"
    );
    assert!(
        std::fs::read_dir(state.path()).unwrap().next().is_none(),
        "nothing written"
    );
    h.shutdown().await;
}

/// Six hours of a group `web` of two instances using 57 MiB each, a row every 15 s ending now,
/// written where the daemon keeps its history.
fn six_hours(state: &std::path::Path) {
    use incus_hpa::history::record::{Record, HEADER};
    let now = incus_hpa::history::unix_ms(std::time::SystemTime::now());
    let mut text = format!("{HEADER}\n");
    for k in (0..6 * 240).rev() {
        let row = Record {
            unix_ms: now - k * 15_000,
            current: 2,
            desired: 2,
            demand_mib: Some(114.0),
            limit_mib: Some(128.0),
            memory_pct: Some(44.5),
            cpu_pct: None,
            pressure_pct: None,
            external: None,
            oom_kills: 0,
            reason: "within-tolerance".into(),
        };
        text.push_str(&row.line());
    }
    let dir = state.join("groups/web");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("passes.csv"), text).unwrap();
}

#[tokio::test]
async fn the_daemon_advises_on_a_groups_size_from_its_history_in_status_and_metrics() {
    let state = tempfile::tempdir().unwrap();
    six_hours(state.path());
    let toml = web(state.path())
        .replace("min = 1\n", "min = 2\n")
        .replace("memory_threshold = 50", "memory_threshold = 60")
        .replace("\"100MiB\"", "\"128MiB\"");
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(44.5));
    let h = Harness::start(&toml, fake);
    // The advice is found on a thread of its own, at once for a group with a history (a
    // thread at the lowest priority: on a machine busy with the other tests, it may wait).
    let advice = crate::util::within(Duration::from_secs(120), async {
        loop {
            let status = h.telemetry.status();
            if let Some(a) = status.groups.iter().find_map(|g| g.advice.clone()) {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // Each instance's 57 MiB (4 of base) at 60 %: 96 MiB holds two at 59 %, 64 or 80 need
    // a third, 112 or more reserve more (as `incus-hpa advise` finds, by minute here).
    assert_eq!(advice.current.limit_mib, 128.0, "{advice:#?}");
    assert_eq!(advice.advised.limit_mib, 96.0, "{advice:#?}");
    assert!((advice.hours - 6.0).abs() < 0.05, "{}", advice.hours);
    assert!(advice.saving() > 0.2, "{advice:#?}");
    let metrics = h.telemetry.metrics();
    assert!(
        metrics.contains(&format!(
            "incus_hpa_advised_memory_limit_bytes{{group=\"web\",project=\"default\"}} {}",
            96 << 20
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "incus_hpa_advised_memory_saving_ratio{group=\"web\",project=\"default\"} 0.2"
        ),
        "{metrics}"
    );
    let detail = incus_hpa::control::detail::detail(&h.telemetry.status().groups[0], Err("-"), 0);
    assert!(
        detail.contains("advice       limits.memory 96 MiB instead of 128: 25% less memory"),
        "{detail}"
    );
    // Another size in the file: the advice is found again for it, not an hour later.
    h.reload(&toml.replace("\"128MiB\"", "\"256MiB\""));
    let size = || {
        h.telemetry.status().groups[0]
            .advice
            .as_ref()
            .map(|a| a.current.limit_mib)
    };
    crate::util::within(Duration::from_secs(120), async {
        while size() != Some(256.0) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    h.shutdown().await;
}
