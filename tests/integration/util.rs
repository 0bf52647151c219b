//! Test harness: a daemon loop over the fake Incus in a task, driven by events, observed by
//! polling under tokio's paused clock (waiting costs no real time).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use incus_hpa::config;
use incus_hpa::daemon::{run_loop, Event};
use incus_hpa::events::follow;
use incus_hpa::informer::Store;
use incus_hpa::lease::{Clocks, Leases};
use incus_hpa::memory::MemorySource;
use incus_hpa::model::{DesiredState, MemorySourceKind};
use incus_hpa::reconciler::Context;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use crate::fake::FakeIncus;

/// A running daemon loop over a fake Incus, reading its desired state from a temp file.
pub struct Harness {
    pub fake: Arc<FakeIncus>,
    /// The informer's cache the loop reads.
    pub store: Arc<Store>,
    pub telemetry: Arc<incus_hpa::control::Telemetry>,
    /// The memory sources the loop asked for, in order.
    pub sources: Arc<std::sync::Mutex<Vec<MemorySourceKind>>>,
    pub events: UnboundedSender<Event>,
    pub task: JoinHandle<DesiredState>,
    /// The task that renews the leases.
    pub keeper: JoinHandle<()>,
    /// The daemon's leases, as its loop and its fences read them.
    pub leases: Arc<Leases>,
    pub file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// Starts the loop with `toml` as the desired state and `fake` as Incus.
    pub fn start(toml: &str, fake: Arc<FakeIncus>) -> Self {
        Self::start_as("test-daemon", toml, fake)
    }

    /// Like [`Harness::start`], for a daemon whose lease holder id is `me` (several daemons on
    /// one fake Incus).
    pub fn start_as(me: &str, toml: &str, fake: Arc<FakeIncus>) -> Self {
        let memory = fake.clone();
        Self::start_with(me, toml, fake, memory)
    }

    /// Like [`Harness::start_as`], reading memory from `memory` rather than from the fake.
    pub fn start_with(
        me: &str,
        toml: &str,
        fake: Arc<FakeIncus>,
        memory: Arc<dyn MemorySource>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("desired-state.toml");
        std::fs::write(&file, toml).unwrap();
        let loaded = config::load(&file).unwrap_or_else(|e| panic!("{:#?}", e.diagnostics));
        let stop = Arc::new(incus_hpa::act::Shutdown::default());
        let sources = Arc::new(std::sync::Mutex::new(Vec::new()));
        let asked = sources.clone();
        let store = Arc::new(Store::default());
        let telemetry = Arc::new(incus_hpa::control::Telemetry::default());
        let ctx = Context {
            incus: fake.clone(),
            store: store.clone(),
            memory: Arc::new(move |kind| {
                asked.lock().unwrap().push(kind);
                memory.clone()
            }),
            stop,
            telemetry: telemetry.clone(),
            leases: Arc::new(Leases::with(
                me.into(),
                None,
                loaded.state.daemon.lease,
                Clocks::tokio(),
            )),
            ready: Default::default(),
            endpoints: Default::default(),
        };
        let leases = ctx.leases.clone();
        let keeper = tokio::spawn(ctx.leases.clone().keep(fake.clone()));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(follow(
            fake.clone(),
            fake.clone(),
            store.clone(),
            tx.clone(),
            telemetry.reconnects.clone(),
        ));
        let path = file.clone();
        let task = tokio::spawn(run_loop(
            ctx,
            loaded.state,
            Box::new(move || config::load(&path)),
            rx,
        ));
        Self {
            fake,
            store,
            telemetry,
            sources,
            events: tx,
            task,
            keeper,
            leases,
            file,
            _dir: dir,
        }
    }

    /// Kills the daemon where it stands, as SIGKILL would: no shutdown, no lease given up.
    pub fn kill(self) {
        self.task.abort();
        self.keeper.abort();
    }

    /// Replaces the desired-state file and sends a reload.
    pub fn reload(&self, toml: &str) {
        std::fs::write(&self.file, toml).unwrap();
        self.events.send(Event::Reload).unwrap();
    }

    /// Checks that the cache agrees with a fresh list (once the events in flight are in), sends
    /// a shutdown and returns the desired state the loop ended with.
    pub async fn shutdown(self) -> DesiredState {
        let cached = || self.store.snapshot().remove("default").unwrap_or_default();
        // An instance created behind the daemon's back is read a settle time later.
        let within = incus_hpa::informer::SETTLE + Duration::from_secs(5);
        let deadline = tokio::time::Instant::now() + within;
        while self.store.follows("default") && cached() != self.fake.listing() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cache {:?} differs from a fresh list {:?}",
                cached(),
                self.fake.listing()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.events.send(Event::Shutdown).unwrap();
        let state = self.task.await.unwrap();
        self.keeper.abort();
        state
    }
}

/// Polls `cond` every 100 ms of (paused) time until it holds, or panics after `within`.
pub async fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Lets the loop run for `d` of paused time.
pub async fn run_for(d: Duration) {
    tokio::time::sleep(d).await;
}

/// A group `web` with the given bounds, a 2 s interval and a 60 s scale-down window.
pub fn web(min: u32, max: u32) -> String {
    format!(
        r#"
[daemon]
interval = "2s"

[groups.web]
min = {min}
max = {max}
memory_threshold = 50
image = "busybox"
scale_down_stabilization = "60s"

[groups.web.config]
"limits.memory" = "100MiB"
"#
    )
}

/// Awaits `f` for at most `d` of paused time.
pub async fn within<T>(d: Duration, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(d, f)
        .await
        .expect("did not finish in time")
}

/// A status board with one group, `web`, scaling up: 2 of 3 at 71.5 % for a 60 % target.
pub fn web_status() -> incus_hpa::control::Status {
    incus_hpa::control::Status {
        groups: vec![incus_hpa::control::GroupStatus {
            name: "web".into(),
            project: "default".into(),
            current: 2,
            desired: 3,
            min: 1,
            max: 5,
            unhealthy: 0,
            warm: 1,
            failing: Vec::new(),
            utilization: Some(71.5),
            threshold: Some(60.0),
            signals: vec![incus_hpa::control::SignalStatus {
                name: "memory".into(),
                value: Some(71.5),
                target: 60.0,
                wants: Some(3),
            }],
            reason: "above-threshold".into(),
            paused: false,
            last_action: None,
            next_pass: None,
            last_error: None,
            standby: None,
            scale_down_window: Some(
                "holding 1m 30s after drops (learned: 3 of the last hour's 5 drops came back within 1m 30s)".into(),
            ),
            starting: 0,
            not_ready: 0,
            instances: Vec::new(),
            endpoints: None,
            advice: None,
        }],
    }
}
