//! Endpoints against the fake Incus: a hook script of the test's (root's, mode 0755, in a
//! directory of its own) appends the time and what it read on stdin to a file; the daemon
//! loop runs it at start, once a new instance is ready (a TCP check on a listener of the
//! test, at the fake's 127.0.0.1), and before a removal's delete, which comes no sooner than
//! `deregistration_delay` after; a hook that fails holds the removal until it succeeds; a
//! standby runs nothing.
//!
//! These run in real time (short periods), as tests/integration/ready.rs does.

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use incus_hpa::config;
use incus_hpa::control::Telemetry;
use incus_hpa::daemon::{run_loop, Event};
use incus_hpa::events::follow;
use incus_hpa::informer::Store;
use incus_hpa::lease::{Clocks, Leases};
use incus_hpa::model::{DesiredState, EndpointsSpec, Probe, ReadySpec};
use incus_hpa::reconciler::Context;
use tokio::net::TcpListener;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use crate::fake::FakeIncus;

/// The hook: its directory, the file it appends to, and the file whose presence fails it.
struct Hook {
    dir: tempfile::TempDir,
    script: PathBuf,
}

impl Hook {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let script = dir.path().join("hook");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n\
                 if [ -e {d}/fail ]; then echo \"refused by the test\" >&2; exit 1; fi\n\
                 printf '%s ' \"$(date +%s.%N)\" >> {d}/out\n\
                 cat >> {d}/out\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir, script }
    }

    fn fail(&self, fail: bool) {
        let flag = self.dir.path().join("fail");
        if fail {
            std::fs::write(flag, "").unwrap();
        } else {
            let _ = std::fs::remove_file(flag);
        }
    }

    /// Each run: when (seconds since the epoch) and the instances it was given, in order.
    fn runs(&self) -> Vec<(f64, Vec<String>)> {
        let text = std::fs::read_to_string(self.dir.path().join("out")).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                let (at, json) = line.split_once(' ')?;
                let v: serde_json::Value = serde_json::from_str(json).ok()?;
                assert_eq!(v["group"], "web");
                assert_eq!(v["project"], "default");
                let names = v["endpoints"]
                    .as_array()?
                    .iter()
                    .map(|e| {
                        assert_eq!(e["address"], "127.0.0.1");
                        assert_eq!(e["port"], 80);
                        e["instance"].as_str().unwrap().to_owned()
                    })
                    .collect();
                Some((at.parse().ok()?, names))
            })
            .collect()
    }

    /// The instances of the last run.
    fn last(&self) -> Option<Vec<String>> {
        self.runs().pop().map(|(_, names)| names)
    }
}

/// A TCP listener on 127.0.0.1 that accepts everything: the ready check's port.
async fn listener() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move { while l.accept().await.is_ok() {} });
    port
}

fn toml(min: u32, max: u32) -> String {
    format!(
        r#"
[daemon]
interval = "500ms"

[groups.web]
min = {min}
max = {max}
memory_threshold = 50
image = "busybox"
scale_down_stabilization = "0s"

[groups.web.config]
"limits.memory" = "100MiB"
"#
    )
}

/// `state` with a TCP check on `port` every 200 ms and the hook's endpoints.
fn served(mut state: DesiredState, port: u16, hook: &Path) -> DesiredState {
    for g in state.groups.values_mut() {
        let spec = ReadySpec::with_probe(Probe::Tcp { port });
        g.ready = Some(ReadySpec {
            period: Duration::from_millis(200),
            timeout: Duration::from_millis(150),
            ..spec
        });
        g.endpoints = Some(EndpointsSpec {
            port: 80,
            command: vec![hook.display().to_string()],
            timeout: Duration::from_secs(2),
            deregistration_delay: Duration::from_secs(1),
        });
    }
    state
}

