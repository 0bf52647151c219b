//! What a desired-state file may ask for and who may write it: the file is a root-equivalent
//! input (it decides what containers run), so it is held to sshd's StrictModes rules.
//!
//! [`open_checked`] reads the file through [`super::safe_open`], which resolves the path
//! itself and checks every directory, symlink and the file on the descriptors it opens (no
//! window between check and read); [`check_permissions`] runs the same walk without reading.

use std::io::Read;
use std::path::Path;

use super::safe_open;

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

/// Opens `path` the way [`open_checked`] does, without reading it: `Ok` when the daemon
/// would accept the file, else why not (naming the path component that is wrong).
pub fn check_permissions(path: &Path, allowed_uid: u32) -> Result<(), String> {
    safe_open::open(path, allowed_uid).map(drop)
}

/// The text of `path`, read from a descriptor opened without trusting the path: every
/// directory from `/` (or the current directory) down, every symlink followed and the file
/// itself must be owned by root or `allowed_uid` and writable by nobody else (sticky
/// directories excepted), checked on what was opened, not on a path that could change in
/// between. The error names the path component that is wrong and how to fix it.
pub fn open_checked(path: &Path, allowed_uid: u32) -> Result<String, String> {
    let mut opened = safe_open::open(path, allowed_uid)?;
    let mut text = String::new();
    opened
        .file
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", opened.shown.display()))?;
    Ok(text)
}

#[cfg(test)]
#[path = "security_tests.rs"]
mod tests;
