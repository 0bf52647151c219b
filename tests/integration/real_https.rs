//! The daemon and `plan` over HTTPS against the local incusd: clear errors for an untrusted
//! certificate (naming the command that trusts it), a wrong pin and an expired certificate;
//! and a daemon that scales a group and follows events through HTTPS alone.

use std::process::Command;
use std::time::Duration;

use crate::https::HttpsAccess;
use crate::lab::*;

fn toml(lab: &Lab, access: &HttpsAccess, min: u32, max: u32) -> String {
    config(&lab.group, min, max, "").replace(
        "[daemon]",
        &format!(
            "[daemon]\ncontrol_socket = \"{}\"\n{}",
            lab.dir.path().join("control.sock").display(),
            access.daemon_keys()
        ),
    )
}

/// `incus-hpa plan` on `toml`: (exit code, stderr).
fn plan(lab: &Lab, toml: &str) -> (i32, String) {
    std::fs::write(lab.config_path(), toml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .args(["plan", "--config"])
        .arg(lab.config_path())
        .env_remove("INCUS_SOCKET")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_https_failures_say_what_to_do() {
    let lab = Lab::new("tls");
    // Not trusted: names the certificate and the command that trusts it.
    let untrusted = HttpsAccess::new(false, 2100);
    let (code, err) = plan(&lab, &toml(&lab, &untrusted, 0, 1));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("does not trust the client certificate")
            && err.contains("incus config trust add-certificate"),
        "{err}"
    );
    // A wrong pin: both fingerprints.
    std::fs::copy(&untrusted.cert, &untrusted.server).unwrap();
    let (code, err) = plan(&lab, &toml(&lab, &untrusted, 0, 1));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is not the one pinned in"), "{err}");
    drop(untrusted);
    // Expired: refused before connecting, with its date; the daemon does not start (78).
    let expired = HttpsAccess::new(false, 2001);
    let (code, err) = plan(&lab, &toml(&lab, &expired, 0, 1));
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("expired on"), "{err}");
    let mut daemon = lab.beside();
    daemon.start(&toml(&daemon, &expired, 0, 1));
    let status = daemon.daemon.as_mut().unwrap().wait().unwrap();
    assert_eq!(status.code(), Some(78), "{}", daemon.log());
    assert!(daemon.log().contains("expired on"), "{}", daemon.log());
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_https_daemon_scales_and_follows_events() {
    let access = HttpsAccess::new(true, 2100);
    let mut lab = Lab::new("https");
    let g = lab.group.clone();
    lab.start(&toml(&lab, &access, 1, 2));
    let minute = Duration::from_secs(60);
    eventually(&lab, "1 running", minute, || running(&g) == 1);
    assert!(
        lab.log().contains(&format!("at {}", access.url)),
        "{}",
        lab.log()
    );
    // Events come over wss: a deleted instance is seen as deleted (not only listed again).
    let victim = managed(&g)[0].0.clone();
    incus_ok(&["delete", "--force", &victim]);
    eventually(&lab, "the event of the deletion", minute, || {
        lab.log_count(&["instance-deleted", &victim]) > 0
    });
    eventually(&lab, "1 running again", minute, || running(&g) == 1);
    let first = managed(&g)[0].0.clone();
    lab.exec(&first, FILL);
    eventually(&lab, "2 running", minute, || running(&g) == 2);
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}
