//! The limits of the two listeners (the control socket and `metrics_address`), on 127.0.0.1
//! and a socket in a temp directory: past [`MAX_CONNECTIONS`] held open, one more connection is
//! closed unanswered and counted, and the listener answers again once they close; a connection
//! that sends nothing is closed after the header timeout.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use incus_hpa::control::{self, Telemetry, HEADER_READ_TIMEOUT, MAX_CONNECTIONS};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::time::Instant;

use crate::util::within;

/// Asks for the metrics (one request, then the connection is to close) and reads to the end:
/// true when the server closed the connection without a byte of answer.
async fn closed_unanswered<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) -> bool {
    // Closed already, the write may fail; the read says what happened.
    let _ = stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer).await {
        Ok(_) => answer.is_empty(),
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// The refused-connections sample of `listener` in the classic exposition.
fn refused(t: &Telemetry, listener: &str) -> Option<String> {
    let text = incus_hpa::exposition::classic(&t.metrics());
    let prefix =
        format!("incus_hpa_listener_refused_connections_total{{listener=\"{listener}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(String::from))
}

/// Asks `get` until it answers 200: the server notices the closed connections on its own
/// time, a few milliseconds at most (polled with a deadline; the bound is no measure).
async fn answers_again<F, Fut>(mut get: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = reqwest::Result<reqwest::Response>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = get().await {
            assert_eq!(r.status(), 200);
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no answer once the connections closed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn client(socket: Option<&Path>) -> reqwest::Client {
    incus_hpa::incus::tls::provider();
    let b = reqwest::Client::builder();
    match socket {
        Some(path) => b.unix_socket(path),
        None => b,
    }
    .build()
    .unwrap()
}

#[tokio::test]
async fn past_the_limit_a_metrics_connection_is_closed_unanswered_and_counted() {
    let t = Arc::new(Telemetry::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(control::serve_metrics(listener, t.clone()));
    // Held open, sending nothing. The listener takes connections in order: these first.
    let mut idle = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let extra = TcpStream::connect(addr).await.unwrap();
    assert!(within(HEADER_READ_TIMEOUT, closed_unanswered(extra)).await);
    // Counted before it was closed; the control socket's counter is not this listener's.
    assert_eq!(refused(&t, "metrics").as_deref(), Some("1"));
    assert_eq!(refused(&t, "control"), None);
    drop(idle);
    let client = client(None);
    answers_again(|| client.get(format!("http://{addr}/metrics")).send()).await;
}

#[tokio::test]
async fn past_the_limit_a_control_socket_connection_is_closed_unanswered_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.sock");
    let t = Arc::new(Telemetry::default());
    tokio::spawn(control::serve(control::bind(&path).unwrap(), t.clone()));
    let mut idle = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        idle.push(UnixStream::connect(&path).await.unwrap());
    }
    let extra = UnixStream::connect(&path).await.unwrap();
    assert!(within(HEADER_READ_TIMEOUT, closed_unanswered(extra)).await);
    assert_eq!(refused(&t, "control").as_deref(), Some("1"));
    drop(idle);
    let client = client(Some(&path));
    answers_again(|| client.get("http://x/status").send()).await;
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_timeout() {
    let t = Arc::new(Telemetry::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(control::serve_metrics(listener, t.clone()));
    let opened = Instant::now();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let mut answer = Vec::new();
    within(HEADER_READ_TIMEOUT * 3, idle.read_to_end(&mut answer))
        .await
        .unwrap();
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    assert!(opened.elapsed() >= HEADER_READ_TIMEOUT);
    // Only a slot was held: nothing was refused.
    assert_eq!(refused(&t, "metrics").as_deref(), Some("0"));
}
