//! What a desired-state file may ask for and who may write it: the file is a root-equivalent
//! input (it decides what containers run), so it is held to sshd's StrictModes rules.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Why an instance config key would give the container root on the host, or `None`.
pub fn grants_host_root(key: &str, value: &str) -> Option<String> {
    let truthy = matches!(
        value.to_ascii_lowercase().as_str(),
        "true" | "1" | "yes" | "on"
    );
    match key {
        "security.privileged" if truthy => {
            Some("a privileged container is root on the host".into())
        }
        k if k.starts_with("raw.") => Some(format!("{k} bypasses Incus' safety checks")),
        "security.syscalls.intercept.mount.allowed"
        | "security.syscalls.intercept.mknod"
        | "security.syscalls.intercept.bpf.devices"
            if truthy =>
        {
            Some(format!("{key} lets the container act on host resources"))
        }
        "linux.kernel_modules" => Some("loading kernel modules acts on the host kernel".into()),
        _ => None,
    }
}

/// Refuses a file (and its directory, unless sticky) that is writable by group or others or
/// owned by someone other than root or `allowed_uid`.
pub fn check_permissions(file: &Path, allowed_uid: u32) -> Result<(), String> {
    let meta =
        std::fs::metadata(file).map_err(|e| format!("cannot stat {}: {e}", file.display()))?;
    check_one(file, &meta, allowed_uid, false)?;
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dmeta =
        std::fs::metadata(dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
    check_one(dir, &dmeta, allowed_uid, true)
}

fn check_one(
    path: &Path,
    meta: &std::fs::Metadata,
    allowed_uid: u32,
    is_dir: bool,
) -> Result<(), String> {
    let mode = meta.mode();
    let sticky = mode & 0o1000 != 0;
    if meta.uid() != 0 && meta.uid() != allowed_uid {
        return Err(format!(
            "{} is owned by uid {}, not by root or the daemon's user: refusing it (chown root {})",
            path.display(),
            meta.uid(),
            path.display()
        ));
    }
    if mode & 0o022 != 0 && !(is_dir && sticky) {
        return Err(format!(
            "{} is writable by {}: refusing it (chmod go-w {})",
            path.display(),
            if mode & 0o002 != 0 {
                "others"
            } else {
                "its group"
            },
            path.display()
        ));
    }
    Ok(())
}
