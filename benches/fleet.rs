//! The fleet: one daemon managing N instances in G groups, against a fake incusd on a unix
//! socket (the listing, the event stream, the lease profile) and a fake cgroup tree in a tmpfs,
//! so that only the daemon is measured. Every instance is running at 48 % of its memory limit
//! and every group scales on memory at 50 %: a steady state, where nothing is to be done.
//!
//! The last column of requests counts the learned store's reads and writes (once a minute, see
//! `incus_hpa::lease::learned`) and anything the fake does not serve (`FLEET_SHOW_OTHER=1`
//! prints each of them).
//!
//! Per size it prints: the start-up (from the process's start until every group has had its
//! first pass), the daemon's CPU per second and per instance per tick in the steady state
//! (`interval = "1s"`), its resident memory, the passes per group per second (1 when every
//! group passes every interval), how late after it was due the latest pass of the window
//! started (the bound of its bucket in `incus_hpa_pass_delay_seconds`) and how many started
//! more than 1 s late, and the requests per second the fake incusd was sent, by kind.
//!
//! The daemon is the release binary, run as `incus-hpa run` with `INCUS_SOCKET` (the fake's
//! socket) and `INCUS_HPA_CGROUP_ROOT` (the fake tree: read instead of /sys/fs/cgroup).
//! The daemon gets the descriptor limits of a systemd service (1,024 soft, 524,288 hard).
//! Run: `cargo bench --bench fleet -- 10000/1000` (sizes as INSTANCES/GROUPS; default
//! 1000/100 10000/1000), `FLEET_SECONDS=20` for the steady window; `FLEET_BEFORE=PATH` runs
//! another build of the daemon on each size too, just before this one (side by side);
//! `FLEET_HISTORY=1` gives this build (not `FLEET_BEFORE`'s, which may not know the key) a
//! state directory, where it keeps each group's history: with `FLEET_BEFORE` set to this same
//! build, the cost of the history side by side.

mod support;

use std::convert::Infallible;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use incus_hpa::incus::LEASE_PROFILE;
use incus_hpa::model::{GROUP_KEY, OWNER_KEY, UUID_KEY};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

/// Memory limit of every instance, and what each uses: 48 %, within the default tolerance of
/// the 50 % target, so that no group wants another count (at 45 % each wanted one less, every
/// minute once its window ended, and the fake answered its fresh read with 404).
const LIMIT: u64 = 64 << 20;
const USED: u64 = LIMIT * 48 / 100;

/// Requests the fake was sent, by kind.
#[derive(Default)]
struct Counts {
    list: AtomicU64,
    lease_get: AtomicU64,
    lease_put: AtomicU64,
    other: AtomicU64,
}

impl Counts {
    fn snapshot(&self) -> [u64; 4] {
        [
            self.list.load(Ordering::Relaxed),
            self.lease_get.load(Ordering::Relaxed),
            self.lease_put.load(Ordering::Relaxed),
            self.other.load(Ordering::Relaxed),
        ]
    }
}

/// The fake incusd: the project's listing made once, the profiles (the lease store and the
/// learned store: each one's config and ETag, by name).
struct Fake {
    list: Bytes,
    profiles: Mutex<std::collections::HashMap<String, (Value, u64)>>,
    counts: Counts,
}

type Answer = Response<Full<Bytes>>;

fn envelope(status: u16, metadata: Value) -> Answer {
    let body =
        json!({"type": "sync", "status": "Success", "status_code": 200, "metadata": metadata});
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a response")
}

fn error(status: u16, message: &str) -> Answer {
    let body = json!({"type": "error", "error": message, "error_code": status});
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a response")
}

