//! HTTPS access to the local incusd for real-Incus tests: `core.https_address` on 127.0.0.1
//! (set only if it was not, and unset again), a client certificate made here (rcgen) and
//! trusted under a name of its own, restricted to the project `default` as the README advises,
//! and removed from the trust store at the end.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use rcgen::{date_time_ymd, CertificateParams, KeyPair};

use crate::lab::{incus, incus_ok};

/// A client certificate and what the daemon needs to reach Incus over HTTPS with it.
pub struct HttpsAccess {
    _dir: tempfile::TempDir,
    pub url: String,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub server: PathBuf,
    fingerprint: String,
    set_address: bool,
}

impl HttpsAccess {
    /// A certificate valid until `not_after_year`, trusted when `trusted`.
    pub fn new(trusted: bool, not_after_year: i32) -> Self {
        let current = incus_ok(&["config", "get", "core.https_address"]);
        let current = current.trim();
        let set_address = current.is_empty();
        let port = if set_address {
            incus_ok(&["config", "set", "core.https_address", "127.0.0.1:8443"]);
            "8443".to_owned()
        } else {
            current.rsplit(':').next().unwrap_or("8443").to_owned()
        };
        let dir = tempfile::tempdir().unwrap();
        let mut params = CertificateParams::new(vec!["incus-hpa-test".into()]).unwrap();
        params.not_before = date_time_ymd(2000, 1, 1);
        params.not_after = date_time_ymd(not_after_year, 1, 1);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (cert_path, key_path) = (dir.path().join("client.crt"), dir.path().join("client.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let server = dir.path().join("server.crt");
        std::fs::copy("/var/lib/incus/server.crt", &server).unwrap();
        let fingerprint = incus_hpa::incus::tls::fingerprint(cert.der());
        let access = Self {
            url: format!("https://127.0.0.1:{port}"),
            cert: cert_path,
            key: key_path,
            server,
            fingerprint,
            set_address,
            _dir: dir,
        };
        if trusted {
            incus_ok(&[
                "config",
                "trust",
                "add-certificate",
                access.cert.to_str().unwrap(),
                "--name",
                "incus-hpa-test",
                "--restricted",
                "--projects",
                "default",
            ]);
        }
        access
    }

    /// The `[daemon]` keys that reach Incus this way.
    pub fn daemon_keys(&self) -> String {
        let path = |p: &PathBuf| p.display().to_string();
        daemon_keys(
            &self.url,
            &path(&self.cert),
            &path(&self.key),
            &path(&self.server),
        )
    }
}

/// The `[daemon]` keys that reach Incus at `url` with these files.
pub fn daemon_keys(url: &str, cert: &str, key: &str, server: &str) -> String {
    format!(
        "incus = \"{url}\"\ntls_client_cert = \"{cert}\"\ntls_client_key = \"{key}\"\n\
         tls_server_cert = \"{server}\"\n"
    )
}

impl Drop for HttpsAccess {
    fn drop(&mut self) {
        let _ = incus(&["config", "trust", "remove", &self.fingerprint]);
        if self.set_address {
            let _ = incus(&["config", "unset", "core.https_address"]);
        }
    }
}
