//! TLS to Incus over HTTPS (rustls with ring, no OpenSSL): the client certificate Incus trusts,
//! and the server's certificate either pinned, like the incus client's `servercerts/` (the
//! certificate presented must be exactly that one, whatever its issuer and name), or verified
//! against the system's certificate authorities. Every failure names the file and what to do.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, SignatureScheme};

pub use crate::model::TlsFiles;

/// Why the TLS set-up cannot be built from the files.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {what}", .path.display())]
    Invalid { path: PathBuf, what: String },
    #[error(
        "the client certificate {} expired on {when}: make a new one (incus remote \
         generate-certificate, or openssl req -x509) and trust it on Incus (incus config trust \
         add-certificate FILE)", .path.display()
    )]
    Expired { path: PathBuf, when: String },
    #[error("the client certificate {} is not valid before {when}: is this host's clock right?", .path.display())]
    NotYetValid { path: PathBuf, when: String },
}

/// What a certificate says of itself, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// SHA-256 of the DER, in lower-case hex, as `incus config trust list` shows it.
    pub fingerprint: String,
    pub not_before: i64,
    pub not_after: i64,
    /// `not_after` for people.
    pub expires: String,
}

impl CertInfo {
    /// Reads a DER certificate.
    pub fn of(der: &[u8]) -> Result<Self, String> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
        let validity = cert.validity();
        Ok(Self {
            fingerprint: fingerprint(der),
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
            expires: validity.not_after.to_string(),
        })
    }

    /// True when `now` (Unix seconds) is past the end of its validity.
    pub fn expired_at(&self, now: i64) -> bool {
        now > self.not_after
    }
}

/// SHA-256 of `der`, in lower-case hex.
pub fn fingerprint(der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The client side of TLS, ready for reqwest and the event websocket.
#[derive(Clone)]
pub struct Tls {
    pub config: Arc<ClientConfig>,
    /// The client certificate, for messages (path and what it says of itself).
    pub client_cert: PathBuf,
    pub client: CertInfo,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("client_cert", &self.client_cert)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Invalid {
            path: path.to_owned(),
            what: format!("not a PEM certificate ({e})"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Invalid {
            path: path.to_owned(),
            what: "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
        });
    }
    Ok(certs)
}

/// The crypto the daemon uses: ring's, installed once as the process default too (reqwest
/// asks for one even for the unix socket).
pub fn provider() -> Arc<CryptoProvider> {
    let p = Arc::new(rustls::crypto::ring::default_provider());
    let _ = CryptoProvider::install_default((*p).clone());
    p
}

/// The TLS set-up of an HTTP client that never uses TLS (the unix sockets): no roots, no
/// certificate. Given to reqwest so that it does not build its own, which reads the system's
/// certificate authorities and fails where there are none (a minimal container).
pub fn unused() -> ClientConfig {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

impl Tls {
    /// Builds the TLS set-up from the files; checks the client certificate's dates now.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let provider = provider();
        let chain = certificates(&files.client_cert)?;
        let client = CertInfo::of(&chain[0]).map_err(|what| TlsError::Invalid {
            path: files.client_cert.clone(),
            what: format!("not a readable X.509 certificate ({what})"),
        })?;
        let now = now_unix();
        if client.expired_at(now) {
            return Err(TlsError::Expired {
                path: files.client_cert.clone(),
                when: client.expires.clone(),
            });
        }
        if now < client.not_before {
            return Err(TlsError::NotYetValid {
                path: files.client_cert.clone(),
                when: x509_parser::time::ASN1Time::from_timestamp(client.not_before)
                    .map_or_else(|_| client.not_before.to_string(), |t| t.to_string()),
            });
        }
        let key_pem = read(&files.client_key)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Invalid {
            path: files.client_key.clone(),
            what: format!("no PEM private key in it ({e})"),
        })?;
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Invalid {
                path: files.client_cert.clone(),
                what: e.to_string(),
            })?;
        let builder = match &files.server_cert {
            Some(pin) => {
                let pinned = certificates(pin)?.swap_remove(0);
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(Pinned {
                        fingerprint: fingerprint(&pinned),
                        cert: pinned,
                        path: pin.clone(),
                        provider: provider.clone(),
                    }))
            }
            None => {
                let mut roots = rustls::RootCertStore::empty();
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                builder.with_root_certificates(roots)
            }
        };
        let config = builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| TlsError::Invalid {
                path: files.client_key.clone(),
                what: format!(
                    "does not go with the certificate {} ({e})",
                    files.client_cert.display()
                ),
            })?;
        Ok(Self {
            config: Arc::new(config),
            client_cert: files.client_cert.clone(),
            client,
        })
    }

    /// Why Incus answers "untrusted": the sentence that says what to do.
    pub fn untrusted(&self, url: &str) -> String {
        let cert = self.client_cert.display();
        let expired = if self.client.expired_at(now_unix()) {
            format!(
                " It expired on {}: make a new one first.",
                self.client.expires
            )
        } else {
            String::new()
        };
        format!(
            "Incus at {url} does not trust the client certificate {cert} (fingerprint {}).{expired} \
             Trust it on the server (or any member of its cluster), after copying the file there: \
             incus config trust add-certificate {cert} (add --restricted --projects PROJECT to \
             limit it to the groups' project)",
            &self.client.fingerprint
        )
    }
}

/// The server presented a certificate other than the pinned one.
#[derive(Debug)]
pub struct PinMismatch {
    pub path: PathBuf,
    pub pinned: String,
    pub presented: String,
}

impl fmt::Display for PinMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the server's certificate (fingerprint {}) is not the one pinned in {} ({}). If \
             the server's certificate was replaced on purpose, copy the new one there (the \
             server's /var/lib/incus/server.crt, or cluster.crt for a cluster); otherwise \
             something else answers at that address",
            self.presented,
            self.path.display(),
            self.pinned
        )
    }
}

impl std::error::Error for PinMismatch {}

/// Accepts exactly the pinned certificate, and checks the handshake's signatures with it.
#[derive(Debug)]
struct Pinned {
    cert: CertificateDer<'static>,
    fingerprint: String,
    path: PathBuf,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() {
            return Ok(ServerCertVerified::assertion());
        }
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            rustls::OtherError(Arc::new(PinMismatch {
                path: self.path.clone(),
                pinned: self.fingerprint.clone(),
                presented: fingerprint(end_entity),
            })),
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS failure in words a person can act on, `None` when `e` is not one.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let e = e.downcast_ref::<rustls::Error>()?;
    Some(match e {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
            match other.0.downcast_ref::<PinMismatch>() {
                Some(pin) => pin.to_string(),
                None => format!("the server's certificate is not valid: {other}"),
            }
        }
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => "the server's certificate is not signed by an authority this host trusts (Incus \
              makes its own): pin it with [daemon] tls_server_cert = \"/etc/incus-hpa/server.crt\", \
              a copy of the server's /var/lib/incus/server.crt (cluster.crt for a cluster)"
            .into(),
        rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "the server's certificate has expired".into(),
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => "the server's certificate does not name the host in [daemon] incus: use that name, or \
              pin the certificate with [daemon] tls_server_cert"
            .into(),
        rustls::Error::AlertReceived(alert) => {
            format!("the server ended the TLS handshake ({alert:?}): is the client certificate one it accepts?")
        }
        other => format!("TLS failed: {other}"),
    })
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
