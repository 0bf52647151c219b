//! The binary's command line: `validate` exit codes (the file's modes included) and located
//! messages, examples, help.

use std::path::Path;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
}

fn validate(text: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("desired-state.toml");
    std::fs::write(&file, text).unwrap();
    let out = bin()
        .args(["validate", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).replace(&*file.to_string_lossy(), "FILE");
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

#[test]
fn validate_accepts_a_good_file() {
    let (code, out, err) = validate(
        "[groups.web]\nmax = 2\nmemory_threshold = 70\nimage = \"busybox\"\n\
         [groups.web.config]\n\"limits.memory\" = \"64MiB\"\n",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("OK, 1 group(s)"));
}

#[test]
fn validate_reports_every_error_with_its_place() {
    let (code, _, err) =
        validate("[groups.web]\nmin = 3\nmax = 2\nmemory_threshold = 0\nimage = \"b\"\n");
    assert_eq!(code, 1);
    assert!(
        err.contains("FILE:2:7: error: groups.web.min: min (3) is greater than max (2)"),
        "{err}"
    );
    assert!(
        err.contains("FILE:4:20: error: groups.web.memory_threshold:"),
        "{err}"
    );
}

#[test]
fn validate_warns_about_a_missing_memory_limit() {
    let (code, _, err) = validate("[groups.web]\nmax = 2\nmemory_threshold = 70\nimage = \"b\"\n");
    assert_eq!(code, 0);
    assert!(
        err.contains("warning: groups.web.config: no \"limits.memory\""),
        "{err}"
    );
}

#[test]
fn validate_names_an_unreadable_file() {
    let validate = |flags: &[&str]| {
        let out = bin()
            .args(["validate", "--config", "/nonexistent/x.toml"])
            .args(flags)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // As `run` opens it, one component at a time: the missing one is named.
    let err = validate(&[]);
    assert!(
        err.contains("/nonexistent/x.toml: error: /nonexistent: no such file or directory"),
        "{err}"
    );
    let err = validate(&["--syntax-only"]);
    assert!(
        err.contains("/nonexistent/x.toml: error: cannot read the file"),
        "{err}"
    );
}

#[test]
fn every_example_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            // Their content: the checkout's own modes are not the examples' business.
            let out = bin()
                .args(["validate", "--syntax-only", "--config"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            n += 1;
        }
    }
    assert!(n >= 1, "no examples in {}", dir.display());
}

#[test]
fn help_and_version() {
    let out = bin().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "validate", "plan", "--incus-socket"] {
        assert!(help.contains(cmd), "{help}");
    }
    let out = bin().arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("incus-hpa "));
}

#[test]
fn validate_fails_where_run_would_refuse_the_file_unless_syntax_only() {
    let (_dir, file) = good_file();
    let f = file.display();
    let check = |flags: &[&str]| {
        let out = bin()
            .args(["validate", "--config"])
            .arg(&file)
            .args(flags)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let note = "--syntax-only: the content alone was checked, not the ownership and modes";

    chmod(&file, 0o666);
    let (code, out, err) = check(&[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{f}: error: {f} is writable by its group and others: refusing it (chmod go-w {f})"
        )),
        "{err}"
    );
    assert!(!out.contains("OK"), "{out}");

    let (code, out, err) = check(&["--syntax-only"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("OK, 1 group(s)"), "{out}");
    assert!(err.contains(note), "{err}");

    // Fixed as the message says, the file passes without the flag.
    chmod(&file, 0o644);
    let (code, out, err) = check(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("OK, 1 group(s)"), "{out}");
    assert!(!err.contains("--syntax-only"), "{err}");

    // --syntax-only still fails on the content.
    std::fs::write(&file, "[groups.web]\nmin = 3\nmax = 2\nimage = \"b\"\n").unwrap();
    chmod(&file, 0o666);
    let (code, _, err) = check(&["--syntax-only"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("min (3) is greater than max (2)"), "{err}");
    assert!(err.contains(note), "{err}");
}

#[test]
fn run_refuses_a_file_others_can_write() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.toml");
    std::fs::write(&file, "").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = bin()
        .args(["run", "--incus-socket", "/nonexistent.socket", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "EX_CONFIG");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{} is writable by its group and others: refusing it",
            file.display()
        )),
        "{err}"
    );
}

// Incus unreachable: one actionable line, without the HTTP client's noise.

/// A valid desired-state file in its own temp dir (kept while the guard lives).
fn good_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("desired-state.toml");
    std::fs::write(
        &file,
        "[groups.web]\nmax = 2\nmemory_threshold = 50\nimage = \"busybox\"\n",
    )
    .unwrap();
    (dir, file)
}

