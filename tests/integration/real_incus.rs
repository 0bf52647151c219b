//! The daemon binary against a real incusd with the local `busybox` image. Ignored by a plain
//! `cargo test`; `scripts/test.sh` (and CI) run them with `--include-ignored`, and they fail,
//! not skip, when Incus is not there. Each test uses its own random group name and removes
//! every instance it made, managed or not.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "user.incus-hpa.group";

fn incus(args: &[&str]) -> Output {
    Command::new("incus")
        .args(args)
        .output()
        .expect("the incus CLI is not installed")
}

fn incus_ok(args: &[&str]) -> String {
    let out = incus(args);
    assert!(
        out.status.success(),
        "incus {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails (never skips) when no usable Incus is there.
fn require_incus() {
    let out = Command::new("incus")
        .args(["image", "show", "busybox"])
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "real-Incus test cannot run: {} — run scripts/setup-incus.sh first",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!(
            "real-Incus test cannot run: no incus CLI ({e}) — run scripts/setup-incus.sh first"
        ),
    }
}

/// Every instance with `KEY` exactly `group`: (name, status), oldest first.
fn managed(group: &str) -> Vec<(String, String)> {
    let json = incus_ok(&["list", "-f", "json"]);
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut out: Vec<(String, String, String)> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["config"][KEY].as_str() == Some(group))
        .map(|i| {
            (
                i["created_at"].as_str().unwrap_or("").to_owned(),
                i["name"].as_str().unwrap().to_owned(),
                i["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, n, s)| (n, s)).collect()
}

fn running(group: &str) -> usize {
    managed(group)
        .iter()
        .filter(|(_, s)| s == "Running")
        .count()
}

fn exists(name: &str) -> bool {
    incus(&["info", name]).status.success()
}

/// Polls `cond` every 250 ms until it holds; panics with the daemon's log after `within`.
fn eventually(lab: &Lab, what: &str, within: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > within {
            panic!(
                "timed out after {within:?} waiting for: {what}\n--- daemon log ---\n{}",
                lab.log()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    start.elapsed()
}

/// One test's world: a group name, a daemon process, and the instances to remove at the end.
struct Lab {
    group: String,
    extra: Vec<String>,
    daemon: Option<Child>,
    dir: tempfile::TempDir,
}

impl Lab {
    fn new(tag: &str) -> Self {
        require_incus();
        let group = format!(
            "it{tag}-{}",
            fastrand::u32(..)
                .to_string()
                .chars()
                .take(6)
                .collect::<String>()
        );
        Self {
            group,
            extra: Vec::new(),
            daemon: None,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }

    fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.log_path()) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Launches an instance the daemon did not create (removed at the end).
    fn launch_unmanaged(&mut self, name: &str, config: &[&str]) {
        let mut args = vec!["launch", "busybox", name, "-c", "limits.memory=64MiB"];
        for c in config {
            args.extend(["-c", c]);
        }
        incus_ok(&args);
        self.extra.push(name.to_owned());
    }

    fn start(&mut self, toml: &str) {
        let file = self.dir.path().join("desired-state.toml");
        std::fs::write(&file, toml).unwrap();
        let log = std::fs::File::create(self.log_path()).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
            .args(["run", "--config"])
            .arg(&file)
            .env("RUST_LOG", "incus_hpa=debug")
            .env_remove("JOURNAL_STREAM")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.daemon = Some(child);
    }

    /// Sends SIGTERM and returns the exit code.
    fn terminate(&mut self) -> Option<i32> {
        let mut child = self.daemon.take()?;
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!(
                    "the daemon did not exit within 60 s of SIGTERM\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn exec(&self, name: &str, script: &str) {
        incus_ok(&["exec", name, "--", "sh", "-c", script]);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut names: Vec<String> = managed(&self.group).into_iter().map(|(n, _)| n).collect();
        names.append(&mut self.extra);
        for n in names {
            let _ = incus(&["delete", "--force", &n]);
        }
    }
}

fn config(group: &str, min: u32, max: u32, extra: &str) -> String {
    format!(
        r#"
[daemon]
interval = "1s"

[groups.{group}]
min = {min}
max = {max}
memory_threshold = 40
image = "busybox"
scale_down_stabilization = "6s"
stop_timeout = "1s"
{extra}
[groups.{group}.config]
"limits.memory" = "64MiB"
"#
    )
}

const FILL: &str = "mountpoint -q /dev/shm || mount -t tmpfs -o size=60m tmpfs /dev/shm; \
                    dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 2>/dev/null";

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_scale_up_on_memory_and_down_after_the_window() {
    let mut lab = Lab::new("scale");
    let g = lab.group.clone();
    // A person's instances with the group's own prefix, one with the key in another case.
    lab.launch_unmanaged(&format!("{g}-manual"), &[]);
    lab.launch_unmanaged(
        &format!("{g}-upper"),
        &[&format!("{KEY}={}", g.to_uppercase())],
    );

    lab.start(&config(&g, 1, 3, ""));
    eventually(&lab, "min (1) running", Duration::from_secs(60), || {
        running(&g) == 1
    });
    let first = managed(&g)[0].0.clone();

    // 40 MiB of 64 MiB = 62 % against a 40 % target: ceil(62 / 40) = 2.
    lab.exec(&first, FILL);
    let t = eventually(&lab, "scale-up to 2", Duration::from_secs(60), || {
        running(&g) == 2
    });
    eprintln!(
        "memory over threshold -> second instance running: {:.1} s",
        t.as_secs_f64()
    );

    // Released: back to min once the 6 s window has passed; the newest goes, the first stays.
    lab.exec(&first, "rm -f /dev/shm/fill");
    let t = eventually(&lab, "scale-down to 1", Duration::from_secs(60), || {
        managed(&g).len() == 1
    });
    eprintln!("memory released -> back to min: {:.1} s", t.as_secs_f64());
    assert_eq!(managed(&g)[0].0, first, "the oldest instance is kept");

    for name in [format!("{g}-manual"), format!("{g}-upper")] {
        assert!(exists(&name), "{name} was touched\n{}", lab.log());
    }
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
    let left = managed(&g);
    assert!(
        left.iter().all(|(_, s)| s == "Running"),
        "stopped orphans: {left:?}"
    );
    let log = lab.log();
    assert!(log.contains("reason=\"above-threshold\""), "{log}");
    assert!(log.contains("action=\"delete\" outcome=\"ok\""), "{log}");
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_failing_group_and_stopped_leftovers() {
    let mut lab = Lab::new("fail");
    let g = lab.group.clone();
    let bad = format!("{g}-bad");
    // A managed instance left stopped by a crash: started again, not replaced.
    incus_ok(&[
        "create",
        "busybox",
        &format!("{g}-left"),
        "-c",
        &format!("{KEY}={g}"),
    ]);
    let toml = format!(
        "{}\n[groups.{bad}]\nmax = 2\nmemory_threshold = 50\nimage = \"no-such-image-incus-hpa\"\n",
        config(&g, 1, 2, "")
    );
    lab.start(&toml);
    eventually(&lab, "leftover started", Duration::from_secs(60), || {
        running(&g) == 1
    });
    assert_eq!(
        managed(&g),
        vec![(format!("{g}-left"), "Running".to_owned())]
    );
    let failed = format!("reconciling {bad} failed");
    eventually(&lab, "the failure logged", Duration::from_secs(30), || {
        lab.log().contains(&failed)
    });
    assert!(
        managed(&bad).is_empty(),
        "a failed creation left {:?}",
        managed(&bad)
    );
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
    let log = lab.log();
    assert!(log.contains(&format!("group={bad}")), "{log}");
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_plan_shows_the_decision_and_acts_on_nothing() {
    let mut lab = Lab::new("plan");
    let g = lab.group.clone();
    incus_ok(&[
        "launch",
        "busybox",
        &format!("{g}-a"),
        "-c",
        &format!("{KEY}={g}"),
        "-c",
        "limits.memory=64MiB",
    ]);
    lab.extra.push(format!("{g}-a"));
    lab.exec(&format!("{g}-a"), FILL);
    let file = lab.dir.path().join("plan.toml");
    for source in ["cgroup", "api"] {
        let toml = config(&g, 1, 3, "").replace(
            "[daemon]",
            &format!("[daemon]\nmemory_source = \"{source}\""),
        );
        std::fs::write(&file, toml).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
            .args(["plan", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{source}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // 40 MiB of 64 MiB (62 %) against a 40 % target: 2 recommended.
        assert!(
            text.contains(&format!("{g}: 1 instance(s)")),
            "{source}: {text}"
        );
        assert!(
            text.contains("recommends 2 (above-threshold)"),
            "{source}: {text}"
        );
    }
    assert_eq!(managed(&g).len(), 1, "plan created or deleted something");
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_deleted_instance_is_replaced_on_the_incus_event() {
    let mut lab = Lab::new("event");
    let g = lab.group.clone();
    // One pass at start, then none for an hour: only the lifecycle event can trigger the next.
    lab.start(&config(&g, 2, 3, "").replace("interval = \"1s\"", "interval = \"1h\""));
    eventually(&lab, "min (2) running", Duration::from_secs(60), || {
        running(&g) == 2
    });
    let victim = managed(&g)[0].0.clone();
    incus_ok(&["delete", "--force", &victim]);
    let t = eventually(&lab, "replacement", Duration::from_secs(30), || {
        running(&g) == 2 && !exists(&victim)
    });
    eprintln!(
        "deleted by hand -> replacement running: {:.1} s",
        t.as_secs_f64()
    );
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}
