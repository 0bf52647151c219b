//! Operator controls against the fake Incus: a paused group holds still until it is resumed by
//! an edit, and a protected instance survives a scale-down.

use std::sync::Arc;
use std::time::Duration;

use crate::fake::{mem, FakeIncus};
use crate::util::{eventually, run_for, web, Harness};

const MINUTE: Duration = Duration::from_secs(60);

fn paused(toml: &str) -> String {
    toml.replace("[groups.web.config]", "paused = true\n[groups.web.config]")
}

#[tokio::test(start_paused = true)]
async fn a_paused_group_holds_still_and_moves_once_resumed() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(90.0));
    let h = Harness::start(&web(1, 4), fake);
    eventually("1 running", MINUTE, || h.fake.running("web") == 1).await;
    // Over threshold: paused from whatever it reached by then.
    h.reload(&paused(&web(1, 4)));
    run_for(Duration::from_secs(3)).await;
    let creates = h.fake.calls("create");
    let deletes = h.fake.calls("delete");
    let starts = h.fake.calls("change_state");
    // A stopped instance is not even restarted while paused.
    let victim = h.fake.managed("web")[0].0.clone();
    h.fake.set_status(&victim, "Stopped");
    run_for(Duration::from_secs(30)).await;
    assert_eq!(h.fake.calls("create"), creates, "created while paused");
    assert_eq!(h.fake.calls("delete"), deletes, "deleted while paused");
    assert_eq!(h.fake.calls("change_state"), starts, "started while paused");
    // Resumed by an edit: it acts at once.
    h.reload(&web(1, 4));
    eventually("4 running after the resume", MINUTE, || {
        h.fake.running("web") == 4
    })
    .await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_protected_instance_survives_a_scale_down_to_min() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(90.0));
    let toml = web(1, 3).replace("\"60s\"", "\"4s\"");
    let h = Harness::start(&toml, fake);
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    // The newest would go first: protect it.
    let newest = h
        .fake
        .managed("web")
        .into_iter()
        .max_by_key(|(n, _)| h.fake.get_instance(n).unwrap().created)
        .unwrap()
        .0;
    h.fake
        .set_config(&newest, "user.incus-hpa.protected", Some("true"));
    h.fake.set_group_memory("web", 5.0);
    eventually("back to 1", MINUTE, || h.fake.running("web") == 1).await;
    assert_eq!(
        h.fake.managed("web"),
        vec![(newest, "Running".to_owned())],
        "the protected instance is the one left"
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_status_board_and_metrics_follow_the_group() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(90.0));
    let h = Harness::start(&web(1, 3), fake);
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    eventually("the board shows 3", MINUTE, || {
        h.telemetry
            .status()
            .groups
            .first()
            .is_some_and(|g| g.current == 3)
    })
    .await;
    let g = h.telemetry.status().groups[0].clone();
    assert_eq!((g.name.as_str(), g.project.as_str()), ("web", "default"));
    assert_eq!((g.desired, g.min, g.max, g.paused), (3, 1, 3, false));
    let last = g.last_action.expect("a last action");
    assert_eq!(
        (last.kind.as_str(), last.outcome.as_str()),
        ("create", "ok")
    );
    assert!(g.next_pass.is_some());
    let text = h.telemetry.metrics();
    for line in [
        "incus_hpa_instances{group=\"web\",project=\"default\",state=\"current\"} 3",
        "incus_hpa_instances{group=\"web\",project=\"default\",state=\"max\"} 3",
        "incus_hpa_actions_total{group=\"web\",project=\"default\",kind=\"create\",outcome=\"ok\"} 3",
        "incus_hpa_paused{group=\"web\",project=\"default\"} 0",
        "incus_hpa_build_info{version=\"",
        "incus_hpa_action_duration_seconds_count{kind=\"create\"} 3",
        "incus_hpa_reconcile_duration_seconds_bucket{le=",
        "incus_hpa_event_stream_reconnects_total 0",
        "# EOF",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    // The event stream drops and comes back: counted.
    h.fake.drop_followers();
    eventually("a reconnection counted", MINUTE, || {
        h.telemetry
            .metrics()
            .contains("incus_hpa_event_stream_reconnects_total 1")
    })
    .await;
    // Paused by an edit: the board and the gauge say so.
    h.reload(&paused(&web(1, 3)));
    eventually("paused on the board", MINUTE, || {
        h.telemetry.status().groups[0].paused
    })
    .await;
    assert!(h
        .telemetry
        .metrics()
        .contains("incus_hpa_paused{group=\"web\",project=\"default\"} 1"));
    h.shutdown().await;
}

