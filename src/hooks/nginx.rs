//! `incus-hpa hook nginx`: writes the endpoint set as an nginx `upstream` block in a file of
//! its own, and reloads nginx when the file changed.
//!
//! nginx's configuration includes the file inside its `http` block and proxies to the
//! upstream by name:
//!
//! ```text
//! http {
//!     include /etc/nginx/incus-hpa/web.conf;
//!     server {
//!         listen 80;
//!         location / { proxy_pass http://web; }
//!     }
//! }
//! ```
//!
//! The file is replaced whole (written beside it, then renamed over it, so nginx never reads
//! half of one). An empty set is written as one server marked `down` (nginx refuses an
//! upstream without servers): nginx then answers 502 until an endpoint comes. nginx is
//! reloaded (a graceful reload: the old workers finish the requests they have) only when the
//! content changed, by the reload command (run without a shell, split at spaces: `nginx -s
//! reload` by default) or by SIGHUP to the process in a pid file (`--pid-file`). A reload
//! that fails puts the previous file back, so that the next run tries again.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::EndpointSet;

/// How nginx is told to read its configuration again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// A command line, split at whitespace, run without a shell.
    Command(String),
    /// SIGHUP to the process whose pid the file holds (nginx's master).
    Signal(PathBuf),
}

/// The upstream block for `set`.
pub fn render(upstream: &str, set: &EndpointSet) -> String {
    let mut out = format!(
        "# Written by incus-hpa hook nginx for the group {} (project {}): replaced at each \
         change, do not edit.\nupstream {upstream} {{\n",
        set.group, set.project
    );
    if set.endpoints.is_empty() {
        out.push_str("    # No endpoint in service: nginx needs a server, this one is down.\n");
        out.push_str("    server 127.0.0.1:1 down;\n");
    }
    for e in &set.endpoints {
        out.push_str(&format!(
            "    server {};  # {}\n",
            e.socket_text(),
            e.instance
        ));
    }
    out.push_str("}\n");
    out
}

/// Writes `content` to `path` through a temporary file in the same directory and a rename.
fn replace(path: &Path, content: &[u8]) -> Result<(), String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| format!("{} is not a file name", path.display()))?;
    let temp = dir.join(format!(
        ".{}.incus-hpa-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", temp.display());
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.write_all(content)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&temp);
        return Err(fail(e));
    }
    std::fs::rename(&temp, path).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        format!("cannot replace {}: {e}", path.display())
    })
}

/// Tells nginx to reload.
fn reload(how: &Reload) -> Result<(), String> {
    match how {
        Reload::Command(line) => {
            let mut words = line.split_whitespace();
            let program = words.next().ok_or("the reload command is empty")?;
            let out = Command::new(program)
                .args(words)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run the reload command {line:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "the reload command {line:?} failed ({}): {}",
                    out.status,
                    crate::text::printable(String::from_utf8_lossy(&out.stderr).trim())
                ))
            }
        }
        Reload::Signal(pid_file) => {
            let text = std::fs::read_to_string(pid_file)
                .map_err(|e| format!("cannot read nginx's pid file {}: {e}", pid_file.display()))?;
            let pid = text
                .trim()
                .parse::<i32>()
                .ok()
                .and_then(rustix::process::Pid::from_raw)
                .ok_or_else(|| format!("{} holds no pid: {text:?}", pid_file.display()))?;
            rustix::process::kill_process(pid, rustix::process::Signal::HUP)
                .map_err(|e| format!("cannot send SIGHUP to nginx (pid {pid:?}): {e}"))
        }
    }
}

/// The hook: writes the upstream file and reloads nginx when it changed. Returns whether it
/// changed.
pub fn apply(path: &Path, upstream: &str, how: &Reload, set: &EndpointSet) -> Result<bool, String> {
    let content = render(upstream, set);
    let old = match std::fs::read(path) {
        Ok(old) => Some(old),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if old.as_deref() == Some(content.as_bytes()) {
        return Ok(false);
    }
    replace(path, content.as_bytes())?;
    if let Err(why) = reload(how) {
        // Put the previous file back, so that the next run sees a change and reloads again.
        let restored = match &old {
            Some(old) => replace(path, old),
            None => std::fs::remove_file(path).map_err(|e| e.to_string()),
        };
        return Err(match restored {
            Ok(()) => why,
            Err(e) => format!("{why}; and the previous file could not be put back: {e}"),
        });
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::parse_set;

    fn set(json_endpoints: &str) -> EndpointSet {
        parse_set(&format!(
            r#"{{"group":"web","project":"default","endpoints":[{json_endpoints}]}}"#
        ))
        .unwrap()
    }

    #[test]
    fn the_upstream_lists_each_endpoint() {
        let text = render(
            "web",
            &set(
                r#"{"instance":"web-a","address":"10.0.0.1","port":80},{"instance":"web-b","address":"fd00::1","port":8080}"#,
            ),
        );
        assert!(text.contains("upstream web {\n"), "{text}");
        assert!(
            text.contains("    server 10.0.0.1:80;  # web-a\n"),
            "{text}"
        );
        assert!(
            text.contains("    server [fd00::1]:8080;  # web-b\n"),
            "{text}"
        );
        assert!(text.ends_with("}\n"));
    }

    #[test]
    fn an_empty_set_has_one_server_down() {
        let text = render("web", &set(""));
        assert!(text.contains("server 127.0.0.1:1 down;"), "{text}");
    }

    #[test]
    fn the_file_is_replaced_and_reloaded_only_on_a_change_and_put_back_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.conf");
        let one = set(r#"{"instance":"web-a","address":"10.0.0.1","port":80}"#);
        let ok = Reload::Command("/bin/true".into());
        assert!(apply(&path, "web", &ok, &one).unwrap());
        assert!(!apply(&path, "web", &ok, &one).unwrap());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        let before = std::fs::read_to_string(&path).unwrap();
        let fails = Reload::Command("/bin/false".into());
        let e = apply(&path, "web", &fails, &set("")).unwrap_err();
        assert!(e.contains("/bin/false"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
