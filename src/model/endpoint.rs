//! Where Incus is: its unix socket (`unix:///var/lib/incus/unix.socket`, the default) or an
//! HTTPS address (`https://incus.example.net:8443`, port 8443 unless given), as `[daemon] incus`
//! writes it, and the TLS files that reach it over HTTPS.

use std::fmt;
use std::path::PathBuf;

/// Incus' unix socket or HTTPS address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Https {
        /// The host as written (a name, an IPv4 address, or an IPv6 address without brackets).
        host: String,
        port: u16,
    },
}

/// The port Incus listens on for HTTPS unless told otherwise.
pub const DEFAULT_HTTPS_PORT: u16 = 8443;

impl Endpoint {
    /// Reads `unix:///ABSOLUTE/PATH` or `https://HOST[:PORT][/]`.
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!(
                    "{s:?}: a unix socket needs an absolute path, as in \"unix:///var/lib/incus/unix.socket\""
                ));
            }
            return Ok(Self::Unix(path.into()));
        }
        if s.starts_with("http://") {
            return Err(format!(
                "{s:?}: Incus serves its API over HTTPS only (core.https_address): write https://"
            ));
        }
        if !s.starts_with("https://") {
            return Err(format!(
                "{s:?} is neither \"unix:///PATH\" nor \"https://HOST:PORT\""
            ));
        }
        let url = reqwest::Url::parse(s).map_err(|e| format!("{s:?} is not a URL: {e}"))?;
        if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "{s:?}: write only the scheme, host and port, as in \"https://incus.example.net:8443\""
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "{s:?}: no user in the address; the client certificate (tls_client_cert) is the identity"
            ));
        }
        let host = match url.host_str() {
            Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']'),
            _ => return Err(format!("{s:?} has no host")),
        }
        .to_owned();
        // The url crate drops a port equal to the scheme's default (443): keep it if written.
        let port = url.port().unwrap_or(if s.contains(":443") {
            443
        } else {
            DEFAULT_HTTPS_PORT
        });
        Ok(Self::Https { host, port })
    }

    /// True for HTTPS: Incus may be on another host.
    pub fn is_https(&self) -> bool {
        matches!(self, Self::Https { .. })
    }

    /// `HOST:PORT` for a TCP connection (IPv6 in brackets).
    pub fn authority(&self) -> Option<String> {
        match self {
            Self::Https { host, port } if host.contains(':') => Some(format!("[{host}]:{port}")),
            Self::Https { host, port } => Some(format!("{host}:{port}")),
            Self::Unix(_) => None,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(p) => write!(f, "{}", p.display()),
            Self::Https { .. } => write!(f, "https://{}", self.authority().unwrap_or_default()),
        }
    }
}

/// The files of `[daemon] tls_client_cert`, `tls_client_key` and `tls_server_cert`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// The server certificate to pin; `None` verifies it against the system's authorities.
    pub server_cert: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_and_https_addresses_are_read() {
        assert_eq!(
            Endpoint::parse("unix:///var/lib/incus/unix.socket").unwrap(),
            Endpoint::Unix("/var/lib/incus/unix.socket".into())
        );
        let e = Endpoint::parse("https://incus.example.net").unwrap();
        assert_eq!(e.to_string(), "https://incus.example.net:8443");
        let e = Endpoint::parse("https://10.0.0.1:9443/").unwrap();
        assert_eq!(e.authority().unwrap(), "10.0.0.1:9443");
        let e = Endpoint::parse("https://[::1]:8443").unwrap();
        assert_eq!(
            e,
            Endpoint::Https {
                host: "::1".into(),
                port: 8443
            }
        );
        assert_eq!(e.authority().unwrap(), "[::1]:8443");
        assert_eq!(
            Endpoint::parse("https://h:443")
                .unwrap()
                .authority()
                .unwrap(),
            "h:443"
        );
    }

    #[test]
    fn other_addresses_say_what_to_write() {
        for (bad, says) in [
            ("http://h:8443", "HTTPS only"),
            ("unix://relative", "absolute path"),
            ("tcp://h", "neither"),
            ("https://h:8443/1.0", "only the scheme"),
            ("https://u:p@h", "no user"),
            ("https://", "not a URL"),
        ] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
