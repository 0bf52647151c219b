//! Scale-up speed and the daemon's memory, on the real Incus, side by side in one run:
//!   1. burst 0 → N: the daemon (`incus-hpa run`, min = max = N) against the same N
//!      create+start requests sent one after another, for several `max_parallel_actions`;
//!   2. the daemon's resident memory while it manages those N instances (VmRSS, VmHWM);
//!   3. scale-up latency, from the decision to the instance running, cold (a creation) against
//!      warm (`warm_pool = 1`: a start), with the busybox image and, when `DEBIAN=1`, the Debian
//!      image (`scripts/build-debian-image.sh` builds it, about a minute, when missing).
//!
//! Run: `cargo bench --bench burst -- 50` (N, default 50); `PARALLEL=1,2,4,8` for the values of
//! `max_parallel_actions` to compare. Every instance it makes is removed at the end.

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

/// `incus-hpa run` on `text`, logging to `log`.
fn daemon(dir: &Path, text: &str, log: &Path) -> Child {
    let file = dir.join("desired-state.toml");
    std::fs::write(&file, text).expect("config");
    Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .args(["run", "--config"])
        .arg(&file)
        .env("RUST_LOG", "incus_hpa=info")
        .env_remove("JOURNAL_STREAM")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("the daemon")
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// Polls until `group` has `n` running instances.
async fn until_running(incus: &dyn Incus, group: &str, n: usize, within: Duration) {
    let start = Instant::now();
    loop {
        let running = members(incus, group)
            .await
            .iter()
            .filter(|(_, s)| s == "Running")
            .count();
        if running >= n {
            return;
        }
        assert!(
            start.elapsed() < within,
            "{group}: {running} of {n} running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = spec(GROUP, "busybox");

    // 1. The same N creations one after another, then by the daemon.
    let t = Instant::now();
    for _ in 0..n {
        let name = incus_hpa::act::new_name(&spec.instance_prefix);
        let req = incus_hpa::act::create_request(&spec, &name, &incus_hpa::act::new_uuid(), false);
        incus.create("default", &req).await.expect("create");
    }
    let sequential = t.elapsed();
    empty(incus.as_ref(), GROUP).await;
    println!("| burst 0 → {n} | time | vs one after another |");
    println!("|---|---|---|");
    println!(
        "| one after another | {:.1} s | 1.00× |",
        sequential.as_secs_f64()
    );
    let mut rss = None;
    for (k, p) in parallel.iter().enumerate() {
        let log = dir.path().join(format!("burst-{p}.log"));
        let text = toml(
            GROUP,
            "busybox",
            n as u32,
            n as u32,
            &format!("max_parallel_actions = {p}"),
        );
        let t = Instant::now();
        let child = daemon(dir.path(), &text, &log);
        until_running(incus.as_ref(), GROUP, n, Duration::from_secs(600)).await;
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
                status_kib(child.id(), "VmRSS:"),
                status_kib(child.id(), "VmHWM:"),
            ));
        }
        stop(child);
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
            let log = dir.path().join(format!("latency-{warm}.log"));
            let text = toml(LATENCY, image, 1, 2, "").replace(
                "[groups.bench-warm.config]",
                &format!("warm_pool = {warm}\n[groups.bench-warm.config]"),
            );
            let child = daemon(dir.path(), &text, &log);
            until_running(incus.as_ref(), LATENCY, 1, Duration::from_secs(300)).await;
            // Wait for the pool to be full, then for things to settle.
            let deadline = Instant::now() + Duration::from_secs(300);
            while members(incus.as_ref(), LATENCY).await.len() < 1 + warm {
                assert!(Instant::now() < deadline, "the warm pool never filled");
                tokio::time::sleep(Duration::from_millis(200)).await;
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
            until_running(incus.as_ref(), LATENCY, 2, Duration::from_secs(300)).await;
            let done = if warm == 1 {
                "from the warm pool"
            } else {
                "action=\"create\""
            };
            let decided = logged(&log, &["scaling up"], from).expect("the decision");
            let running = logged(&log, &[done, "outcome=\"ok\""], decided).expect("the action");
            took.push(running.duration_since(decided).unwrap_or_default());
            stop(child);
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
