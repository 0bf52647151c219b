//! Why Incus cannot be reached, in words a person can act on: what is wrong with the socket (or
//! the HTTPS address, its TLS, its trust in our certificate) and what to do about it, once,
//! without the HTTP client's URL noise.

use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

/// What went wrong with the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Nothing at that path.
    NoSocket,
    /// The socket is there, but this user may not connect to it.
    PermissionDenied {
        /// The group that owns the socket, when it can be told.
        group: Option<String>,
        /// This process's user name (or uid).
        user: String,
    },
    /// Nothing listens on it: incusd is stopped.
    Refused,
    /// Incus did not answer in time.
    TimedOut(Duration),
    /// TLS failed (a wrong pin, an unverifiable or expired server certificate): says what to
    /// do.
    Tls(String),
    /// Incus answered over HTTPS but does not trust our client certificate: says how to trust
    /// it.
    Untrusted(String),
    /// No IP socket may be opened (the systemd unit's sandbox), in the system's words.
    NoNetwork(String),
    /// Anything else, in the system's words.
    Other(String),
}

/// Incus could not be reached at `socket` (a socket path or an HTTPS address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable {
    pub socket: String,
    pub problem: Problem,
}

impl Unreachable {
    /// From the error of a connection to `socket`.
    pub fn from_io(socket: &str, e: &io::Error) -> Self {
        // EAFNOSUPPORT (RestrictAddressFamilies=), EPERM and EACCES (IPAddressDeny=).
        let sandboxed = matches!(e.raw_os_error(), Some(97 | 1 | 13));
        let problem = match e.kind() {
            _ if socket.starts_with("https://") && sandboxed => Problem::NoNetwork(e.to_string()),
            io::ErrorKind::NotFound => Problem::NoSocket,
            io::ErrorKind::PermissionDenied => Problem::PermissionDenied {
                group: socket_group(Path::new(socket)),
                user: user_name(),
            },
            io::ErrorKind::ConnectionRefused => Problem::Refused,
            io::ErrorKind::TimedOut => Problem::TimedOut(Duration::ZERO),
            _ => Problem::Other(e.to_string()),
        };
        Self {
            socket: socket.to_owned(),
            problem,
        }
    }

    /// From an error of the HTTP client, which had `timeout` to answer: a TLS error, or else
    /// the innermost `io::Error`, says what happened.
    pub fn from_error(
        socket: &str,
        e: &(dyn std::error::Error + 'static),
        timeout: Duration,
    ) -> Self {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
        let mut innermost = e.to_string();
        if let Some(tls) = find_tls(e) {
            return Self::tls(socket, tls);
        }
        while let Some(c) = cause {
            if let Some(io) = c.downcast_ref::<io::Error>() {
                return Self::from_io(socket, io);
            }
            innermost = c.to_string();
            cause = c.source();
        }
        let is_timeout = e
            .downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_timeout);
        Self {
            socket: socket.to_owned(),
            problem: if is_timeout {
                Problem::TimedOut(timeout)
            } else {
                Problem::Other(innermost)
            },
        }
    }
}

impl Unreachable {
    fn tls(socket: &str, message: String) -> Self {
        Self {
            socket: socket.to_owned(),
            problem: Problem::Tls(message),
        }
    }
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let socket = &self.socket;
        let https = socket.starts_with("https://");
        match &self.problem {
            Problem::Refused if https => write!(
                f,
                "cannot reach Incus: nothing listens at {socket} (connection refused). Is incusd \
                 running there, with core.https_address set?"
            ),
            Problem::Tls(m) => write!(f, "cannot reach Incus at {socket}: {m}"),
            Problem::Untrusted(m) => f.write_str(m),
            Problem::NoNetwork(m) => write!(
                f,
                "cannot reach Incus at {socket}: {m}. The systemd unit allows no network: \
                 install /usr/share/doc/incus-hpa/examples/incus-https.conf as a drop-in \
                 (/usr/share/doc/incus-hpa/docs/clusters.md)"
            ),
            Problem::NoSocket => write!(
                f,
                "cannot reach Incus: no socket at {socket}. Is incusd running? \
                 (systemctl status incus; another socket: --incus-socket PATH or INCUS_SOCKET)"
            ),
            Problem::PermissionDenied {
                group: Some(group),
                user,
            } => write!(
                f,
                "cannot reach Incus: permission denied on {socket}, which belongs to group \
                 {group}. Add {user} to it: usermod -aG {group} {user} (then log in again, or \
                 restart the service)"
            ),
            Problem::PermissionDenied { group: None, user } => write!(
                f,
                "cannot reach Incus: permission denied on {socket} for {user}. Run as root or \
                 as a member of the socket's group"
            ),
            Problem::Refused => write!(
                f,
                "cannot reach Incus: nothing listens on {socket} (connection refused). Is \
                 incusd running? (systemctl status incus)"
            ),
            Problem::TimedOut(d) if d.is_zero() => write!(
                f,
                "cannot reach Incus: {socket} did not answer in time. Is incusd overloaded?"
            ),
            Problem::TimedOut(d) => write!(
                f,
                "cannot reach Incus: {socket} did not answer within {}. Is incusd overloaded?",
                humantime::format_duration(*d)
            ),
            Problem::Other(m) => write!(f, "cannot reach Incus at {socket}: {m}"),
        }
    }
}

