//! The listeners: the control socket (unix) and `[daemon] metrics_address` (TCP). This module
//! owns binding them, accepting, what each answers, and the bounds on connections, so that a
//! peer that opens connections and sends nothing cannot take the daemon's file descriptors
//! (and with them its connections to Incus and its file reads):
//!
//! - each listener serves at most [`MAX_CONNECTIONS`] at once; one more is accepted and closed
//!   at once, unanswered, and counted in `incus_hpa_listener_refused_connections_total`
//!   (`listener` = `control` or `metrics`);
//! - a request head must arrive within [`HEADER_READ_TIMEOUT`] of the connection's opening or
//!   of the previous answer;
//! - no connection lasts longer than [`CONNECTION_LIFETIME`] (plus the time to finish the
//!   answer in flight).
//!
//! A slot is given back when its connection closes: the listener answers again at once.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;

use super::Telemetry;

/// Connections each listener serves at once. `incus-hpa status` and a scrape hold one for
/// milliseconds, so 64 is room to spare; both listeners full hold 128 descriptors, well inside
/// the default soft limit of 1024 and far from what the daemon needs for Incus and its files.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send a request head, counted from its opening and again
/// from each answer (hyper restarts the timer when a keep-alive connection goes idle): a
/// connection that sends nothing, new or kept alive, is closed after it.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may last however busy it is. Keep-alive stays on: Prometheus and
/// HTTP clients reuse a connection, and [`HEADER_READ_TIMEOUT`] already closes one that goes
/// idle. This bounds what the header timeout does not see, such as a client that sends a head
/// and then never reads the answer or never finishes its body. Past it no new request is read,
/// and the answer in flight gets [`HEADER_READ_TIMEOUT`] more to be written.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// How long the accept loop pauses after a failed accept (out of descriptors, say), so that it
/// never spins and the connections in flight can end first.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// What a listener answers: the control socket everything, TCP only the metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scope {
    Control,
    MetricsOnly,
}

impl Scope {
    /// The `listener` label of its counter.
    fn name(self) -> &'static str {
        match self {
            Scope::Control => "control",
            Scope::MetricsOnly => "metrics",
        }
    }
}

fn respond(
    t: &Telemetry,
    req: &Request<hyper::body::Incoming>,
    scope: Scope,
) -> Response<Full<Bytes>> {
    let (status, kind, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/status") if scope == Scope::Control => (
            StatusCode::OK,
            "application/json",
            serde_json::to_string(&t.status()).unwrap_or_default(),
        ),
        (&Method::GET, "/metrics") => {
            let accept = req.headers().get(hyper::header::ACCEPT);
            let (body, kind) =
                crate::exposition::negotiate(t.metrics(), accept.and_then(|a| a.to_str().ok()));
            (StatusCode::OK, kind, body)
        }
        (&Method::GET, _) => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
        _ if scope == Scope::MetricsOnly => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "read-only: GET /metrics\n".into(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "read-only: GET /status, GET /metrics\n".into(),
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = kind.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// Binds `path`, mode 0660 from the moment anyone can reach it. A socket nobody listens on
/// (connecting is refused: its daemon is gone) is replaced; one that another daemon answers on
/// is not taken from it, nor one this user may not connect to (a daemon run by root or by
/// another user may be listening there), nor anything that is not a socket.
///
/// The socket is bound in a directory of its own beside `path` that only this user may enter,
/// given its mode there, and moved into place: whatever the umask of a daemon run by hand, the
/// socket is never at `path` with another mode, and the umask (the whole process's) is left
/// alone.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    vacant(path)?;
    let private = Private::create(dir)?;
    let inside = private.0.join("s");
    let listener = UnixListener::bind(&inside)?;
    std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o660))?;
    std::fs::rename(&inside, path)?;
    Ok(listener)
}

/// `Ok` when `path` may be taken: nothing is there, or a socket nobody listens on.
fn vacant(path: &Path) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => {
            return Err(Error::new(
                ErrorKind::AddrInUse,
                "another incus-hpa answers on it",
            ))
        }
        // Nobody listens (or it is not a socket, told below), or nothing is there.
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::NotFound) => {}
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                "this user may not connect to it, so it may be the socket of a daemon run by \
                 root or another user, listening: stop that daemon first, or remove the socket \
                 as its owner if none runs, or name another path with [daemon] control_socket",
            ))
        }
        Err(e) => {
            return Err(Error::new(
                e.kind(),
                format!("cannot tell whether another incus-hpa answers on it ({e})"),
            ))
        }
    }
    // Only a socket is replaced: a file by that name that is anything else is not ours.
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => Ok(()),
        Ok(_) => Err(Error::new(
            ErrorKind::AlreadyExists,
            "something that is not a socket is there",
        )),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A directory of this user's only (mode 0700), beside the socket's path, removed with what is
