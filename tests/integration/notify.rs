//! What `incus-hpa run` tells systemd on `NOTIFY_SOCKET`, read as systemd reads it: one
//! datagram of `KEY=VALUE` lines. A newline in what the status repeats (here the Incus socket's
//! own path, named by the "waiting for Incus" status) must not start another assignment.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn a_newline_in_the_status_does_not_reach_systemd() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.socket");
    let systemd = UnixDatagram::bind(&notify).unwrap();
    // Only a guard against a hang: the first status comes at once.
    systemd
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let file = dir.path().join("desired-state.toml");
    std::fs::write(
        &file,
        format!(
            "[daemon]\ncontrol_socket = \"{}\"\n",
            dir.path().join("control.sock").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let incus = dir.path().join("no-incus\nREADY=1\nMAINPID=1");

    let mut child = Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .arg("--incus-socket")
        .arg(&incus)
        .args(["run", "--config"])
        .arg(&file)
        .env("NOTIFY_SOCKET", &notify)
        .env_remove("WATCHDOG_USEC")
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = vec![0u8; 8192];
    let status = loop {
        let received = systemd.recv(&mut buf);
        let Ok(n) = received else {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("no status from the daemon: {received:?}");
        };
        let datagram = String::from_utf8_lossy(&buf[..n]).into_owned();
        if datagram.starts_with("STATUS=waiting for Incus") {
            break datagram;
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        status.matches('\n').count(),
        1,
        "one assignment: {status:?}"
    );
    assert!(status.ends_with('\n'), "{status:?}");
    assert!(
        status.contains("no-incus READY=1 MAINPID=1"),
        "the path is still named: {status:?}"
    );
}