#[tokio::test]
async fn the_control_socket_serves_status_and_metrics_and_nothing_else() {
    use incus_hpa::control::{self, Status, Telemetry};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.sock");
    let t = Arc::new(Telemetry::default());
    t.publish(crate::util::web_status());
    tokio::spawn(control::serve(control::bind(&path).unwrap(), t));
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o660);
    // A second daemon does not take a socket that answers, nor a path that is not a socket.
    assert!(control::bind(&path).is_err());
    let file = dir.path().join("desired-state.toml");
    std::fs::write(&file, "keep").unwrap();
    assert!(control::bind(&file).is_err());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    incus_hpa::incus::tls::provider();
    let client = reqwest::Client::builder()
        .unix_socket(path.as_path())
        .build()
        .unwrap();
    let get = |p: &str| client.get(format!("http://x{p}")).send();
    let status: Status = get("/status").await.unwrap().json().await.unwrap();
    assert_eq!(status.groups[0].desired, 3);
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("incus_hpa_utilization_percent{group=\"web\",project=\"default\"} 71.5"),
        "{metrics}"
    );
    assert_eq!(get("/other").await.unwrap().status(), 404);
    let post = client.post("http://x/status").send().await.unwrap();
    assert_eq!(post.status(), 405);
    // The CLI: a table, the JSON, and a clear exit 1 when nothing answers. No TLS is involved:
    // a host without certificate authorities (a minimal container) is no obstacle.
    let bin = env!("CARGO_BIN_EXE_incus-hpa");
    let table = tokio::process::Command::new(bin)
        .args(["status", "--control-socket"])
        .arg(&path)
        .env("SSL_CERT_FILE", "/nonexistent")
        .env("SSL_CERT_DIR", "/nonexistent")
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.status.success() && out.contains("| web ") && out.contains("71.5%"),
        "{out}"
    );
    assert!(
        out.lines().all(|l| l.chars().count() <= 100),
        "the table fits in 100 columns:\n{out}"
    );
    // The group in detail: the scale-down window in force, and why; no history here.
    let detail = tokio::process::Command::new(bin)
        .args(["status", "web", "--control-socket"])
        .arg(&path)
        .args(["--config", "/nonexistent"])
        .env("STATE_DIRECTORY", "/nonexistent")
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&detail.stdout);
    assert!(
        detail.status.success()
            && out.contains("window       holding 1m 30s after drops (learned: 3")
            && out.contains("last hour    no pass recorded"),
        "{out}"
    );
    let unknown = tokio::process::Command::new(bin)
        .args(["status", "db", "--control-socket"])
        .arg(&path)
        .output()
        .await
        .unwrap();
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no group \"db\" (its groups: web)"));
    let json = tokio::process::Command::new(bin)
        .args(["status", "--json", "--control-socket"])
        .arg(&path)
        .output()
        .await
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["groups"][0]["utilization"], 71.5);
    assert!(doc["groups"][0]["scale_down_window"]
        .as_str()
        .is_some_and(|w| w.contains("came back within 1m 30s")));
    // Without --control-socket, the one the desired-state file names.
    let conf = dir.path().join("named.toml");
    std::fs::write(
        &conf,
        format!(
            "[daemon]\ncontrol_socket = {:?}\n",
            path.display().to_string()
        ),
    )
    .unwrap();
    let named = tokio::process::Command::new(bin)
        .args(["status", "--json", "-c"])
        .arg(&conf)
        .output()
        .await
        .unwrap();
    assert!(named.status.success(), "{named:?}");
    let none = tokio::process::Command::new(bin)
        .args(["status", "--control-socket"])
        .arg(dir.path().join("nothing.sock"))
        .output()
        .await
        .unwrap();
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no incus-hpa daemon is running"));
}

