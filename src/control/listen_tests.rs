//! How long a connection to a listener lives, on tokio's paused clock (real sockets on
//! 127.0.0.1, no real waiting): a keep-alive connection idle after an answer is closed after
//! the header timeout, and a busy one after its lifetime. The connection limit is tested from
//! outside, in tests/integration/listeners.rs.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::{serve_metrics, Telemetry, CONNECTION_LIFETIME, HEADER_READ_TIMEOUT};

/// A metrics listener on 127.0.0.1, serving in the background; its address.
async fn listener() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_metrics(listener, Arc::new(Telemetry::default())));
    addr
}

/// Sends `GET /metrics` on `stream` (keep-alive) and reads the answer: its status line, or
/// `None` when the server closed the connection instead of answering.
async fn ask(stream: &mut TcpStream) -> Option<String> {
    // The server may have closed already: the write can fail, the read then says so.
    let _ = stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let (head, body_len) = loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .expect("a content-length");
            got.drain(..end + 4);
            break (head, len);
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => {
                assert!(got.is_empty(), "closed in the middle of an answer");
                return None;
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    };
    while got.len() < body_len {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed in the middle of a body");
        got.extend_from_slice(&buf[..n]);
    }
    Some(head.lines().next().unwrap_or_default().to_owned())
}

/// Whether the server closes `stream` without a byte (reads to the end).
async fn closed_unanswered(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest).await {
        Ok(_) => rest.is_empty(),
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[tokio::test(start_paused = true)]
async fn a_keep_alive_connection_idle_after_an_answer_is_closed_after_the_header_timeout() {
    let addr = listener().await;
    let mut conn = TcpStream::connect(addr).await.unwrap();
    // A head that comes just in time is answered, and the connection is kept.
    tokio::time::sleep(HEADER_READ_TIMEOUT - Duration::from_secs(1)).await;
    assert_eq!(ask(&mut conn).await.as_deref(), Some("HTTP/1.1 200 OK"));
    tokio::time::sleep(HEADER_READ_TIMEOUT - Duration::from_secs(1)).await;
    assert_eq!(ask(&mut conn).await.as_deref(), Some("HTTP/1.1 200 OK"));
    // Then nothing: closed a header timeout after the last answer, not before.
    let answered = Instant::now();
    let closed = tokio::time::timeout(HEADER_READ_TIMEOUT * 3, closed_unanswered(&mut conn));
    assert!(closed.await.expect("still open"), "closed with bytes");
    assert!(answered.elapsed() >= HEADER_READ_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn a_busy_keep_alive_connection_is_closed_after_its_lifetime() {
    let addr = listener().await;
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let opened = Instant::now();
    // A request every 7 s: never idle for a header timeout, and not in step with the lifetime.
    let gap = Duration::from_secs(7);
    assert!(gap < HEADER_READ_TIMEOUT);
    let mut answered = 0u32;
    loop {
        let asked = opened.elapsed();
        match ask(&mut conn).await {
            Some(status) => {
                assert_eq!(status, "HTTP/1.1 200 OK");
                assert!(asked < CONNECTION_LIFETIME, "answered at {asked:?}");
                answered += 1;
            }
            None => {
                assert!(asked >= CONNECTION_LIFETIME, "closed at {asked:?}");
                break;
            }
        }
        tokio::time::sleep(gap).await;
    }
    // Every request asked within the lifetime was answered on the one connection.
    assert_eq!(
        answered,
        CONNECTION_LIFETIME.as_secs().div_ceil(gap.as_secs()) as u32
    );
}
