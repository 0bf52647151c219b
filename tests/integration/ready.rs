//! Readiness checks against the fake Incus: the daemon loop checks its instances over HTTP at
//! the fake's address (127.0.0.1) on a listener of the test, and the board (what `observe`
//! reads) goes from starting to ready, and out of service when the checks fail.
//!
//! These run in real time (short periods): the checks are real connections, which a paused
//! clock would time out whenever it jumps ahead while one is in flight.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use incus_hpa::config;
use incus_hpa::daemon::{run_loop, Event};
use incus_hpa::events::follow;
use incus_hpa::informer::Store;
use incus_hpa::lease::{Clocks, Leases};
use incus_hpa::model::{DesiredState, GroupName, Probe, Readiness, ReadySpec};
use incus_hpa::ready::probe::{Checker, Target};
use incus_hpa::ready::Board;
use incus_hpa::reconciler::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use crate::fake::{FakeIncus, LOCAL_ADDRESS};
use crate::util::web;

/// An HTTP server on 127.0.0.1 that answers 503 to its first `unready` requests, then the
/// status in `status`; it keeps the paths it was asked.
struct Server {
    port: u16,
    status: Arc<AtomicU16>,
    asked: Arc<AtomicU32>,
    paths: Arc<Mutex<Vec<String>>>,
}

