//! TLS set-up and failures against a real rustls server on 127.0.0.1, with certificates made
//! here (rcgen): a pinned certificate is accepted, another one is refused naming both
//! fingerprints, an unpinned self-signed one names the key that pins it, and an expired or
//! mismatched client certificate is refused before any connection.

use super::*;
use rcgen::{date_time_ymd, CertificateParams, KeyPair};
use tokio::net::{TcpListener, TcpStream};

struct Made {
    cert_pem: String,
    key_pem: String,
}

fn make(not_after_year: i32) -> Made {
    let mut params = CertificateParams::new(vec!["localhost".into()]).unwrap();
    params.not_before = date_time_ymd(2000, 1, 1);
    params.not_after = date_time_ymd(not_after_year, 1, 1);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Made {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
    fn client(&self, client: &Made, pin: Option<&Made>) -> TlsFiles {
        TlsFiles {
            client_cert: self.write("client.crt", &client.cert_pem),
            client_key: self.write("client.key", &client.key_pem),
            server_cert: pin.map(|p| self.write("server.crt", &p.cert_pem)),
        }
    }
}

/// Runs one handshake of `tls` against a server presenting `server`; the error described.
async fn handshake(tls: &Tls, server: &Made) -> Result<(), String> {
    let certs = vec![CertificateDer::from_pem_slice(server.cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let _ = acceptor.accept(tcp).await;
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let result = tokio_rustls::TlsConnector::from(tls.config.clone())
        .connect(name, tcp)
        .await
        .map(drop)
        .map_err(|e| {
            e.get_ref()
                .and_then(|inner| describe(inner))
                .unwrap_or_else(|| e.to_string())
        });
    let _ = server.await;
    result
}

#[tokio::test]
async fn the_pinned_certificate_is_accepted_and_another_is_refused_by_fingerprint() {
    let (server, other, client) = (make(2100), make(2100), make(2100));
    let files = Files::new();
    let tls = Tls::load(&files.client(&client, Some(&server))).unwrap();
    handshake(&tls, &server).await.unwrap();

    let err = handshake(&tls, &other).await.unwrap_err();
    let presented = fingerprint(
        CertificateDer::from_pem_slice(other.cert_pem.as_bytes())
            .unwrap()
            .as_ref(),
    );
    assert!(err.contains("is not the one pinned in"), "{err}");
    assert!(err.contains(&presented), "{err}");
    assert!(err.contains("server.crt"), "{err}");
}

#[tokio::test]
async fn an_unpinned_self_signed_server_names_the_key_that_pins_it() {
    let (server, client) = (make(2100), make(2100));
    let files = Files::new();
    let tls = Tls::load(&files.client(&client, None)).unwrap();
    let err = handshake(&tls, &server).await.unwrap_err();
    assert!(err.contains("tls_server_cert"), "{err}");
}

#[test]
fn an_expired_client_certificate_is_refused_with_its_date_and_the_remedy() {
    let (server, client) = (make(2100), make(2001));
    let files = Files::new();
    let err = Tls::load(&files.client(&client, Some(&server))).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TlsError::Expired { .. }), "{msg}");
    assert!(msg.contains("expired on") && msg.contains("2001"), "{msg}");
    assert!(msg.contains("incus config trust add-certificate"), "{msg}");
}

#[test]
fn a_key_of_another_certificate_is_refused_naming_both_files() {
    let (server, client, other) = (make(2100), make(2100), make(2100));
    let files = Files::new();
    let mut tls_files = files.client(&client, Some(&server));
    tls_files.client_key = files.write("other.key", &other.key_pem);
    let msg = Tls::load(&tls_files).unwrap_err().to_string();
    assert!(
        msg.contains("other.key") && msg.contains("client.crt"),
        "{msg}"
    );
}

#[test]
fn missing_and_empty_files_are_named() {
    let (server, client) = (make(2100), make(2100));
    let files = Files::new();
    let mut tls_files = files.client(&client, Some(&server));
    tls_files.client_cert = files.write("empty.crt", "");
    let msg = Tls::load(&tls_files).unwrap_err().to_string();
    assert!(msg.contains("empty.crt") && msg.contains("no PEM"), "{msg}");
    tls_files.client_cert = files.dir.path().join("absent.crt");
    let msg = Tls::load(&tls_files).unwrap_err().to_string();
    assert!(
        msg.contains("cannot read") && msg.contains("absent.crt"),
        "{msg}"
    );
}

#[test]
fn an_untrusted_answer_names_the_certificate_fingerprint_and_command() {
    let (server, client) = (make(2100), make(2100));
    let files = Files::new();
    let tls = Tls::load(&files.client(&client, Some(&server))).unwrap();
    let msg = tls.untrusted("https://127.0.0.1:8443");
    assert!(msg.contains(&tls.client.fingerprint), "{msg}");
    assert!(
        msg.contains("incus config trust add-certificate") && msg.contains("client.crt"),
        "{msg}"
    );
}