async fn answer(fake: Arc<Fake>, mut req: Request<Incoming>) -> Result<Answer, Infallible> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if path == "/1.0/events" {
        let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
            return Ok(error(400, "not a websocket"));
        };
        tokio::spawn(async move {
            if let Ok(up) = hyper::upgrade::on(&mut req).await {
                // Silent, but for the pongs it answers the daemon's pings with.
                let mut ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(up), Role::Server, None).await;
                while let Some(Ok(_)) = ws.next().await {}
            }
        });
        return Ok(Response::builder()
            .status(101)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("sec-websocket-accept", derive_accept_key(key.as_bytes()))
            .body(Full::new(Bytes::new()))
            .expect("a response"));
    }
    let lease_path = format!("/1.0/profiles/{LEASE_PROFILE}");
    let answer = match (&method, path.as_str()) {
        (&Method::GET, "/1.0") => envelope(
            200,
            json!({"environment": {"server_version": "6.0.4", "server_clustered": false},
                   "api_extensions": [], "auth": "trusted"}),
        ),
        (&Method::GET, "/1.0/instances") => {
            fake.counts.list.fetch_add(1, Ordering::Relaxed);
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Full::new(fake.list.clone()))
                .expect("a response")
        }
        (&Method::GET, p) if p.starts_with("/1.0/profiles/") => {
            let name = &p["/1.0/profiles/".len()..];
            let count = if p == lease_path {
                &fake.counts.lease_get
            } else {
                &fake.counts.other
            };
            count.fetch_add(1, Ordering::Relaxed);
            match fake.profiles.lock().unwrap().get(name) {
                Some((config, etag)) => {
                    let mut a = envelope(
                        200,
                        json!({"name": name, "description": "", "config": config,
                               "devices": {}, "used_by": [], "project": "default"}),
                    );
                    a.headers_mut()
                        .insert("etag", format!("\"{etag}\"").parse().expect("a header"));
                    a
                }
                None => error(404, "Profile not found"),
            }
        }
        (&Method::POST, "/1.0/profiles") => {
            let body = body(req).await;
            let name = body["name"].as_str().unwrap_or_default().to_owned();
            fake.profiles
                .lock()
                .unwrap()
                .insert(name, (body["config"].clone(), 1));
            envelope(200, json!({}))
        }
        (&Method::PUT, p) if p.starts_with("/1.0/profiles/") => {
            let name = p["/1.0/profiles/".len()..].to_owned();
            let count = if p == lease_path {
                &fake.counts.lease_put
            } else {
                &fake.counts.other
            };
            count.fetch_add(1, Ordering::Relaxed);
            let tag = req
                .headers()
                .get("if-match")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = body(req).await;
            let mut profiles = fake.profiles.lock().unwrap();
            match profiles.get_mut(&name) {
                Some((config, etag)) if tag.as_deref() == Some(&format!("\"{etag}\"")) => {
                    *config = body["config"].clone();
                    *etag += 1;
                    envelope(200, json!({}))
                }
                Some(_) => error(412, "ETag doesn't match"),
                None => error(404, "Profile not found"),
            }
        }
        _ => {
            fake.counts.other.fetch_add(1, Ordering::Relaxed);
            if std::env::var_os("FLEET_SHOW_OTHER").is_some() {
                eprintln!("other: {method} {path}");
            }
            error(404, &format!("not in the fake: {method} {path}"))
        }
    };
    Ok(answer)
}