/// A daemon that accepts the connection and never answers (stuck, or a process that is not
/// incus-hpa on its socket) does not hang `incus-hpa status`: exit 1 after `--timeout`, saying
/// so. Each connection is held open, unread, until the test ends.
#[tokio::test]
async fn status_gives_up_on_a_daemon_that_never_answers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stuck.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            conns.push(conn);
        }
    });
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .args(["status", "--timeout", "1s", "--control-socket"])
        .arg(&path)
        .output()
        .await
        .unwrap();
    held.abort();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("did not answer within 1s"), "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");
}

fn draining(toml: &str, timeout: &str) -> String {
    toml.replace(
        "[groups.web.config]",
        &format!(
            "drain_command = [\"/bin/sh\", \"-c\", \"drain\"]\ndrain_timeout = \"{timeout}\"\n\
             [groups.web.config]"
        ),
    )
}

#[tokio::test(start_paused = true)]
async fn a_drain_runs_before_each_removal_and_a_failed_or_slow_one_still_removes() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(90.0));
    let toml = draining(&web(1, 3).replace("\"60s\"", "\"4s\""), "5s");
    let h = Harness::start(&toml, fake);
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    // The first removal's drain fails, the second's hangs past its timeout.
    h.fake.set_drain(3, None);
    h.fake.set_group_memory("web", 30.0);
    eventually("2 left", MINUTE, || h.fake.managed("web").len() == 2).await;
    h.fake.set_drain(0, Some(Duration::from_secs(3600)));
    h.fake.set_group_memory("web", 5.0);
    eventually("1 left", MINUTE, || h.fake.managed("web").len() == 1).await;
    let drains = h.fake.drains();
    assert_eq!(drains.len(), 2, "{drains:?}");
    for (name, command) in &drains {
        assert!(!h.fake.exists(name), "{name} was drained and kept");
        assert_eq!(command, &["/bin/sh", "-c", "drain"]);
    }
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_protected_while_it_drains_survives() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(90.0));
    let toml = draining(&web(1, 2).replace("\"60s\"", "\"4s\""), "5m");
    let h = Harness::start(&toml, fake);
    eventually("2 running", MINUTE, || h.fake.running("web") == 2).await;
    h.fake.set_drain(0, Some(MINUTE));
    h.fake.set_group_memory("web", 5.0);
    eventually("a drain", MINUTE, || h.fake.drains().len() == 1).await;
    // Shown as draining: its operator protects it.
    let (draining, _) = h.fake.drains().remove(0);
    h.fake
        .set_config(&draining, "user.incus-hpa.protected", Some("true"));
    // The other one goes instead.
    eventually("1 left", 5 * MINUTE, || h.fake.managed("web").len() == 1).await;
    assert_eq!(
        h.fake.managed("web"),
        vec![(draining, "Running".to_owned())],
        "the instance protected while it drained is the one left"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn metrics_address_serves_the_metrics_and_not_the_status() {
    use incus_hpa::control::{self, Telemetry};
    let t = Arc::new(Telemetry::default());
    t.error("web", "default");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(control::serve_metrics(listener, t));
    incus_hpa::incus::tls::provider();
    let client = reqwest::Client::new();
    let get = |p: &str| client.get(format!("http://{addr}{p}")).send();
    let metrics = get("/metrics").await.unwrap();
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.unwrap();
    assert!(
        text.contains("incus_hpa_reconcile_errors_total{group=\"web\",project=\"default\"} 1"),
        "{text}"
    );
    // What the daemon thinks of each group stays on the unix socket, for its group's members.
    assert_eq!(get("/status").await.unwrap().status(), 404);
    let post = client.post(format!("http://{addr}/metrics")).send();
    assert_eq!(post.await.unwrap().status(), 405);
}
