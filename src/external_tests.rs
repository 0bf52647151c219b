//! The runner on real programs (`/bin/sh -c`, and one script file run directly), the parse of
//! what they print, and the two memories. The program rule and its checks at each run are in
//! `external/program_tests.rs`, what a run leaves behind in `external/reap_tests.rs`.
//!
//! Processes really run, on tokio's real clock; timeouts are short and no duration is
//! asserted.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use rustix::process::{test_kill_process, Pid};
use tokio::time::Instant;

use super::*;

/// A program run through `/bin/sh -c script sh args...` (`$1`... are `args`).
fn sh(script: &str, args: &[&Path], timeout: Duration) -> ExternalSpec {
    let mut command = vec!["/bin/sh".into(), "-c".into(), script.into(), "sh".into()];
    command.extend(args.iter().map(|a| a.display().to_string()));
    ExternalSpec {
        command,
        target: 1.0,
        timeout,
    }
}

/// Time enough for any of these scripts to finish (they are never meant to reach it).
const AMPLE: Duration = Duration::from_secs(30);

async fn run_sh(script: &str) -> Result<f64, ExternalError> {
    read(&sh(script, &[], AMPLE)).await
}

#[tokio::test]
async fn reads_a_number() {
    assert_eq!(run_sh("echo 42").await.unwrap(), 42.0);
    assert_eq!(run_sh("echo 3.5").await.unwrap(), 3.5);
    assert_eq!(run_sh("echo 0").await.unwrap(), 0.0);
}

#[tokio::test]
async fn trims_whitespace() {
    assert_eq!(run_sh(r"printf ' \t 7 \n\n'").await.unwrap(), 7.0);
}

#[tokio::test]
async fn runs_a_script_file_directly() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let script = dir.path().join("queue-depth");
    fs::write(&script, "#!/bin/sh\necho \"$1\"\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let spec = ExternalSpec {
        command: vec![script.display().to_string(), "12.5".into()],
        target: 1.0,
        timeout: AMPLE,
    };
    // Another test's fork may hold the file open for writing for a moment (ETXTBSY).
    let mut tries = 0;
    let value = loop {
        match read(&spec).await {
            Err(ExternalError::Spawn { source, .. })
                if source.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error())
                    && tries < 100 =>
            {
                tries += 1;
                tokio::task::yield_now().await;
            }
            other => break other,
        }
    };
    assert_eq!(value.unwrap(), 12.5);
}