struct Daemon {
    telemetry: Arc<Telemetry>,
    events: UnboundedSender<Event>,
    task: JoinHandle<DesiredState>,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

fn start(id: &str, toml: &str, fake: Arc<FakeIncus>, port: u16, hook: &Hook) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("desired-state.toml");
    std::fs::write(&file, toml).unwrap();
    let loaded = config::load(&file).unwrap_or_else(|e| panic!("{:#?}", e.diagnostics));
    let script = hook.script.clone();
    let state = served(loaded.state, port, &script);
    let store = Arc::new(Store::default());
    let telemetry = Arc::new(Telemetry::default());
    let memory = fake.clone();
    let ctx = Context {
        incus: fake.clone(),
        store: store.clone(),
        memory: Arc::new(move |_| memory.clone()),
        stop: Default::default(),
        telemetry: telemetry.clone(),
        leases: Arc::new(Leases::with(
            id.into(),
            None,
            state.daemon.lease,
            Clocks::tokio(),
        )),
        ready: Default::default(),
        endpoints: Default::default(),
    };
    tokio::spawn(ctx.leases.clone().keep(fake.clone()));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(follow(
        fake.clone(),
        fake.clone(),
        store,
        tx.clone(),
        telemetry.reconnects.clone(),
    ));
    let reload = file.clone();
    let task = tokio::spawn(run_loop(
        ctx,
        state,
        Box::new(move || {
            config::load(&reload).map(|mut l| {
                l.state = served(l.state, port, &script);
                l
            })
        }),
        rx,
    ));
    Daemon {
        telemetry,
        events: tx,
        task,
        file,
        _dir: dir,
    }
}

impl Daemon {
    async fn shutdown(self) {
        self.events.send(Event::Shutdown).unwrap();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the loop ends")
            .unwrap();
    }

    fn reload(&self, toml: &str) {
        std::fs::write(&self.file, toml).unwrap();
        self.events.send(Event::Reload).unwrap();
    }
}

/// Polls `what` every 20 ms until it gives something, or panics after `within` (real time).
async fn until<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn running(fake: &FakeIncus) -> Vec<String> {
    let mut names: Vec<String> = fake
        .managed("web")
        .into_iter()
        .filter(|(_, s)| s == "Running")
        .map(|(n, _)| n)
        .collect();
    names.sort();
    names
}

/// Asserts that the hook was given a set without `name` before its delete, and that the
/// delete came no sooner than the deregistration delay (1 s) after that run.
fn deregistered_before_delete(hook: &Hook, fake: &FakeIncus, name: &str) {
    let deleted = fake
        .deletions()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, at)| secs(at))
        .expect("deleted");
    let runs = hook.runs();
    let had = runs
        .iter()
        .position(|(_, names)| names.iter().any(|n| n == name))
        .expect("it was published");
    let (left_at, _) = runs[had..]
        .iter()
        .find(|(_, names)| !names.iter().any(|n| n == name))
        .unwrap_or_else(|| panic!("no run without {name} after it was in: {runs:?}"));
    assert!(
        deleted >= left_at + 1.0,
        "{name} deleted at {deleted}, out of the set at {left_at}: before the delay"
    );
}

