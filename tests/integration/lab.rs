//! The world of a real-Incus test: the `incus` CLI, a daemon process on a desired-state file of
//! its own, a random group name, and cleanup of every instance the test made (managed or not).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const KEY: &str = "user.incus-hpa.group";

/// Longest any `incus` command of a test may take: past it the command is killed and the
/// test fails with what was asked. Incus 6.0 can leave an instance whose start failed
/// stuck, after which every stop or delete of it waits forever; no test may wait with it.
pub const INCUS_CALL_LIMIT: Duration = Duration::from_secs(120);

/// `incus ARGS…`, killed after [`INCUS_CALL_LIMIT`] (exit status 124 then, and a stderr that
/// says so).
pub fn incus(args: &[&str]) -> Output {
    incus_within(args, INCUS_CALL_LIMIT)
}

/// `incus ARGS…`, killed after `limit`.
pub fn incus_within(args: &[&str], limit: Duration) -> Output {
    let mut out = Command::new("timeout")
        .args([
            "--kill-after=5",
            &format!("{}s", limit.as_secs().max(1)),
            "incus",
        ])
        .args(args)
        .output()
        .expect("the incus CLI is not installed");
    if killed(&out) {
        out.stderr.extend_from_slice(
            format!(
                "\n(incus {args:?} did not answer within {limit:?}: killed; `incus operation \
                 list` shows what Incus waits for)"
            )
            .as_bytes(),
        );
    }
    out
}

/// Writes down a read Incus left unanswered for `limit`, with what Incus was doing then: its
/// operations and the end of its log (where scripts/setup-incus.sh sends it).
fn note_stall(what: &str, limit: Duration) {
    let ops = incus_within(&["operation", "list", "-f", "csv"], Duration::from_secs(20));
    let ops = if killed(&ops) {
        "(no answer to `incus operation list` either within 20 s)".to_owned()
    } else {
        String::from_utf8_lossy(&ops.stdout).trim_end().to_owned()
    };
    let log = std::fs::read_to_string(INCUSD_LOG).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(15).collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 86_400);
    let note = format!(
        "{:02}:{:02}:{:02} UTC, {}: {what} got no answer within {limit:?}; asked again. \
         Operations:\n{}\nincusd's log ends:\n{}\n",
        now / 3600,
        now / 60 % 60,
        now % 60,
        std::thread::current().name().unwrap_or("a test"),
        ops,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    write_stall(&note);
}

/// Writes `note` on stderr and in [`STALL_LOG`].
fn write_stall(note: &str) {
    eprint!("{note}");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(STALL_LOG)
    {
        use std::io::Write;
        let _ = f.write_all(note.as_bytes());
    }
}

/// Whether `timeout` killed the command (124 after its signal, 137 after `--kill-after`).
fn killed(out: &Output) -> bool {
    matches!(out.status.code(), Some(124 | 137))
}