#[tokio::test]
async fn a_failure_says_how_it_ended_and_what_it_said() {
    let e = run_sh("echo 5; echo 'no queue\there' >&2; echo second >&2; exit 3")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ExternalError::Exit { ended: Ended::Code(3), stderr } if stderr == "no queue here / second"),
        "{e:?}"
    );
    assert_eq!(e.to_string(), "exited with code 3: no queue here / second");

    let e = run_sh("kill -9 $$").await.unwrap_err();
    assert!(
        matches!(
            e,
            ExternalError::Exit {
                ended: Ended::Signal(9),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.to_string(), "was killed by signal 9 (nothing on stderr)");
}

#[tokio::test]
async fn a_missing_program_cannot_be_run() {
    let spec = ExternalSpec {
        command: vec!["/nonexistent/queue-depth".into()],
        target: 1.0,
        timeout: AMPLE,
    };
    let e = read(&spec).await.unwrap_err();
    assert!(matches!(e, ExternalError::Unusable { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "cannot run /nonexistent/queue-depth: /nonexistent: no such file or directory"
    );
    let empty = ExternalSpec {
        command: vec![],
        ..spec
    };
    assert!(matches!(
        read(&empty).await,
        Err(ExternalError::Spawn { .. })
    ));
}

#[tokio::test]
async fn anything_but_one_number_is_refused() {
    for (script, shown) in [
        ("echo hello", "\"hello\""),
        ("true", "nothing"),
        ("echo 1 2", "\"1 2\""),
        ("printf '1\\n2\\n'", "\"1 2\""),
        ("echo 42ms", "\"42ms\""),
        ("echo inf", "\"inf\""),
        ("echo nan", "\"nan\""),
    ] {
        let e = run_sh(script).await.unwrap_err();
        assert!(
            matches!(e, ExternalError::NotANumber { .. }),
            "{script}: {e:?}"
        );
        assert_eq!(e.to_string(), format!("printed {shown}, not one number"));
    }
    let e = run_sh("echo -2.5").await.unwrap_err();
    assert!(matches!(e, ExternalError::Negative { value } if value == -2.5));
    assert_eq!(
        e.to_string(),
        "printed -2.5, a negative number (a load is 0 or more)"
    );
}

fn captured(text: &str) -> Captured {
    Captured {
        kept: text.as_bytes().to_vec(),
        more: false,
    }
}

#[test]
fn parse_reads_what_rust_reads_finite_and_not_negative() {
    for (text, value) in [
        ("42", 42.0),
        (" 3.5\n", 3.5),
        (".5", 0.5),
        ("+7", 7.0),
        ("1e3", 1000.0),
        ("2.5E-1", 0.25),
        ("-0", 0.0),
    ] {
        let parsed = parse(&captured(text)).unwrap();
        assert_eq!(parsed, value, "{text:?}");
        assert!(parsed.is_sign_positive(), "{text:?}");
    }
    for text in ["", "0x10", "1_000", "1,5", "Infinity", "1e999", "٣"] {
        assert!(
            matches!(
                parse(&captured(text)),
                Err(ExternalError::NotANumber { .. })
            ),
            "{text:?}"
        );
    }
    // A number followed by more than KEPT bytes is not one number either.
    let long = Captured {
        kept: b"7".to_vec(),
        more: true,
    };
    assert!(matches!(parse(&long), Err(ExternalError::NotANumber { stdout }) if stdout == "7…"));
    // The excerpt is printable and short.
    let Err(ExternalError::NotANumber { stdout }) =
        parse(&captured(&format!("\u{1b}[31m{}", "x".repeat(1000))))
    else {
        panic!("not a number")
    };
    assert!(stdout.starts_with(" [31mxxx"), "{stdout}");
    assert_eq!(stdout.chars().count(), STDOUT_EXCERPT + 1);
}

#[tokio::test]
async fn huge_output_is_bounded_and_drained() {
    // 10 MB on each pipe at once: neither may block the program.
    let e = run_sh("yes | head -c 10000000 >&2 & yes | head -c 10000000; wait")
        .await
        .unwrap_err();
    let ExternalError::NotANumber { stdout } = &e else {
        panic!("{e:?}")
    };
    assert!(stdout.starts_with("y y y"), "{stdout}");
    assert!(stdout.chars().count() <= STDOUT_EXCERPT + 1, "{stdout}");

    let e = run_sh("yes | head -c 10000000 >&2; exit 1")
        .await
        .unwrap_err();
    let ExternalError::Exit { stderr, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(stderr, "y / y / y");
    let e = run_sh("head -c 10000000 /dev/zero | tr '\\0' x >&2; exit 1")
        .await
        .unwrap_err();
    let ExternalError::Exit { stderr, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(stderr.chars().count(), STDERR_EXCERPT + 1);
}

#[tokio::test]
async fn the_environment_is_clean() {
    // PATH and LANG, and what sh sets itself (PWD, and SHLVL for some shells).
    let lines = run_sh("env | wc -l").await.unwrap();
    assert!(lines <= 4.0, "{lines} variables");
    assert_eq!(
        run_sh(
            "[ \"$PATH\" = /usr/sbin:/usr/bin:/sbin:/bin ] && [ \"$LANG\" = C.UTF-8 ] && \
                [ -z \"$HOME\" ] && [ \"$(pwd)\" = / ] && echo 1"
        )
        .await
        .unwrap(),
        1.0
    );
    // stdin is /dev/null: reading it ends at once.
    assert_eq!(run_sh("wc -c").await.unwrap(), 0.0);
}

/// Whether `pid` has ended (a zombie has: it only waits for its parent to reap it).
fn gone(pid: i32) -> bool {
    let Some(p) = Pid::from_raw(pid) else {
        return true;
    };
    if test_kill_process(p).is_err() {
        return true;
    }
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
        })
        .unwrap_or(true)
}

/// Starts `sleep 1000` in the background, writes its own pid and the sleep's to `$1` (whole,
/// through `mv`), then waits for ever.
const PARENT: &str = "sleep 1000 & echo $$ $! > \"$1.new\" && mv \"$1.new\" \"$1\"; wait";

/// How long the kernel may take to end processes sent SIGKILL (or a script to start).
const PATIENCE: Duration = Duration::from_secs(10);

/// Polls until every pid written by [`PARENT`] in `file` has ended.
async fn all_gone(file: &Path) {
    let pids: Vec<i32> = fs::read_to_string(file)
        .expect("the script wrote its pids")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    let deadline = std::time::Instant::now() + PATIENCE;
    while !pids.iter().all(|&p| gone(p)) {
        assert!(
            std::time::Instant::now() < deadline,
            "still running: {pids:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_timeout_kills_the_program_and_its_children() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let pids = dir.path().join("pids");
    let e = read(&sh(PARENT, &[&pids], Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert!(matches!(e, ExternalError::Timeout { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "no answer within 500ms: killed it and every process it started"
    );
    all_gone(&pids).await;
}

#[tokio::test]
async fn dropping_the_read_kills_the_group_too() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let pids = dir.path().join("pids");
    let spec = sh(PARENT, &[&pids], AMPLE);
    // Boxed, so that `drop` really drops it (a `pin!`ned future lives to the end of scope).
    let mut reading = Box::pin(read(&spec));
    // Drive it until the script has started its child, then drop it.
    let deadline = std::time::Instant::now() + PATIENCE;
    while !pids.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the script never started"
        );
        tokio::select! {
            r = &mut reading => panic!("it ended: {r:?}"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
    drop(reading);
    all_gone(&pids).await;
}

// ---- Said and Cache ------------------------------------------------------------------------

fn key(group: &str, index: usize) -> Key {
    (GroupName::parse(group).unwrap(), index)
}

#[test]
fn each_error_is_said_once_until_it_changes_or_recovers() {
    let mut said = Said::default();
    let (a, b) = (key("web", 0), key("web", 1));
    assert!(!said.succeeded(&a), "no recovery without a failure");
    assert!(said.failed(&a, "timeout"));
    assert!(!said.failed(&a, "timeout"));
    assert!(said.failed(&b, "timeout"), "per signal");
    assert!(said.failed(&a, "exited with code 1"));
    assert!(!said.failed(&a, "exited with code 1"));
    assert!(said.succeeded(&a));
    assert!(!said.succeeded(&a));
    assert!(
        said.failed(&a, "exited with code 1"),
        "again after a recovery"
    );
    said.retain(|k| k.0.as_str() != "web");
    assert!(said.failed(&b, "timeout"), "forgotten");
}

#[test]
fn the_cache_runs_a_signal_at_most_once_per_interval() {
    let mut cache = Cache::default();
    let interval = Duration::from_secs(15);
    let t0 = Instant::now();
    let (a, b) = (key("web", 0), key("web", 1));
    assert_eq!(cache.fresh(&a, t0, interval), None, "never run: due");
    cache.put(a.clone(), t0, Some(3.0));
    assert_eq!(cache.fresh(&a, t0, interval), Some(Some(3.0)));
    assert_eq!(
        cache.fresh(&a, t0 + Duration::from_secs(14), interval),
        Some(Some(3.0))
    );
    assert_eq!(cache.fresh(&a, t0 + interval, interval), None, "due again");
    assert_eq!(cache.fresh(&b, t0, interval), None, "per signal");
    // A failure counts as a run.
    cache.put(b.clone(), t0, None);
    assert_eq!(
        cache.fresh(&b, t0 + Duration::from_secs(1), interval),
        Some(None)
    );
    cache.retain(|k| k.1 == 0);
    assert_eq!(cache.fresh(&b, t0, interval), None, "forgotten");
    assert_eq!(cache.fresh(&a, t0, interval), Some(Some(3.0)));
}