async fn server(unready: u32) -> Server {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let status = Arc::new(AtomicU16::new(200));
    let asked = Arc::new(AtomicU32::new(0));
    let paths = Arc::new(Mutex::new(Vec::new()));
    let (s, a, p) = (status.clone(), asked.clone(), paths.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (s, a, p) = (s.clone(), a.clone(), p.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).to_string();
                if let Some(path) = request.split_whitespace().nth(1) {
                    p.lock().unwrap().push(path.to_owned());
                }
                let code = if a.fetch_add(1, Ordering::SeqCst) < unready {
                    503
                } else {
                    s.load(Ordering::SeqCst)
                };
                let answer =
                    format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Server {
        port,
        status,
        asked,
        paths,
    }
}

/// `state` with an HTTP check of `GET :port/ready` for every group, every 300 ms; with
/// `start_timeout` when given.
fn checked(mut state: DesiredState, port: u16, start_timeout: Option<Duration>) -> DesiredState {
    for g in state.groups.values_mut() {
        let spec = ReadySpec::with_probe(Probe::Http {
            port,
            path: "/ready".into(),
        });
        g.ready = Some(ReadySpec {
            period: Duration::from_millis(300),
            timeout: Duration::from_millis(250),
            start_timeout: start_timeout.unwrap_or(spec.start_timeout),
            ..spec
        });
    }
    state
}

/// A daemon loop over `fake` whose groups (from `toml`) have checks on `port`.
struct Daemon {
    board: Arc<Board>,
    store: Arc<Store>,
    state: DesiredState,
    events: UnboundedSender<Event>,
    task: JoinHandle<DesiredState>,
    _dir: tempfile::TempDir,
}

fn start(toml: &str, fake: Arc<FakeIncus>, port: u16) -> Daemon {
    start_with(toml, fake, port, None)
}

/// Like [`start`], with the checks' `start_timeout` when given.
fn start_with(
    toml: &str,
    fake: Arc<FakeIncus>,
    port: u16,
    start_timeout: Option<Duration>,
) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("desired-state.toml");
    std::fs::write(&file, toml).unwrap();
    let loaded = config::load(&file).unwrap_or_else(|e| panic!("{:#?}", e.diagnostics));
    let state = checked(loaded.state, port, start_timeout);
    let store = Arc::new(Store::default());
    let telemetry = Arc::new(incus_hpa::control::Telemetry::default());
    let board = Arc::new(Board::default());
    let memory = fake.clone();
    let ctx = Context {
        incus: fake.clone(),
        store: store.clone(),
        memory: Arc::new(move |_| memory.clone()),
        stop: Default::default(),
        telemetry: telemetry.clone(),
        leases: Arc::new(Leases::with(
            "test-daemon".into(),
            None,
            state.daemon.lease,
            Clocks::tokio(),
        )),
        ready: board.clone(),
        endpoints: Default::default(),
    };
    tokio::spawn(ctx.leases.clone().keep(fake.clone()));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(follow(
        fake.clone(),
        fake.clone(),
        store.clone(),
        tx.clone(),
        telemetry.reconnects.clone(),
    ));
    let task = tokio::spawn(run_loop(
        ctx,
        state.clone(),
        Box::new(move || {
            config::load(&file).map(|mut l| {
                l.state = checked(l.state, port, start_timeout);
                l
            })
        }),
        rx,
    ));
    Daemon {
        board,
        store,
        state,
        events: tx,
        task,
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

fn readiness(board: &Board, name: &str) -> Option<Readiness> {
    board.get("default", "web", name).map(|s| s.readiness)
}

#[tokio::test]
async fn an_instance_is_starting_until_its_check_passes_then_out_of_service_when_it_fails() {
    let srv = server(2).await;
    let fake = Arc::new(FakeIncus::default());
    let d = start(&web(1, 1), fake.clone(), srv.port);
    let name = until("an instance runs", Duration::from_secs(20), || {
        let managed = fake.managed("web");
        managed
            .iter()
            .find(|(_, s)| s == "Running")
            .map(|(n, _)| n.clone())
    })
    .await;
    // The first two answers are 503: starting, saying why.
    until("starting (HTTP 503)", Duration::from_secs(20), || {
        (readiness(&d.board, &name)
            == Some(Readiness::Starting {
                why: "HTTP 503".into(),
            }))
        .then_some(())
    })
    .await;
    until("ready", Duration::from_secs(20), || {
        (readiness(&d.board, &name) == Some(Readiness::Ready)).then_some(())
    })
    .await;
    let seen = d.board.get("default", "web", &name).unwrap();
    assert_eq!(seen.address, Some(LOCAL_ADDRESS));
    assert!(srv.paths.lock().unwrap().iter().all(|p| p == "/ready"));
    // Read once for this start, however many checks ran.
    assert!(srv.asked.load(Ordering::SeqCst) >= 3);
    assert_eq!(fake.calls("addresses"), 1);

    // What a pass observes.
    let spec = &d.state.groups[&GroupName::parse("web").unwrap()];
    let obs = incus_hpa::observe::observe(
        fake.as_ref(),
        fake.as_ref(),
        &d.store,
        &d.board,
        spec,
        Duration::from_secs(300),
    )
    .await
    .unwrap();
    let i = obs.instances.iter().find(|i| i.name == name).unwrap();
    assert_eq!(
        (&i.readiness, i.address),
        (&Readiness::Ready, Some(LOCAL_ADDRESS))
    );

    // Three failures in a row take it out of service.
    srv.status.store(500, Ordering::SeqCst);
    until("not ready (HTTP 500)", Duration::from_secs(20), || {
        (readiness(&d.board, &name)
            == Some(Readiness::NotReady {
                why: "HTTP 500".into(),
            }))
        .then_some(())
    })
    .await;
    srv.status.store(204, Ordering::SeqCst);
    until("ready again", Duration::from_secs(20), || {
        (readiness(&d.board, &name) == Some(Readiness::Ready)).then_some(())
    })
    .await;
    d.shutdown().await;
}

#[tokio::test]
async fn an_instance_without_an_address_is_starting_until_it_has_one() {
    let srv = server(0).await;
    let fake = Arc::new(FakeIncus::default());
    fake.add_owned("web", "web-aaaaaa", "Running");
    fake.set_addresses("web-aaaaaa", Vec::new());
    let d = start(&web(1, 1), fake.clone(), srv.port);
    until("no address yet", Duration::from_secs(20), || {
        (readiness(&d.board, "web-aaaaaa")
            == Some(Readiness::Starting {
                why: "no address on eth0 yet".into(),
            }))
        .then_some(())
    })
    .await;
    assert_eq!(srv.asked.load(Ordering::SeqCst), 0);
    // An address is read again until there is one.
    fake.set_addresses("web-aaaaaa", vec![LOCAL_ADDRESS]);
    until("ready", Duration::from_secs(20), || {
        (readiness(&d.board, "web-aaaaaa") == Some(Readiness::Ready)).then_some(())
    })
    .await;
    assert_eq!(fake.managed("web").len(), 1, "{:?}", fake.managed("web"));
    d.shutdown().await;
}

#[tokio::test]
async fn an_instance_never_ready_within_start_timeout_is_a_failed_start() {
    // Always 503 (u32::MAX unready answers).
    let srv = server(u32::MAX).await;
    let fake = Arc::new(FakeIncus::default());
    fake.add_owned("web", "web-aaaaaa", "Running");
    let d = start_with(
        &web(1, 1),
        fake.clone(),
        srv.port,
        Some(Duration::from_secs(1)),
    );
    let why = "not ready within 1s of its start: HTTP 503";
    until("never ready", Duration::from_secs(20), || {
        (readiness(&d.board, "web-aaaaaa") == Some(Readiness::NeverReady { why: why.into() }))
            .then_some(())
    })
    .await;
    d.shutdown().await;
}

#[tokio::test]
async fn a_command_check_runs_through_incus_exec() {
    let fake = FakeIncus::default();
    fake.add_owned("web", "web-aaaaaa", "Running");
    let spec = ReadySpec::with_probe(Probe::Command(vec!["/bin/check".into(), "-q".into()]));
    let checker = Checker::new().unwrap();
    let target = Target {
        project: "default",
        name: "web-aaaaaa",
        address: None,
    };
    assert_eq!(
        checker.check(&fake, target, &spec).await,
        Ok("exit code 0".into())
    );
    fake.set_drain(1, None);
    assert_eq!(
        checker.check(&fake, target, &spec).await,
        Err("exit code 1".into())
    );
    let ran = fake.drains();
    assert_eq!(ran[0], ("web-aaaaaa".into(), spec_argv(&spec)));
    // A command that outlives the timeout fails the check.
    fake.set_drain(0, Some(Duration::from_secs(5)));
    let quick = ReadySpec {
        timeout: Duration::from_millis(100),
        ..spec.clone()
    };
    assert_eq!(
        checker.check(&fake, target, &quick).await,
        Err("timed out after 100ms".into())
    );
}

fn spec_argv(spec: &ReadySpec) -> Vec<String> {
    match &spec.probe {
        Probe::Command(argv) => argv.clone(),
        _ => unreachable!(),
    }
}

/// A prober on its own, over running instances `names` of the group `web` (listed in the
/// store already), with the group's table from `web(n, n)` (no checks), and its board.
async fn prober_of(names: &[&str]) -> (incus_hpa::ready::Prober, Arc<Board>, DesiredState) {
    let (prober, board, plain, _, _) = prober_over(names).await;
    (prober, board, plain)
}

/// Like [`prober_of`], with the fake and the store, for a test to change what is listed.
async fn prober_over(
    names: &[&str],
) -> (
    incus_hpa::ready::Prober,
    Arc<Board>,
    DesiredState,
    Arc<FakeIncus>,
    Arc<Store>,
) {
    let fake = Arc::new(FakeIncus::default());
    for n in names {
        fake.add_owned("web", n, "Running");
    }
    let store = Arc::new(Store::default());
    relist(&fake, &store).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("desired-state.toml");
    let n = u32::try_from(names.len()).unwrap();
    std::fs::write(&file, web(n, n)).unwrap();
    let plain = config::load(&file).unwrap().state;
    let board = Arc::new(Board::default());
    let prober =
        incus_hpa::ready::Prober::start(fake.clone(), store.clone(), board.clone(), &plain);
    (prober, board, plain, fake, store)
}

/// Lists the project into `store` again, as a pass would after an event.
async fn relist(fake: &Arc<FakeIncus>, store: &Store) {
    store
        .list(
            fake.as_ref(),
            "default",
            tokio::time::Instant::now(),
            Duration::ZERO,
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn the_prober_follows_the_desired_state() {
    let srv = server(0).await;
    let (prober, board, plain) = prober_of(&["web-aaaaaa"]).await;
    // No group has checks: nothing is checked.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(board.is_empty());
    assert_eq!(srv.asked.load(Ordering::SeqCst), 0);
    // A reload gives the group checks: its instance is checked.
    prober.set_desired(&checked(plain.clone(), srv.port, None));
    until("ready", Duration::from_secs(20), || {
        (readiness(&board, "web-aaaaaa") == Some(Readiness::Ready)).then_some(())
    })
    .await;
    // Another reload takes them away: the board forgets the group, no check runs any more.
    prober.set_desired(&plain);
    until("forgotten", Duration::from_secs(20), || {
        board.is_empty().then_some(())
    })
    .await;
    let asked = srv.asked.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(srv.asked.load(Ordering::SeqCst), asked);
    drop(prober);
}

#[tokio::test]
async fn an_instance_marked_leaving_before_its_first_check_is_never_checked() {
    let srv = server(0).await;
    let (prober, board, plain) = prober_of(&["web-aaaaaa", "web-bbbbbb"]).await;
    // A scale-down takes a starting instance first: its removal may mark it before the prober
    // has ever checked it.
    board.set_leaving("default", "web", "web-aaaaaa", true);
    prober.set_desired(&checked(plain, srv.port, None));
    until("the other ready", Duration::from_secs(20), || {
        (readiness(&board, "web-bbbbbb") == Some(Readiness::Ready)).then_some(())
    })
    .await;
    assert_eq!(
        readiness(&board, "web-aaaaaa"),
        None,
        "checked in the round that checked the other"
    );
    assert!(board.is_leaving("default", "web", "web-aaaaaa"));
    drop(prober);
}

#[tokio::test]
async fn an_instance_a_removal_marked_leaving_is_checked_no_more() {
    let srv = server(0).await;
    let (prober, board, plain) = prober_of(&["web-aaaaaa", "web-bbbbbb"]).await;
    prober.set_desired(&checked(plain, srv.port, None));
    until("both ready", Duration::from_secs(20), || {
        ["web-aaaaaa", "web-bbbbbb"]
            .iter()
            .all(|n| readiness(&board, n) == Some(Readiness::Ready))
            .then_some(())
    })
    .await;
    // A removal drains and stops web-aaaaaa: its server fails from then on, as the other's.
    board.set_leaving("default", "web", "web-aaaaaa", true);
    srv.status.store(503, Ordering::SeqCst);
    until("the other out of service", Duration::from_secs(20), || {
        matches!(
            readiness(&board, "web-bbbbbb"),
            Some(Readiness::NotReady { .. })
        )
        .then_some(())
    })
    .await;
    assert_eq!(
        readiness(&board, "web-aaaaaa"),
        Some(Readiness::Ready),
        "the leaving instance keeps what was found of it last"
    );
    // The removal ended (it failed, say): checked again.
    board.set_leaving("default", "web", "web-aaaaaa", false);
    until("checked again", Duration::from_secs(20), || {
        matches!(
            readiness(&board, "web-aaaaaa"),
            Some(Readiness::NotReady { .. })
        )
        .then_some(())
    })
    .await;
    drop(prober);
}

#[tokio::test]
async fn a_frozen_instance_keeps_its_readiness_until_its_checks_fail_unsent() {
    let srv = server(0).await;
    let (prober, board, plain, fake, store) = prober_over(&["web-aaaaaa"]).await;
    prober.set_desired(&checked(plain, srv.port, None));
    until("ready", Duration::from_secs(20), || {
        (readiness(&board, "web-aaaaaa") == Some(Readiness::Ready)).then_some(())
    })
    .await;
    // Frozen (an `incus copy` of it taking long): not forgotten, and its checks are not sent
    // (its server would answer 200): each fails, and `failures` of them in a row take it out.
    fake.set_status("web-aaaaaa", "Frozen");
    relist(&fake, &store).await;
    until("not ready, frozen", Duration::from_secs(20), || {
        (readiness(&board, "web-aaaaaa")
            == Some(Readiness::NotReady {
                why: incus_hpa::ready::FROZEN.into(),
            }))
        .then_some(())
    })
    .await;
    // Thawed: checked again, and ready.
    thawed_and_ready(&fake, &store, &board, "web-aaaaaa").await;
    drop(prober);
}

/// Sets `name` running again (and lists it) and waits until its checks have it ready.
async fn thawed_and_ready(fake: &Arc<FakeIncus>, store: &Store, board: &Board, name: &str) {
    fake.set_status(name, "Running");
    relist(fake, store).await;
    until("ready again", Duration::from_secs(20), || {
        (readiness(board, name) == Some(Readiness::Ready)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_instance_frozen_before_it_was_ready_is_not_a_failed_start() {
    let srv = server(0).await;
    let (prober, board, plain, fake, store) = prober_over(&["web-aaaaaa", "web-bbbbbb"]).await;
    // Frozen before its first check, with a start_timeout of 300 ms: its checks are not sent,
    // and none counts against it.
    fake.set_status("web-aaaaaa", "Frozen");
    relist(&fake, &store).await;
    let short = Some(Duration::from_millis(300));
    prober.set_desired(&checked(plain, srv.port, short));
    // The other one is checked every round: a few rounds pass, well past the start_timeout.
    until("a few rounds", Duration::from_secs(20), || {
        (srv.asked.load(Ordering::SeqCst) >= 4).then_some(())
    })
    .await;
    assert_eq!(readiness(&board, "web-bbbbbb"), Some(Readiness::Ready));
    assert_eq!(
        readiness(&board, "web-aaaaaa"),
        None,
        "frozen: nothing found"
    );
    // Running again, its first check passes: ready, not a failed start.
    thawed_and_ready(&fake, &store, &board, "web-aaaaaa").await;
    drop(prober);
}
