//! How long a connection to a listener lives, on tokio's paused clock (real sockets on
//! 127.0.0.1, no real waiting): a keep-alive connection idle after an answer is closed after
//! the header timeout, and a busy one after its lifetime. The connection limit is tested from
//! outside, in tests/integration/listeners.rs. Then the control socket's binding: its mode is
//! set before anyone can reach it, and only a socket nobody listens on is taken over (the
//! case of another user's socket drops root in one thread of its own, so it needs root, as CI
//! and this project's machines run the tests).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::{bind, serve_metrics, Telemetry, CONNECTION_LIFETIME, HEADER_READ_TIMEOUT};

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

// ---- the control socket's binding ----------------------------------------------------------

fn mode(path: &std::path::Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions())
        & 0o7777
}

#[tokio::test]
async fn the_socket_appears_at_its_path_with_its_mode_already_set() {
    use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.sock");
    // Whatever happens to names in its directory, in order.
    let watch = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).unwrap();
    let changes = WatchFlags::CREATE | WatchFlags::ATTRIB | WatchFlags::MOVED_TO;
    inotify::add_watch(&watch, dir.path(), changes).unwrap();
    let _listener = bind(&path).unwrap();
    assert_eq!(mode(&path), 0o660);
    let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
    let mut events = inotify::Reader::new(&watch, &mut buf);
    let mut seen = Vec::new();
    loop {
        match events.next() {
            Ok(e) if e.file_name() == Some(c"control.sock") => seen.push(e.events()),
            Ok(_) => {}
            Err(rustix::io::Errno::AGAIN) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // Moved in whole: never created there first (with the umask's mode) and changed after.
    assert_eq!(seen, [ReadFlags::MOVED_TO]);
    // Nothing else is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["control.sock"]);
}

#[tokio::test]
async fn a_socket_nobody_listens_on_is_replaced_and_anything_else_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.sock");
    // Left by a daemon that is gone: connecting is refused.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let _listener = bind(&path).unwrap();
    assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    let e = bind(&path).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    let file = dir.path().join("file");
    std::fs::write(&file, "keep").unwrap();
    assert!(bind(&file).is_err());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}

#[test]
fn a_socket_it_may_not_connect_to_is_left_to_its_owner() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root (it plays another user in a thread of its own)"
    );
    // A directory anyone may write in, and root's live socket there that only root may use.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let path = dir.path().join("control.sock");
    let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // A daemon run by another user (uid 65534) starts on the same path.
    let theirs = path.clone();
    let result = std::thread::spawn(move || {
        // Credentials are a thread's own on Linux: this thread only is no longer root.
        let nobody = rustix::process::Gid::from_raw(65534);
        rustix::thread::set_thread_res_gid(nobody, nobody, nobody).unwrap();
        let nobody = rustix::process::Uid::from_raw(65534);
        rustix::thread::set_thread_res_uid(nobody, nobody, nobody).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { bind(&theirs).map(drop) })
    })
    .join()
    .unwrap();
    let e = result.expect_err("took root's socket");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    let said = e.to_string();
    assert!(said.contains("may not connect to it"), "{said}");
    assert!(said.contains("run by root or another user"), "{said}");
    // Still root's, and still answered.
    assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    assert!(live.accept().is_ok());
}
