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