#[tokio::test]
async fn the_set_follows_the_group_and_a_removal_waits_for_it() {
    let port = listener().await;
    let hook = Hook::new();
    let fake = Arc::new(FakeIncus::default());
    fake.set_group_memory("web", 10.0);
    *fake.default_memory.lock().unwrap() = Some(crate::fake::mem(10.0));
    let d = start("host-a:1:aaaa", &toml(1, 3), fake.clone(), port, &hook);
    // At start: published, then with the instance once it is ready.
    let first = until("an instance runs", Duration::from_secs(20), || {
        running(&fake).first().cloned()
    })
    .await;
    until("the instance is published", Duration::from_secs(20), || {
        (hook.last() == Some(vec![first.clone()])).then_some(())
    })
    .await;
    // The hook wrote down the set while it ran: the daemon records it as published once the
    // run has ended.
    let e = until("the set in status", Duration::from_secs(20), || {
        let status = d.telemetry.status();
        let e = status.groups[0]
            .endpoints
            .clone()
            .expect("endpoints in status");
        (!e.published.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(e.published.len(), 1);
    assert_eq!(e.published[0].instance, first);
    assert_eq!(e.error, None);

    // A scale-up: the new instance is published once ready.
    *fake.default_memory.lock().unwrap() = Some(crate::fake::mem(90.0));
    fake.set_group_memory("web", 90.0);
    let two = until("two instances published", Duration::from_secs(30), || {
        hook.last().filter(|names| names.len() >= 2)
    })
    .await;
    assert!(two.contains(&first));

    // A scale-down: each removed instance leaves the set before its delete.
    *fake.default_memory.lock().unwrap() = Some(crate::fake::mem(10.0));
    fake.set_group_memory("web", 10.0);
    until("back to one instance", Duration::from_secs(30), || {
        (fake.managed("web").len() == 1).then_some(())
    })
    .await;
    // The ones that were in service left the set first; one still starting (never
    // published) may have gone at once.
    let published: Vec<String> = fake
        .deletions()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| hook.runs().iter().any(|(_, names)| names.contains(n)))
        .collect();
    assert!(!published.is_empty(), "{:?}", fake.deletions());
    for name in &published {
        deregistered_before_delete(&hook, &fake, name);
    }
    until(
        "the last set is the one left",
        Duration::from_secs(20),
        || (hook.last() == Some(running(&fake))).then_some(()),
    )
    .await;
    d.shutdown().await;
}

#[tokio::test]
async fn a_failing_hook_holds_the_removal_until_it_succeeds() {
    let port = listener().await;
    let hook = Hook::new();
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(crate::fake::mem(10.0));
    let d = start("host-a:1:aaaa", &toml(2, 2), fake.clone(), port, &hook);
    until("two instances published", Duration::from_secs(30), || {
        hook.last().filter(|names| names.len() == 2)
    })
    .await;
    let before = hook.runs().len();
    hook.fail(true);
    d.reload(&toml(1, 1));
    // The reload's run fails, and so does the removal's: held, the instance still there.
    until("the removal is held", Duration::from_secs(30), || {
        let status = d.telemetry.status();
        let g = &status.groups[0];
        let held = g
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("held the removal"));
        let failing = g
            .endpoints
            .as_ref()
            .and_then(|e| e.error.clone())
            .is_some_and(|e| e.contains("refused by the test"));
        (held && failing).then_some(())
    })
    .await;
    assert_eq!(fake.managed("web").len(), 2, "nothing removed while held");
    assert!(fake.deletions().is_empty());
    assert_eq!(hook.runs().len(), before, "a failed run writes nothing");
    hook.fail(false);
    until("one instance left", Duration::from_secs(60), || {
        (fake.managed("web").len() == 1).then_some(())
    })
    .await;
    let (gone, _) = fake.deletions().pop().unwrap();
    deregistered_before_delete(&hook, &fake, &gone);
    d.shutdown().await;
}

#[tokio::test]
async fn a_standby_publishes_nothing() {
    let port = listener().await;
    let (hook_a, hook_b) = (Hook::new(), Hook::new());
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(crate::fake::mem(10.0));
    let a = start("host-a:1:aaaa", &toml(1, 1), fake.clone(), port, &hook_a);
    let b = start("host-b:2:bbbb", &toml(1, 1), fake.clone(), port, &hook_b);
    let (holder, standby) = until("one daemon publishes", Duration::from_secs(30), || {
        match (hook_a.last(), hook_b.last()) {
            (Some(n), _) if n.len() == 1 => Some((&hook_a, &hook_b)),
            (_, Some(n)) if n.len() == 1 => Some((&hook_b, &hook_a)),
            _ => None,
        }
    })
    .await;
    // The standby has had passes meanwhile (every 500 ms): it ran nothing.
    let runs = holder.runs().len();
    until("a few more passes", Duration::from_secs(10), || {
        let status = if std::ptr::eq(standby, &hook_b) {
            b.telemetry.status()
        } else {
            a.telemetry.status()
        };
        status.groups[0].standby.clone()
    })
    .await;
    assert!(standby.runs().is_empty(), "{:?}", standby.runs());
    assert!(holder.runs().len() >= runs);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_restart_publishes_the_set_it_finds_before_anything_else() {
    let port = listener().await;
    let hook = Hook::new();
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(crate::fake::mem(10.0));
    // What a daemon before this one left: two instances in service.
    fake.add_owned("web", "web-aaaaaa", "Running");
    fake.add_owned("web", "web-bbbbbb", "Running");
    let d = start("host-a:1:aaaa", &toml(2, 2), fake.clone(), port, &hook);
    let runs = until("a first run", Duration::from_secs(30), || {
        let runs = hook.runs();
        (!runs.is_empty()).then_some(runs)
    })
    .await;
    assert_eq!(
        runs[0].1,
        ["web-aaaaaa", "web-bbbbbb"],
        "the set found, not an empty one first"
    );
    assert!(fake.deletions().is_empty());
    d.shutdown().await;
}
