//! Scale-up speed and the daemon's memory, on the real Incus, side by side in one run:
//!   1. burst 0 → N: the daemon (`incus-hpa run`, min = max = N) against the same N
//!      create+start requests sent one after another, for several `max_parallel_actions`;
//!   2. the daemon's resident memory while it manages those N instances (VmRSS, VmHWM);
//!   3. scale-up latency, from the decision to the instance running, cold (a creation) against
//!      warm (`warm_pool = 1`: a start), with the busybox image and, when `DEBIAN=1`, the Debian
//!      image (`scripts/build-debian-image.sh` builds it, about a minute, when missing).
//!
//! Run: `cargo bench --bench burst -- 50` (N, default 50); `PARALLEL=1,2,4,8` for the values of
//! `max_parallel_actions` to compare; `BURST_LOGS=DIR` keeps the daemon's logs, `BURST_LOG` sets
//! their `RUST_LOG`. Every instance it makes is removed at the end.

#[path = "support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use incus_hpa::incus::Incus;
use support::*;

const GROUP: &str = "bench-burst";
const LATENCY: &str = "bench-warm";

fn toml(group: &str, image: &str, min: u32, max: u32, extra: &str) -> String {
    format!(
        "[daemon]\ninterval = \"1s\"\n{extra}\n[groups.{group}]\nmin = {min}\nmax = {max}\n\
         memory_threshold = 40\nimage = \"{image}\"\nscale_down_stabilization = \"1h\"\n\
         stop_timeout = \"1s\"\n\n[groups.{group}.config]\n\"limits.memory\" = \"64MiB\"\n"
    )
}