/// `cmd` with a short request timeout and plain stderr logging, whatever the environment.
fn quiet(mut cmd: Command) -> Command {
    cmd.env("INCUS_HPA_REQUEST_TIMEOUT", "5s")
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .env_remove("INCUS_SOCKET");
    cmd
}

/// Runs `cmd` to its end, killing it (and failing) after 30 s: a regression must not hang the
/// suite. Returns the exit code and stderr.
fn finish(mut cmd: Command) -> (Option<i32>, String, String) {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} still runs after 30 s; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn plan(socket: &Path, file: &Path) -> Command {
    let mut cmd = quiet(bin());
    cmd.arg("--incus-socket")
        .arg(socket)
        .args(["plan", "--config"])
        .arg(file);
    cmd
}

/// No noise from the HTTP client: no URL, no "error sending request".
fn assert_no_http_noise(err: &str) {
    assert!(!err.contains("http://"), "{err}");
    assert!(!err.contains("error sending request"), "{err}");
}

#[test]
fn plan_without_a_socket_says_to_check_incusd() {
    let (_dir, file) = good_file();
    let (code, _, err) = finish(plan(Path::new("/nonexistent/incus.socket"), &file));
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}: {err}");
    assert_eq!(
        err.matches("/nonexistent/incus.socket").count(),
        1,
        "the socket once: {err}"
    );
    assert!(err.contains("Is incusd running?"), "{err}");
    assert_no_http_noise(&err);
}

#[test]
fn plan_on_a_socket_nobody_listens_on_says_connection_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("incus.socket");
    // Bound then closed: the socket file stays, connecting gives ECONNREFUSED.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let (_cfg, file) = good_file();
    let (code, _, err) = finish(plan(&socket, &file));
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}: {err}");
    assert!(err.contains("connection refused"), "{err}");
    assert!(err.contains("Is incusd running?"), "{err}");
    assert_eq!(
        err.matches(&*socket.to_string_lossy()).count(),
        1,
        "the socket once: {err}"
    );
    assert_no_http_noise(&err);
}

/// Panics unless this process runs as root: the test cannot set itself up otherwise.
fn assert_root(test: &str) {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").unwrap().uid();
    if uid != 0 {
        panic!(
            "{test} needs root (this is uid {uid}): run it as root with \
             `cargo test --test integration -- --include-ignored`, as CI does"
        );
    }
}

/// The name of `id` in a passwd- or group-style file.
fn name_in(file: &str, id: u32) -> Option<String> {
    std::fs::read_to_string(file).ok()?.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 2 && f[2].parse() == Ok(id)).then(|| f[0].to_owned())
    })
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
#[ignore = "needs root (CI runs it with --include-ignored)"]
fn plan_denied_the_socket_names_its_group_and_the_usermod_fix() {
    assert_root("plan_denied_the_socket_names_its_group_and_the_usermod_fix");
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv", "/usr/sbin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("setpriv (util-linux) is needed to run incus-hpa as uid 65534");
    const NOBODY: u32 = 65534;

    // A listening socket only root may use, in a directory anyone may enter.
    let sockets = tempfile::tempdir().unwrap();
    chmod(sockets.path(), 0o755);
    let socket = sockets.path().join("incus.socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::os::unix::fs::chown(&socket, Some(0), Some(0)).unwrap();
    chmod(&socket, 0o600);
    // A desired-state file uid 65534 can read.
    let (cfg, file) = good_file();
    chmod(cfg.path(), 0o755);
    chmod(&file, 0o644);

    let mut cmd = quiet(Command::new(setpriv));
    cmd.arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .arg(env!("CARGO_BIN_EXE_incus-hpa"))
        .arg("--incus-socket")
        .arg(&socket)
        .args(["plan", "--config"])
        .arg(&file);
    let (code, _, err) = finish(cmd);
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}: {err}");
    let group = name_in("/etc/group", 0).unwrap_or_else(|| "0".into());
    let user = name_in("/etc/passwd", NOBODY).unwrap_or_else(|| format!("uid {NOBODY}"));
    assert!(
        err.contains(&format!("permission denied on {}", socket.display())),
        "{err}"
    );
    assert!(err.contains(&format!("belongs to group {group}")), "{err}");
    assert!(
        err.contains(&format!("usermod -aG {group} {user}")),
        "{err}"
    );
    assert_no_http_noise(&err);
}