pub fn incus_ok(args: &[&str]) -> String {
    let out = incus(args);
    assert!(
        out.status.success(),
        "incus {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails (never skips) when no usable Incus is there.
pub fn require_incus() {
    let out = Command::new("timeout")
        .args(["60", "incus", "image", "show", "busybox"])
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

/// Every instance of `project`, as `GET /1.0/instances?recursion=1` gives them (name, status,
/// config, created_at). Never `incus list` or `incus info`: they render every instance's state
/// (recursion 2), which on Incus 6.0 can stall starts running at the same time for 90 s.
pub fn instances(project: &str) -> Vec<serde_json::Value> {
    try_instances(project).unwrap_or_else(|e| panic!("{e}"))
}

/// Longest one read of the instance list may take before it is asked again, and how many
/// times it is asked. Incus 6.0 has left such a read unanswered for over 120 s (once in a CI
/// run, beside two daemons and a copy of a running instance) and answered the next one.
const QUERY_LIMIT: Duration = Duration::from_secs(60);
const QUERY_TRIES: u32 = 3;

/// Where a read that Incus left unanswered, or a wait that met a start Incus failed, is
/// written down (scripts/test.sh prints the file at the end, so a stall the tests waited out
/// is still seen).
pub const STALL_LOG: &str = "/tmp/incus-hpa-test-stalls.log";

/// [`instances`], or what went wrong.
pub fn try_instances(project: &str) -> Result<Vec<serde_json::Value>, String> {
    let path = format!("/1.0/instances?recursion=1&project={project}");
    let mut out = incus_within(&["query", &path], QUERY_LIMIT);
    for _ in 1..QUERY_TRIES {
        if !killed(&out) {
            break;
        }
        note_stall(&format!("incus query {path}"), QUERY_LIMIT);
        out = incus_within(&["query", &path], QUERY_LIMIT);
    }
    if killed(&out) {
        note_stall(&format!("incus query {path}"), QUERY_LIMIT);
    }
    if !out.status.success() {
        return Err(format!(
            "incus query {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    match serde_json::from_slice(&out.stdout) {
        Ok(serde_json::Value::Array(list)) => Ok(list),
        Ok(other) => Err(format!("not a list of instances: {other}")),
        Err(e) => Err(format!("incus query {path}: {e}")),
    }
}

/// Every instance with `KEY` exactly `group`: (name, status), oldest first.
pub fn managed(group: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String, String)> = instances("default")
        .iter()
        .filter(|i| i["config"][KEY].as_str() == Some(group))
        .map(|i| {
            (
                i["created_at"].as_str().unwrap_or("").to_owned(),
                i["name"].as_str().unwrap_or("").to_owned(),
                i["status"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, n, s)| (n, s)).collect()
}

/// Healthy instances (Running or Ready) of the group.
pub fn running(group: &str) -> usize {
    managed(group)
        .iter()
        .filter(|(_, s)| s == "Running" || s == "Ready")
        .count()
}

/// An instance's status in capitals, as `incus list` shows it (`RUNNING`, `STOPPED`…); empty
/// when it does not exist.
pub fn status_in(project: &str, name: &str) -> String {
    instances(project)
        .iter()
        .find(|i| i["name"].as_str() == Some(name))
        .and_then(|i| i["status"].as_str())
        .unwrap_or("")
        .to_uppercase()
}

pub fn exists(name: &str) -> bool {
    instances("default")
        .iter()
        .any(|i| i["name"].as_str() == Some(name))
}

/// The `-c` arguments that make `name` an instance the daemon created for `group` (as a crash
/// of the daemon, or a reboot, would leave it).
pub fn owned(group: &str, name: &str) -> Vec<String> {
    let uuid = incus_hpa::act::new_uuid();
    let owner = incus_hpa::decide::owner_value("default", name, &uuid);
    [
        format!("{KEY}={group}"),
        format!("{}={owner}", incus_hpa::model::OWNER_KEY),
        format!("volatile.uuid={uuid}"),
    ]
    .into_iter()
    .flat_map(|c| ["-c".to_owned(), c])
    .collect()
}

/// `incus ARGS… EXTRA…`, which must work.
pub fn incus_with(args: &[&str], extra: &[String]) -> String {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(extra.iter().map(String::as_str));
    incus_ok(&all)
}

/// Where scripts/setup-incus.sh sends incusd's log (warnings and errors).
const INCUSD_LOG: &str = "/var/log/incus-hpa-incusd.log";

/// How much longer a wait goes on, once, when Incus failed a start while it ran: Incus 6.0
/// now and then leaves a container start hanging until its 90 s timeout (then logs "Failed
/// starting instance"), and the daemon's creation fails and is made again at the next pass.
const START_STALL_GRACE: Duration = Duration::from_secs(120);

/// How long incusd's log is now (where to look from for what it logs next).
fn incusd_log_len() -> u64 {
    std::fs::metadata(INCUSD_LOG).map_or(0, |m| m.len())
}

/// The first start Incus logged as failed past `offset` of its log.
fn failed_start_since(offset: u64) -> Option<String> {
    use std::io::{Seek, SeekFrom};
    let mut log = std::fs::File::open(INCUSD_LOG).ok()?;
    log.seek(SeekFrom::Start(offset)).ok()?;
    let mut text = String::new();
    log.read_to_string(&mut text).ok()?;
    text.lines()
        .find(|l| l.contains("Failed starting instance"))
        .map(str::to_owned)
}

/// Polls `cond` every 250 ms until it holds; panics with the daemon's log after `within`
/// ([`START_STALL_GRACE`] more, once, when Incus failed a start meanwhile: written down in
/// [`STALL_LOG`]).
pub fn eventually(
    lab: &Lab,
    what: &str,
    within: Duration,
    mut cond: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    let log_at = incusd_log_len();
    let mut within = within;
    let mut extended = false;
    while !cond() {
        if start.elapsed() > within {
            match failed_start_since(log_at).filter(|_| !extended) {
                Some(line) => {
                    write_stall(&format!(
                        "{}: Incus failed a start while the test waited {within:?} for \
                         {what}; waiting {START_STALL_GRACE:?} more. incusd logged:\n{line}\n",
                        std::thread::current().name().unwrap_or("a test"),
                    ));
                    extended = true;
                    within += START_STALL_GRACE;
                }
                None => panic!(
                    "timed out after {within:?} waiting for: {what}\n--- daemon log ---\n{}",
                    lab.log()
                ),
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    start.elapsed()
}

/// One test's world: a group name, a daemon process, and the instances to remove at the end.
pub struct Lab {
    pub group: String,
    pub extra: Vec<String>,
    pub daemon: Option<Child>,
    pub dir: tempfile::TempDir,
}

impl Lab {
    pub fn new(tag: &str) -> Self {
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

    /// Another daemon's world on the same group (its own directory, file and log).
    pub fn beside(&self) -> Self {
        Self {
            group: self.group.clone(),
            extra: Vec::new(),
            daemon: None,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.log_path()) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Launches an instance the daemon did not create (removed at the end).
    pub fn launch_unmanaged(&mut self, name: &str, config: &[&str]) {
        let mut args = vec!["launch", "busybox", name, "-c", "limits.memory=64MiB"];
        for c in config {
            args.extend(["-c", c]);
        }
        incus_ok(&args);
        self.extra.push(name.to_owned());
    }

    pub fn start(&mut self, toml: &str) {
        self.start_with(toml, None, &[]);
    }

    /// Starts the daemon on `toml`, through the Incus socket `socket` when given, with extra
    /// environment variables.
    pub fn start_with(&mut self, toml: &str, socket: Option<&Path>, env: &[(&str, &str)]) {
        let file = self.config_path();
        std::fs::write(&file, with_test_lease(toml)).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_incus-hpa"));
        if let Some(socket) = socket {
            cmd.arg("--incus-socket").arg(socket);
        }
        let child = cmd
            .args(["run", "--config"])
            .arg(&file)
            .env("RUST_LOG", "incus_hpa=debug")
            .env_remove("JOURNAL_STREAM")
            .env_remove("NOTIFY_SOCKET")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.daemon = Some(child);
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("desired-state.toml")
    }

    /// Replaces the desired-state file and tells the daemon (SIGHUP; saving reloads too).
    pub fn reload(&self, toml: &str) {
        std::fs::write(self.config_path(), with_test_lease(toml)).unwrap();
        if let Some(child) = &self.daemon {
            Command::new("kill")
                .args(["-HUP", &child.id().to_string()])
                .status()
                .unwrap();
        }
    }

    /// How many lines of the daemon's log contain every one of `parts`.
    pub fn log_count(&self, parts: &[&str]) -> usize {
        count_lines(&self.log(), parts)
    }

    /// The log of the daemon's last run (the log file is kept across restarts).
    pub fn last_run_log(&self) -> String {
        let log = self.log();
        let start = log
            .rfind(" started: ")
            .map_or(0, |i| log[..i].rfind('\n').map_or(0, |n| n + 1));
        log[start..].to_owned()
    }

    /// Sends SIGTERM and returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
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

    pub fn exec(&self, name: &str, script: &str) {
        incus_ok(&["exec", name, "--", "sh", "-c", script]);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A creation the daemon had sent may still complete inside incusd after it died:
        // remove everything named after the group until nothing is left for a second.
        let prefix = format!("{}-", self.group);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut quiet_since = Instant::now();
        let mut stuck = Vec::new();
        while Instant::now() < deadline && quiet_since.elapsed() < Duration::from_secs(1) {
            // Never a panic here (a Drop while a failed test unwinds would abort the run).
            let listed = try_instances("default").unwrap_or_default();
            let mut names: Vec<String> = listed
                .iter()
                .filter(|i| {
                    i["config"][KEY].as_str() == Some(self.group.as_str())
                        || i["name"].as_str().is_some_and(|n| n.starts_with(&prefix))
                })
                .filter_map(|i| i["name"].as_str())
                .map(str::to_owned)
                .collect();
            names.append(&mut self.extra);
            names.sort();
            names.dedup();
            names.retain(|n| !stuck.contains(n));
            if !names.is_empty() {
                quiet_since = Instant::now();
            }
            // All at once; one at a time only when that did not end (one of them is stuck).
            let mut all = vec!["delete", "--force"];
            all.extend(names.iter().map(String::as_str));
            if names.is_empty() || !killed(&incus_within(&all, Duration::from_secs(30))) {
                names.clear();
            }
            for n in names {
                let out = incus_within(&["delete", "--force", &n], Duration::from_secs(30));
                if killed(&out) {
                    eprintln!(
                        "cleanup: incus delete --force {n} did not end within 30 s (an instance \
                         Incus left stuck); left behind"
                    );
                    stuck.push(n);
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        // A daemon killed rather than stopped leaves its lease behind.
        let key = format!("user.incus-hpa.lease.{}", self.group);
        let _ = incus(&["profile", "unset", "incus-hpa.leases", &key]);
    }
}

/// How many lines of `text` contain every one of `parts`.
pub fn count_lines(text: &str, parts: &[&str]) -> usize {
    text.lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .count()
}

/// The lease the lab's daemons hold when a test sets none: 6 s. A new lease is confirmed a
/// third of its length after it is taken, 2 s here against the default's 5 s, and every test
/// starts at least one daemon; the tests about leases set their own `lease`.
const TEST_LEASE: &str = "lease = \"6s\"";

/// `toml` with [`TEST_LEASE`] in its `[daemon]` table, unless it says a lease of its own.
fn with_test_lease(toml: &str) -> String {
    let has_lease = toml.lines().any(|l| l.trim_start().starts_with("lease"));
    if has_lease || !toml.contains("[daemon]\n") {
        return toml.to_owned();
    }
    toml.replacen("[daemon]\n", &format!("[daemon]\n{TEST_LEASE}\n"), 1)
}

pub fn config(group: &str, min: u32, max: u32, extra: &str) -> String {
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

pub const FILL: &str = "mountpoint -q /dev/shm || mount -t tmpfs -o size=60m tmpfs /dev/shm; \
                    dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 2>/dev/null";
