//! What a run leaves behind: nothing. A program whose children leave its session (`setsid`)
//! and keep its stdout open is run a few times; afterwards none of them runs, found through
//! /proc by a marker argument no other process has. And the end of one run leaves alone what
//! another run, still going, started. Whatever happens, the processes with the marker are
//! killed when a test ends.

use std::time::Duration;

use super::*;

/// A `sleep` for 1000 s and a few random digits: no other process has this argument.
fn marker() -> String {
    format!("1000.{:09}", fastrand::u32(..1_000_000_000))
}

/// The pids of the processes (not zombies) that have `marker` among their arguments.
fn running(marker: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let args = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            args.split(|&b| b == 0).any(|a| a == marker.as_bytes())
        })
        .collect()
}

/// Kills what is left with the marker, however the test ends.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for pid in running(&self.0) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

#[tokio::test]
async fn nothing_a_program_started_outlives_its_run() {
    let marker = marker();
    let _cleanup = Cleanup(marker.clone());
    // Children in sessions of their own, holding stdout: one alone, one with a child of its own.
    let script = format!(
        "setsid sleep {marker} & setsid sh -c 'sleep {marker} & sleep {marker}; : {marker}' & \
         echo 5"
    );
    let spec = ExternalSpec {
        command: vec!["/bin/sh".into(), "-c".into(), script],
        target: 1.0,
        timeout: Duration::from_secs(3),
    };
    let mut values = Vec::new();
    for _ in 0..3 {
        values.push(read(&spec).await.map_err(|e| e.to_string()));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = running(&marker);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running after {} runs: {left:?}",
            values.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // And its answer was read at once, not after its timeout.
    assert_eq!(values, vec![Ok(5.0); 3]);
}

#[tokio::test]
async fn the_end_of_a_run_leaves_another_runs_processes_alone() {
    let marker = marker();
    let _cleanup = Cleanup(marker.clone());
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let (pid, done) = (dir.path().join("pid"), dir.path().join("done"));
    let (pid, done) = (pid.display(), done.display());
    // A run whose child leaves its session and whose parent ends at once (a daemon's double
    // fork); it answers 1 if that process is still there once the other runs ended.
    let long = format!(
        "(setsid sleep {marker} & echo $! > {pid}.new && mv {pid}.new {pid}); \
         while [ ! -e {done} ]; do sleep 0.01; done; kill -0 \"$(cat {pid})\" && echo 1 || echo 0"
    );
    let spec = |script: String| ExternalSpec {
        command: vec!["/bin/sh".into(), "-c".into(), script],
        target: 1.0,
        timeout: Duration::from_secs(30),
    };
    let (long, short) = (spec(long), spec("echo 2".into()));
    let others = async {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !dir.path().join("pid").exists() {
            assert!(std::time::Instant::now() < deadline, "never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for _ in 0..3 {
            assert_eq!(read(&short).await.unwrap(), 2.0);
        }
        std::fs::write(dir.path().join("done"), "").unwrap();
    };
    let (answer, ()) = tokio::join!(read(&long), others);
    assert_eq!(answer.unwrap(), 1.0, "another run's end killed it");
    // Once its own run ended, it is gone too.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !running(&marker).is_empty() {
        assert!(std::time::Instant::now() < deadline, "still running");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