#[test]
#[ignore = "needs root (CI runs it with --include-ignored)"]
fn run_refuses_a_symlink_another_user_owns_in_a_sticky_directory() {
    use std::os::unix::fs::{lchown, symlink};
    assert_root("run_refuses_a_symlink_another_user_owns_in_a_sticky_directory");
    const OTHER: u32 = 12345;

    // A good file, root's, 0644; a world-writable sticky directory (like /tmp) holding a
    // symlink to it that uid 12345 owns, and so could repoint at any time.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("desired-state.toml");
    std::fs::write(
        &target,
        "[groups.web]\nmax = 2\nmemory_threshold = 50\nimage = \"busybox\"\n",
    )
    .unwrap();
    chmod(&target, 0o644);
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let link = shared.join("desired-state.toml");
    symlink(&target, &link).unwrap();
    lchown(&link, Some(OTHER), Some(OTHER)).unwrap();

    let mut run = quiet(bin());
    run.args(["run", "--incus-socket", "/nonexistent", "--config"])
        .arg(&link);
    let (code, _, err) = finish(run);
    assert_eq!(code, Some(78), "EX_CONFIG: {err}");
    assert!(
        err.contains(&format!(
            "{} is a symlink owned by uid {OTHER}",
            link.display()
        )),
        "{err}"
    );

    // `validate` refuses it as `run` does; `--syntax-only` checks the contents (fine).
    let mut validate = quiet(bin());
    validate.args(["validate", "--config"]).arg(&link);
    let (code, _, err) = finish(validate);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{}: error: {} is a symlink owned by uid {OTHER}",
            link.display(),
            link.display()
        )),
        "{err}"
    );
    let mut validate = quiet(bin());
    validate
        .args(["validate", "--syntax-only", "--config"])
        .arg(&link);
    let (code, out, err) = finish(validate);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("OK, 1 group(s)"), "{out}");
}

/// What `incus-hpa plan` shows for `toml` against `fake` (its instances and memory).
async fn dry_run(toml: &str, fake: &crate::fake::FakeIncus) -> String {
    let state = incus_hpa::config::parse(Path::new("plan.toml"), toml)
        .unwrap_or_else(|e| panic!("{:#?}", e.diagnostics))
        .state;
    let store = incus_hpa::informer::Store::default();
    let programs = incus_hpa::dry_run::Programs::Run;
    incus_hpa::dry_run::plan(fake, fake, &store, &state, programs)
        .await
        .unwrap()
}

#[tokio::test]
async fn plan_runs_the_external_programs_and_decides_with_their_values() {
    let fake = crate::fake::FakeIncus::default();
    for name in ["jobs-aaaaaa", "jobs-bbbbbb", "batch-aaaaaa"] {
        fake.add_owned(&name[..name.find('-').unwrap()], name, "Running");
    }
    // A queue of 50 at 10 per instance wants 5 of jobs; batch's program fails.
    let toml = r#"
[groups.jobs]
max = 10
image = "busybox"

[[groups.jobs.external]]
command = ["/bin/echo", "50"]
target = 10

[groups.batch]
max = 10
image = "busybox"

[[groups.batch.external]]
command = ["/bin/sh", "-c", "echo no queue here >&2; exit 3"]
target = 10
"#;
    let shown = dry_run(toml, &fake).await;
    assert!(
        shown.contains(
            "jobs: 2 instance(s), external 1 50.0 (target 10) wants 5; recommends 5 \
             (external-above-target)"
        ),
        "{shown}"
    );
    // As the journal says it; the count is held.
    assert!(
        shown.contains(
            "external signal 1 of batch (/bin/sh) has no reading: exited with code 3: no \
             queue here; it holds the count (never lowers it) until the program answers"
        ),
        "{shown}"
    );
    assert!(
        shown
            .contains("batch: 1 instance(s), external 1 unknown (target 10) wants -; recommends 1"),
        "{shown}"
    );
}

#[tokio::test]
async fn plan_applies_the_schedule_windows_open_now() {
    let fake = crate::fake::FakeIncus::default();
    fake.add_owned("shop", "shop-aaaaaa", "Running");
    // A window that opens every minute for two: always open.
    let toml = r#"
[groups.shop]
max = 10
image = "busybox"

[[groups.shop.external]]
command = ["/bin/echo", "1"]
target = 10

[[groups.shop.schedule]]
cron = "* * * * *"
duration = "2m"
min = 4
"#;
    let shown = dry_run(toml, &fake).await;
    assert!(
        shown.contains(
            "shop: 1 instance(s), external 1 1.0 (target 10) wants 1; recommends 4 (schedule-min)"
        ),
        "{shown}"
    );
}