async fn body(req: Request<Incoming>) -> Value {
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

/// Serves the fake on `socket` until the process ends.
fn serve(socket: &Path, fake: Arc<Fake>) {
    let listener = tokio::net::UnixListener::bind(socket).expect("the fake's socket");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let fake = fake.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| answer(fake.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
}

fn group_name(g: usize) -> String {
    format!("fleet{g:04}")
}

/// The instances of `groups` groups, `per` each: the listing's body, and the cgroup tree.
fn world(root: &Path, groups: usize, per: usize) -> Bytes {
    let mut list = Vec::with_capacity(groups * per);
    for g in 0..groups {
        let group = group_name(g);
        for i in 0..per {
            let name = format!("{group}-{i:05}");
            let uuid = format!("00000000-0000-4000-8000-{g:06}{i:06}");
            list.push(json!({
                "name": name, "status": "Running", "status_code": 103, "type": "container",
                "project": "default", "location": "none", "profiles": ["default"],
                "created_at": "2026-12-01T00:00:00Z", "last_used_at": "2026-12-01T00:00:01Z",
                "config": {
                    GROUP_KEY: group,
                    OWNER_KEY: format!("default/{name}/{uuid}"),
                    UUID_KEY: uuid,
                    "limits.memory": "64MiB",
                },
            }));
            let dir = root.join(format!("lxc.payload.{name}"));
            std::fs::create_dir_all(&dir).expect("the fake tree");
            for (file, text) in [
                ("memory.current", format!("{USED}\n")),
                ("memory.max", format!("{LIMIT}\n")),
                ("memory.stat", "anon 1000\nfile 0\ninactive_file 0\n".into()),
                (
                    "memory.events",
                    "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n".into(),
                ),
            ] {
                std::fs::write(dir.join(file), text).expect("the fake tree");
            }
        }
    }
    let body = json!({"type": "sync", "status": "Success", "status_code": 200, "metadata": list});
    Bytes::from(body.to_string())
}

fn desired_state(dir: &Path, groups: usize, per: usize, history: bool) -> String {
    let mut text = format!(
        "[daemon]\ninterval = \"1s\"\ncontrol_socket = \"{}\"\nmemory_source = \"cgroup\"\n",
        dir.join("control.sock").display()
    );
    if history {
        text.push_str(&format!(
            "state_directory = \"{}\"\n",
            dir.join("state").display()
        ));
    }
    for g in 0..groups {
        let group = group_name(g);
        text.push_str(&format!(
            "\n[groups.{group}]\nmin = 1\nmax = {}\nmemory_threshold = 50\nimage = \"busybox\"\n\
             \n[groups.{group}.config]\n\"limits.memory\" = \"64MiB\"\n",
            per * 2
        ));
    }
    text
}

/// `GET path` on the daemon's control socket: the body.
fn control(dir: &Path, path: &str) -> Option<String> {
    let mut s = std::os::unix::net::UnixStream::connect(dir.join("control.sock")).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: incus-hpa\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

/// The daemon's CPU time so far (user + system) and its VmRSS and VmHWM, KiB.
fn usage(pid: u32) -> (Duration, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (
        support::cpu_of(&pid.to_string(), false),
        kib("VmRSS:"),
        kib("VmHWM:"),
    )
}

/// Passes so far, all groups together (the pass duration histogram's count).
fn passes(dir: &Path) -> f64 {
    control(dir, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("incus_hpa_reconcile_duration_seconds_count"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The status's groups, when every one has had a pass (and, with `acting`, acts).
fn all_passed(dir: &Path, acting: bool) -> Option<Vec<Value>> {
    let status: Value = serde_json::from_str(&control(dir, "/status")?).ok()?;
    let groups = status["groups"].as_array()?.clone();
    groups
        .iter()
        .all(|g| g["reason"] != "pending" && (!acting || g["standby"].is_null()))
        .then_some(groups)
}

/// `incus_hpa_pass_delay_seconds` summed over the groups: each bucket's bound and the passes
/// that started at most that long after they were due (the last bound is infinite: all of
/// them). Empty for a build without it.
fn delays(dir: &Path) -> Vec<(f64, f64)> {
    let mut sums: Vec<(f64, f64)> = Vec::new();
    for line in control(dir, "/metrics").unwrap_or_default().lines() {
        let Some(rest) = line.strip_prefix("incus_hpa_pass_delay_seconds_bucket{le=\"") else {
            continue;
        };
        let Some((le, _)) = rest.split_once('"') else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::NAN)
        };
        let n: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0);
        match sums.iter_mut().find(|(b, _)| *b == le) {
            Some((_, sum)) => *sum += n,
            None => sums.push((le, n)),
        }
    }
    sums.sort_by(|a, b| a.0.total_cmp(&b.0));
    sums
}

/// Between two readings of [`delays`]: the bound the latest pass started within, and how
/// many passes started more than 1 s after they were due; `n/a` for a build without them.
fn lateness(before: &[(f64, f64)], after: &[(f64, f64)]) -> (String, String) {
    let window: Vec<(f64, f64)> = after
        .iter()
        .map(|&(le, n)| {
            let was = before.iter().find(|(b, _)| *b == le).map_or(0.0, |p| p.1);
            (le, n - was)
        })
        .collect();
    let Some(&(_, all)) = window.last() else {
        return ("n/a".into(), "n/a".into());
    };
    let within = window
        .iter()
        .find(|(_, n)| *n >= all)
        .map_or("n/a".into(), |(le, _)| format!("≤ {le}"));
    let over = window
        .iter()
        .find(|(le, _)| *le == 1.0)
        .map_or("n/a".into(), |(_, n)| format!("{} of {all}", all - n));
    (within, over)
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.0.id() as i32).expect("a pid"),
            rustix::process::Signal::TERM,
        );
        let _ = self.0.wait();
    }
}

/// Gives this process, and so the daemons it starts, the descriptor limits systemd gives a
/// service (1,024 soft, 524,288 hard), where it may; the hard limit in force.
fn service_limits() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let want = Rlimit {
        current: Some(1024),
        maximum: Some(524_288),
    };
    if setrlimit(Resource::Nofile, want).is_err() {
        eprintln!("fleet: could not set the descriptor limits; the daemon runs with these");
    }
    getrlimit(Resource::Nofile).maximum.unwrap_or(u64::MAX)
}