/// `incus-hpa run` on `text`, logging to `log`; stopped (SIGTERM) when dropped, a panic
/// included, so that no daemon outlives the benchmark.
fn daemon(dir: &Path, text: &str, log: &Path) -> Daemon {
    let file = dir.join("desired-state.toml");
    std::fs::write(&file, text).expect("config");
    let child = Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .args(["run", "--config"])
        .arg(&file)
        .env(
            "RUST_LOG",
            std::env::var("BURST_LOG").unwrap_or_else(|_| "incus_hpa=info".into()),
        )
        .env_remove("JOURNAL_STREAM")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("the daemon");
    Daemon(child)
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// Waits until the daemon's log has `n` lines with every part, then checks on one listing
/// that `group` has at least `n` running instances. The wait reads the log, not Incus: on
/// Incus 6.0 rendering an instance while it starts (any list or `/state` of it) can stall its
/// start until the 90 s start timeout, so polling a list during a burst would measure that.
async fn until_logged(
    incus: &dyn Incus,
    log: &Path,
    parts: &[&str],
    group: &str,
    n: usize,
    within: Duration,
) {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let done = text
            .lines()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .count();
        if done >= n {
            break;
        }
        assert!(
            start.elapsed() < within,
            "{group}: {done} of {n} done\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let running = members(incus, group)
        .await
        .iter()
        .filter(|(_, s)| s == "Running")
        .count();
    assert!(running >= n, "{group}: {running} of {n} running");
}

const CREATED: &[&str] = &["action=\"create\"", "outcome=\"ok\""];

/// Creates and starts `n` instances of the group, `p` at a time, as the daemon would; returns
/// how long it took, and removes them.
async fn raw(
    incus: &dyn Incus,
    spec: &incus_hpa::model::GroupSpec,
    n: usize,
    p: usize,
) -> Duration {
    use futures_util::StreamExt;
    let t = Instant::now();
    futures_util::stream::iter(0..n)
        .for_each_concurrent(p, |_| async {
            let name = incus_hpa::act::new_name(&spec.instance_prefix);
            let req =
                incus_hpa::act::create_request(spec, &name, &incus_hpa::act::new_uuid(), false);
            incus.create("default", &req).await.expect("create");
        })
        .await;
    let took = t.elapsed();
    empty(incus, spec.name.as_str()).await;
    took
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The time of the first log line containing every part, after `from`.
fn logged(log: &Path, parts: &[&str], from: SystemTime) -> Option<SystemTime> {
    std::fs::read_to_string(log).ok()?.lines().find_map(|l| {
        if !parts.iter().all(|p| l.contains(p)) {
            return None;
        }
        let t = humantime::parse_rfc3339(l.split_whitespace().next()?).ok()?;
        (t >= from).then_some(t)
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(50);
    let parallel: Vec<usize> = std::env::var("PARALLEL")
        .unwrap_or_else(|_| "1,2,4,8".into())
        .split(',')
        .filter_map(|p| p.parse().ok())
        .collect();
    let _cleanup = (Cleanup(GROUP.into()), Cleanup(LATENCY.into()));
    let incus = client();
    let tmp = tempfile::tempdir().expect("tempdir");
    // BURST_LOGS=DIR keeps the daemon's logs there.
    let keep = std::env::var_os("BURST_LOGS").map(std::path::PathBuf::from);
    let dir = keep.as_deref().unwrap_or(tmp.path());
    let spec = spec(GROUP, "busybox");

    // 1. The same N creations one after another, then k at a time straight from the API (the
    // floor), then by the daemon.
    let sequential = raw(incus.as_ref(), &spec, n, 1).await;
    println!("| burst 0 → {n} | time | vs one after another |");
    println!("|---|---|---|");
    println!(
        "| one after another | {:.1} s | 1.00× |",
        sequential.as_secs_f64()
    );
    for p in parallel.iter().filter(|p| **p > 1) {
        let took = raw(incus.as_ref(), &spec, n, *p).await;
        println!(
            "| API, {p} at a time (no daemon) | {:.1} s | {:.2}× |",
            took.as_secs_f64(),
            took.as_secs_f64() / sequential.as_secs_f64()
        );
    }
    let mut rss = None;
    for (k, p) in parallel.iter().enumerate() {
        let log = dir.join(format!("burst-{p}.log"));
        let text = toml(
            GROUP,
            "busybox",
            n as u32,
            n as u32,
            &format!("max_parallel_actions = {p}"),
        );
        let t = Instant::now();
        let child = daemon(dir, &text, &log);
        until_logged(
            incus.as_ref(),
            &log,
            CREATED,
            GROUP,
            n,
            Duration::from_secs(600),
        )
        .await;
        let took = t.elapsed();
        println!(
            "| daemon, max_parallel_actions = {p} | {:.1} s | {:.2}× |",
            took.as_secs_f64(),
            took.as_secs_f64() / sequential.as_secs_f64()
        );
        if k + 1 == parallel.len() {
            // 2. Memory, after a while of steady passes over the N instances.
            tokio::time::sleep(Duration::from_secs(20)).await;
            rss = Some((
                status_kib(child.0.id(), "VmRSS:"),
                status_kib(child.0.id(), "VmHWM:"),
            ));
        }
        drop(child);
        empty(incus.as_ref(), GROUP).await;
    }
    if let Some((now, peak)) = rss {
        println!();
        println!(
            "daemon memory with {n} instances: VmRSS {:.1} MiB, peak (VmHWM) {:.1} MiB",
            now as f64 / 1024.0,
            peak as f64 / 1024.0
        );
    }

    // 3. Scale-up latency, cold and warm.
    let mut images = vec!["busybox"];
    if std::env::var("DEBIAN").is_ok_and(|d| d == "1") {
        let built = Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/build-debian-image.sh"
            ))
            .status()
            .expect("build-debian-image.sh");
        assert!(built.success(), "could not build the Debian image");
        images.push("incus-hpa-bookworm");
    }
    println!();
    println!("| image | scale-up, decision to running: cold | warm | warm vs cold |");
    println!("|---|---|---|---|");
    for image in images {
        let mut took = Vec::new();
        for warm in [0, 1] {
            let log = dir.join(format!("latency-{warm}.log"));
            let text = toml(LATENCY, image, 1, 2, "").replace(
                "[groups.bench-warm.config]",
                &format!("warm_pool = {warm}\n[groups.bench-warm.config]"),
            );
            forget_learned(LATENCY);
            let child = daemon(dir, &text, &log);
            let minute = Duration::from_secs(60);
            until_logged(incus.as_ref(), &log, CREATED, LATENCY, 1, minute).await;
            if warm == 1 {
                let filled = ["action=\"create-warm\"", "outcome=\"ok\""];
                until_logged(incus.as_ref(), &log, &filled, LATENCY, 1, minute).await;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            let busy = members(incus.as_ref(), LATENCY)
                .await
                .into_iter()
                .find(|(_, s)| s == "Running")
                .expect("a running instance")
                .0;
            let from = SystemTime::now();
            let fill = "mountpoint -q /dev/shm || mount -t tmpfs -o size=60m tmpfs /dev/shm; \
                        dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 2>/dev/null";
            let out = Command::new("incus")
                .args(["exec", &busy, "--", "sh", "-c", fill])
                .output()
                .expect("incus exec");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let done = if warm == 1 {
                "action=\"promote\""
            } else {
                "action=\"create\""
            };
            let deadline = Instant::now() + Duration::from_secs(300);
            let (decided, running) = loop {
                let decided = logged(&log, &["scaling up"], from);
                let running = decided
                    .and_then(|d| logged(&log, &[done, "outcome=\"ok\""], d).map(|r| (d, r)));
                if let Some(both) = running {
                    break both;
                }
                assert!(
                    Instant::now() < deadline,
                    "no scale-up\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            took.push(running.duration_since(decided).unwrap_or_default());
            drop(child);
            empty(incus.as_ref(), LATENCY).await;
        }
        println!(
            "| {image} | {:.2} s | {:.2} s | {:.2}× |",
            took[0].as_secs_f64(),
            took[1].as_secs_f64(),
            took[1].as_secs_f64() / took[0].as_secs_f64()
        );
    }
}
