//! What the tests of groups that serve share, on the real Incus: a bridge and a profile of
//! their own for busybox web servers (`scripts/build-web-image.sh`), and `status --json`.

use std::path::Path;
use std::process::Command;

use crate::lab::*;

/// The test's own bridge and the profile that puts an instance's eth0 on it.
const BRIDGE: &str = "hpa-rd-br";
pub(crate) const PROFILE: &str = "hpa-rd";
pub(crate) const SUBNET: &str = "10.251.7";

/// The bridge and the profile, made for the test and removed after it (after the lab's
/// instances: declare it first).
pub(crate) struct Net;

impl Net {
    pub(crate) fn up() -> Self {
        require_incus();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-web-image.sh");
        let built = Command::new("bash").arg(script).status().unwrap();
        assert!(built.success(), "scripts/build-web-image.sh failed");
        if !incus(&["network", "show", BRIDGE]).status.success() {
            incus_ok(&[
                "network",
                "create",
                BRIDGE,
                &format!("ipv4.address={SUBNET}.1/24"),
                "ipv4.nat=false",
                "ipv6.address=none",
            ]);
        }
        if !incus(&["profile", "show", PROFILE]).status.success() {
            incus_ok(&["profile", "create", PROFILE]);
            incus_ok(&[
                "profile",
                "device",
                "add",
                PROFILE,
                "eth0",
                "nic",
                "name=eth0",
                &format!("network={BRIDGE}"),
            ]);
        }
        Net
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = incus(&["profile", "delete", PROFILE]);
        let _ = incus(&["network", "delete", BRIDGE]);
    }
}

pub(crate) fn status_json(sock: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .args(["status", "--json", "--control-socket"])
        .arg(sock)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Makes instance `name`'s `/healthz` answer 200 (`true`) or 404 (`false`), by writing its
/// file where the host sees the instance's root file system (a `dir` pool), not through
/// `incus exec`: an exec once got no answer from Incus 6.0 for two minutes in the suite.
pub(crate) fn set_healthy(name: &str, healthy: bool) {
    let pool = incus_ok(&["query", "/1.0/storage-pools/default"]);
    let pool: serde_json::Value = serde_json::from_str(&pool).unwrap();
    let source = pool["config"]["source"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("/var/lib/incus/storage-pools/default")
        .to_owned();
    let file = Path::new(&source)
        .join("containers")
        .join(name)
        .join("rootfs/www/healthz");
    if healthy {
        std::fs::write(&file, "ok\n").unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    } else {
        std::fs::remove_file(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
}