/// A TLS failure anywhere in `e`'s chain, described. An `io::Error`'s `source()` skips the
/// error it wraps, so wrapped errors are looked into too.
fn find_tls(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    if let Some(tls) = super::tls::describe(e) {
        return Some(tls);
    }
    if let Some(inner) = e.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
        if let Some(tls) = find_tls(inner) {
            return Some(tls);
        }
    }
    e.source().and_then(find_tls)
}

/// The name of the group owning `path` (its gid when `/etc/group` does not name it).
fn socket_group(path: &Path) -> Option<String> {
    let gid = std::fs::metadata(path).ok()?.gid();
    Some(group_name(gid).unwrap_or_else(|| gid.to_string()))
}

/// The name of group `gid` in `/etc/group`, when it has one.
pub(crate) fn group_name(gid: u32) -> Option<String> {
    name_of("/etc/group", gid)
}

/// This process's user name (its uid when `/etc/passwd` does not name it).
fn user_name() -> String {
    let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    name_of("/etc/passwd", uid).unwrap_or_else(|| format!("uid {uid}"))
}

/// The name with id `id` in a passwd- or group-style file.
fn name_of(file: &str, id: u32) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let _password = f.next()?;
        (f.next()?.parse::<u32>().ok()? == id).then(|| name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_socket_says_so_once_and_what_to_do() {
        let e = io::Error::from(io::ErrorKind::NotFound);
        let msg = Unreachable::from_io("/nonexistent.socket", &e).to_string();
        assert_eq!(msg.matches("/nonexistent.socket").count(), 1, "{msg}");
        assert!(msg.contains("Is incusd running?"), "{msg}");
        assert!(!msg.contains("http://"), "{msg}");
    }

    #[test]
    fn permission_denied_names_the_group_and_the_command() {
        let u = Unreachable {
            socket: "/var/lib/incus/unix.socket".into(),
            problem: Problem::PermissionDenied {
                group: Some("incus-admin".into()),
                user: "incus-hpa".into(),
            },
        };
        assert!(u.to_string().contains("usermod -aG incus-admin incus-hpa"));
    }

    #[test]
    fn the_innermost_io_error_is_found() {
        #[derive(Debug)]
        struct Outer(io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("error sending request for url (http://incus/1.0)")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(io::Error::from(io::ErrorKind::ConnectionRefused));
        let u = Unreachable::from_error("/s", &e, Duration::from_secs(30));
        assert_eq!(u.problem, Problem::Refused);
    }

    #[test]
    fn a_sandbox_without_network_names_the_drop_in() {
        let e = io::Error::from_raw_os_error(97);
        let msg = Unreachable::from_io("https://10.0.0.1:8443", &e).to_string();
        assert!(msg.contains("examples/incus-https.conf"), "{msg}");
        let e = io::Error::from_raw_os_error(1);
        let msg = Unreachable::from_io("https://10.0.0.1:8443", &e).to_string();
        assert!(msg.contains("examples/incus-https.conf"), "{msg}");
        // The socket's permission problem stays what it is.
        let e = io::Error::from(io::ErrorKind::PermissionDenied);
        let u = Unreachable::from_io("/var/lib/incus/unix.socket", &e);
        assert!(matches!(u.problem, Problem::PermissionDenied { .. }));
    }

    #[test]
    fn names_come_from_passwd_style_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("group");
        std::fs::write(&f, "root:x:0:\nincus-admin:x:993:alice\n").unwrap();
        assert_eq!(
            name_of(f.to_str().unwrap(), 993).as_deref(),
            Some("incus-admin")
        );
        assert_eq!(name_of(f.to_str().unwrap(), 5), None);
    }
}