/// left in it when dropped. Its name is short: a socket's path is at most 107 bytes.
struct Private(PathBuf);

impl Private {
    fn create(dir: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        loop {
            let name: String = (0..6).map(|_| fastrand::alphanumeric()).collect();
            let path = dir.join(format!(".{name}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Self(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        // The socket is there only when something failed before it was moved into place.
        let _ = std::fs::remove_file(self.0.join("s"));
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Serves the control socket until the process ends.
pub async fn serve(listener: UnixListener, telemetry: Arc<Telemetry>) {
    let gate = Gate::new(telemetry, Scope::Control);
    loop {
        match listener.accept().await {
            Ok((stream, _)) => gate.admit(stream),
            Err(e) => gate.accept_failed(e).await,
        }
    }
}

/// Serves `GET /metrics` on TCP until the process ends.
pub async fn serve_metrics(listener: TcpListener, telemetry: Arc<Telemetry>) {
    let gate = Gate::new(telemetry, Scope::MetricsOnly);
    loop {
        match listener.accept().await {
            Ok((stream, _)) => gate.admit(stream),
            Err(e) => gate.accept_failed(e).await,
        }
    }
}

/// One listener's connections: what they are answered, the slots they hold, and the counter
/// of those turned away.
struct Gate {
    telemetry: Arc<Telemetry>,
    scope: Scope,
    slots: Arc<Semaphore>,
    refused: Counter,
}

impl Gate {
    fn new(telemetry: Arc<Telemetry>, scope: Scope) -> Self {
        let refused = telemetry.refused(scope.name());
        Self {
            telemetry,
            scope,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            refused,
        }
    }

    /// Answers `stream` in a task of its own, which holds a slot until it ends; when every
    /// slot is taken, closes it at once (dropped: no answer) and counts it.
    fn admit<S>(&self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            self.refused.inc();
            tracing::debug!(
                listener = self.scope.name(),
                "{MAX_CONNECTIONS} connections open: one more closed unanswered"
            );
            drop(stream);
            return;
        };
        let (t, scope) = (self.telemetry.clone(), self.scope);
        tokio::spawn(async move {
            connection(stream, t, scope).await;
            drop(slot);
        });
    }

    /// Out of descriptors, say: lets the connections in flight end first.
    async fn accept_failed(&self, e: std::io::Error) {
        tracing::debug!(listener = self.scope.name(), error = %e, "accept failed");
        tokio::time::sleep(ACCEPT_PAUSE).await;
    }
}

/// Answers one connection within [`HEADER_READ_TIMEOUT`] and [`CONNECTION_LIFETIME`].
async fn connection<S>(stream: S, t: Arc<Telemetry>, scope: Scope)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let r = respond(&t, &req, scope);
        async move { Ok::<_, Infallible>(r) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    if tokio::time::timeout(CONNECTION_LIFETIME, conn.as_mut())
        .await
        .is_err()
    {
        // No new request from here on; an idle connection closes now.
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(HEADER_READ_TIMEOUT, conn).await;
    }
}

/// Binds and serves `path` in the background; logs (and carries on) when it cannot.
pub fn start(path: PathBuf, telemetry: Arc<Telemetry>) {
    match bind(&path) {
        Ok(listener) => {
            tracing::debug!(socket = %path.display(), "control socket ready");
            tokio::spawn(serve(listener, telemetry));
        }
        Err(e) => tracing::warn!(socket = %path.display(), error = %e,
            "no control socket at {} ({e}): `incus-hpa status` and /metrics are unavailable",
            path.display()),
    }
}

/// Binds `addr` and serves `/metrics` on it in the background; logs (and carries on) when it
/// cannot. The packaged unit allows no network: the hint names the drop-in that does.
pub async fn start_metrics(addr: SocketAddr, telemetry: Arc<Telemetry>) {
    match TcpListener::bind(addr).await {
        Ok(listener) => {
            // The address bound: port 0 in the file asks for any free port.
            let addr = listener.local_addr().unwrap_or(addr);
            tracing::info!(address = %addr, "serving /metrics on http://{addr}/metrics");
            tokio::spawn(serve_metrics(listener, telemetry));
        }
        Err(e) => tracing::warn!(address = %addr, error = %e,
            "cannot serve /metrics on {addr} ({e}); under systemd the unit allows no network \
             unless a drop-in does (see /usr/share/doc/incus-hpa/examples/metrics-tcp.conf)"),
    }
}
