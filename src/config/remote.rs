//! `[daemon] incus` and its TLS files: where Incus is, and (over HTTPS) the client certificate
//! and key, and the server certificate to pin. The text alone is checked by [`parse`](super::parse);
//! the files themselves (there, readable, a private key nobody else can read) only when the
//! file is loaded for use, so that tests of the text never touch files.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::diag::Collector;
use super::fields::Fields;
use crate::incus::group_name;
use crate::model::{DaemonSpec, Endpoint, TlsFiles};

/// The TLS keys of `[daemon]`.
pub const TLS_KEYS: [&str; 3] = ["tls_client_cert", "tls_client_key", "tls_server_cert"];

/// Reads `incus` and the TLS keys into `d`.
pub fn read(c: &mut Collector, t: &mut Fields, d: &mut DaemonSpec, check_files: bool) {
    let incus = t.string(c, "incus");
    let [cert, key, server] = TLS_KEYS.map(|key| {
        t.string(c, key).and_then(|(p, span)| {
            if p.starts_with('/') {
                Some((PathBuf::from(p), span))
            } else {
                c.error(
                    Some(span),
                    &t.key(key),
                    format!("{p:?} is not an absolute path"),
                );
                None
            }
        })
    });
    let Some((text, span)) = incus else {
        warn_unused(c, t, [&cert, &key, &server]);
        return;
    };
    let endpoint = match Endpoint::parse(&text) {
        Ok(e) => e,
        Err(e) => {
            c.error(Some(span), &t.key("incus"), e);
            return;
        }
    };
    if !endpoint.is_https() {
        warn_unused(c, t, [&cert, &key, &server]);
        d.incus = Some(endpoint);
        return;
    }
    let (Some((cert, cert_span)), Some((key, key_span))) = (cert, key) else {
        c.error(
            Some(span),
            &t.key("incus"),
            "HTTPS needs a client certificate Incus trusts: set tls_client_cert and \
             tls_client_key (make a pair with `incus remote generate-certificate` or openssl, \
             then `incus config trust add-certificate CERT` on the server)",
        );
        return;
    };
    if check_files {
        if let Err(e) = readable(&cert) {
            c.error(Some(cert_span), &t.key("tls_client_cert"), e);
        }
        if let Err(e) = private_key(&key) {
            c.error(Some(key_span), &t.key("tls_client_key"), e);
        }
        if let Some((p, s)) = &server {
            if let Err(e) = readable(p) {
                c.error(Some(s.clone()), &t.key("tls_server_cert"), e);
            }
        }
    }
    d.incus = Some(endpoint);
    d.tls = Some(TlsFiles {
        client_cert: cert,
        client_key: key,
        server_cert: server.map(|(p, _)| p),
    });
}

fn warn_unused(
    c: &mut Collector,
    t: &Fields,
    set: [&Option<(PathBuf, std::ops::Range<usize>)>; 3],
) {
    for (key, v) in TLS_KEYS.iter().zip(set) {
        if let Some((_, span)) = v {
            c.warning(
                Some(span.clone()),
                &t.key(key),
                "ignored: only used when [daemon] incus is an https:// address",
            );
        }
    }
}

fn readable(path: &Path) -> Result<(), String> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// A private key must be readable by its owner only (0600), or also by the `incus-hpa` group
/// when root owns it (0640 root:incus-hpa, as the package sets it up).
pub fn private_key(path: &Path) -> Result<(), String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    key_mode_ok(meta.mode(), meta.uid(), group_name(meta.gid()).as_deref())
        .map_err(|why| format!("{}: {why}", path.display()))?;
    readable(path)
}

/// The rule of [`private_key`] on a file's mode, owner and group name.
pub fn key_mode_ok(mode: u32, uid: u32, group: Option<&str>) -> Result<(), String> {
    let perms = mode & 0o777;
    if perms & 0o077 == 0 {
        return Ok(());
    }
    if perms & 0o037 == 0 && uid == 0 && group == Some("incus-hpa") {
        return Ok(());
    }
    Err(format!(
        "a private key readable by others (mode {perms:04o}) is refused: chmod 600 it, or \
         chown root:incus-hpa and chmod 640"
    ))
}

#[cfg(test)]
mod tests {
    use super::key_mode_ok;

    #[test]
    fn a_private_key_is_0600_or_0640_root_incus_hpa() {
        assert!(key_mode_ok(0o100600, 1000, Some("users")).is_ok());
        assert!(key_mode_ok(0o100400, 0, None).is_ok());
        assert!(key_mode_ok(0o100640, 0, Some("incus-hpa")).is_ok());
        let e = key_mode_ok(0o100640, 0, Some("adm")).unwrap_err();
        assert!(e.contains("0640") && e.contains("chmod 600"), "{e}");
        assert!(key_mode_ok(0o100640, 1000, Some("incus-hpa")).is_err());
        assert!(key_mode_ok(0o100644, 0, Some("incus-hpa")).is_err());
        assert!(key_mode_ok(0o100660, 0, Some("incus-hpa")).is_err());
    }
}