/// `f`'s answer once it has one, within `within`; else `None`, with the end of the daemon's
/// log (in `dir`) shown.
fn until<T>(
    dir: &Path,
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(t) = f() {
            return Some(t);
        }
        if start.elapsed() >= within {
            let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            for line in tail.iter().rev() {
                eprintln!("daemon: {line}");
            }
            eprintln!("fleet: timed out waiting for {what}");
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let sizes: Vec<(usize, usize)> = std::env::args()
        .skip(1)
        .filter_map(|a| {
            let (n, g) = a.split_once('/')?;
            Some((n.parse().ok()?, g.parse().ok()?))
        })
        .collect();
    let sizes = if sizes.is_empty() {
        vec![(1000, 100), (10_000, 1000)]
    } else {
        sizes
    };
    let hard = service_limits();
    println!(
        "(the daemon's descriptor limits: soft 1,024, hard {hard}; it raises the soft one to the \
         hard one, as under systemd)"
    );
    let window: u64 = std::env::var("FLEET_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    println!(
        "| instances | groups | daemon | start-up s | daemon CPU ms/s | CPU ms per instance per tick | \
         VmRSS MiB (peak) | passes per group per s | latest pass start after due, s | passes \
         started > 1 s late | requests/s: list, lease GET, lease PUT, other |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut daemons = vec![("this build", PathBuf::from(env!("CARGO_BIN_EXE_incus-hpa")))];
    if let Some(before) = std::env::var_os("FLEET_BEFORE") {
        daemons.insert(0, ("FLEET_BEFORE", PathBuf::from(before)));
    }
    for (n, groups) in sizes {
        for (label, bin) in &daemons {
            run(n, groups, label, bin, window);
        }
    }
}

/// One row: `bin` managing `n` instances in `groups` groups for `window` seconds.
fn run(n: usize, groups: usize, label: &str, bin: &Path, window: u64) {
    let per = n.div_ceil(groups).max(1);
    let n = per * groups;
    let base = if Path::new("/dev/shm").is_dir() {
        tempfile::Builder::new()
            .prefix("incus-hpa-fleet")
            .tempdir_in("/dev/shm")
    } else {
        tempfile::tempdir()
    }
    .expect("a directory");
    let dir = base.path().to_path_buf();
    let cgroup: PathBuf = dir.join("cgroup");
    let fake = Arc::new(Fake {
        list: world(&cgroup, groups, per),
        profiles: Mutex::default(),
        counts: Counts::default(),
    });
    let socket = dir.join("incus.sock");
    serve(&socket, fake.clone());
    let file = dir.join("desired-state.toml");
    let history = label == "this build"
        && std::env::var_os("FLEET_HISTORY").is_some_and(|v| !v.is_empty() && v != "0");
    std::fs::write(&file, desired_state(&dir, groups, per, history)).expect("the file");
    let log = std::fs::File::create(dir.join("daemon.log")).expect("the log");
    let started = Instant::now();
    let daemon = Daemon(
        Command::new(bin)
            .args(["run", "--config"])
            .arg(&file)
            .env("INCUS_SOCKET", &socket)
            .env("INCUS_HPA_CGROUP_ROOT", &cgroup)
            .env("RUST_LOG", "incus_hpa=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the daemon"),
    );
    let pid = daemon.0.id();
    let limit = Duration::from_secs(120);
    let not = |what: &str| {
        println!("| {n} | {groups} | {label} | no {what} within 120 s | | | | | | | |");
    };
    if until(&dir, "every group's first pass", limit, || {
        all_passed(&dir, false)
    })
    .is_none()
    {
        return not("first pass of every group");
    }
    let startup = started.elapsed();
    // Its leases confirmed: every group acted on, then a few passes to settle.
    if until(&dir, "every group acted on", limit, || {
        all_passed(&dir, true)
    })
    .is_none()
    {
        return not("lease held for every group");
    }
    std::thread::sleep(Duration::from_secs(3));
    let (cpu0, _, _) = usage(pid);
    let delays0 = delays(&dir);
    let (req0, passes0, t0) = (fake.counts.snapshot(), passes(&dir), Instant::now());
    std::thread::sleep(Duration::from_secs(window));
    let (cpu1, rss, hwm) = usage(pid);
    let (req1, passes1, secs) = (
        fake.counts.snapshot(),
        passes(&dir),
        t0.elapsed().as_secs_f64(),
    );
    let (within, over) = lateness(&delays0, &delays(&dir));
    let cpu_ms = (cpu1 - cpu0).as_secs_f64() * 1000.0 / secs;
    let rate: Vec<String> = req0
        .iter()
        .zip(req1)
        .map(|(a, b)| format!("{:.2}", (b - a) as f64 / secs))
        .collect();
    println!(
        "| {n} | {groups} | {label} | {:.1} | {cpu_ms:.1} | {:.4} | {:.1} ({:.1}) | {:.2} | {within} | {over} | {} |",
        startup.as_secs_f64(),
        cpu_ms / n as f64,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        (passes1 - passes0) / secs / groups as f64,
        rate.join(", ")
    );
    drop(daemon);
}
