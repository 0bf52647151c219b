//! The client's paths and queries, and what it makes of Incus' own words: an error message or
//! an operation's `err` with control characters in it (a newline, an escape sequence) comes
//! out of the client without them, answered by a small HTTP server on a unix socket; and the
//! reading it takes from an instance's `/state`; and that every connection it opens to the
//! socket carries a request (incusd's socket accepts no one else while one says nothing).

use std::convert::Infallible;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use super::*;
use crate::incus::Incus;
use crate::model::Memory;

#[test]
fn the_wait_of_an_operation_keeps_its_query() {
    assert_eq!(
        wait_path("/1.0/operations/ab-12", 120),
        "/1.0/operations/ab-12/wait?timeout=120"
    );
    assert_eq!(
        wait_path("/1.0/operations/ab-12?project=web", 120),
        "/1.0/operations/ab-12/wait?timeout=120&project=web"
    );
}

#[test]
fn query_values_are_encoded() {
    assert_eq!(
        enc("config.user.incus-hpa.group eq web"),
        "config.user.incus-hpa.group%20eq%20web"
    );
}

#[test]
fn an_answer_s_metadata_is_read_from_its_text_where_it_lies() {
    let body = br#"{"type":"sync","metadata":[{"name":"a\"b","n":1}],"operation":""}"#;
    let env = Envelope::read(body.to_vec()).unwrap();
    assert_eq!(env.kind, "sync");
    let got: serde_json::Value = env.metadata().unwrap();
    assert_eq!(got, serde_json::json!([{"name": "a\"b", "n": 1}]));
    for none in [
        &br#"{"type":"sync","metadata":null}"#[..],
        br#"{"type":"error","error":"not found"}"#,
    ] {
        let env = Envelope::read(none.to_vec()).unwrap();
        assert_eq!(env.metadata, None);
        assert_eq!(env.metadata::<Option<u8>>().unwrap(), None);
    }
    assert!(Envelope::read(b"{\"type\":".to_vec()).is_err());
}

/// What the test server answers to a request: HTTP status and JSON body.
fn answer(req: &Request<hyper::body::Incoming>) -> (u16, serde_json::Value) {
    let path = req.uri().path();
    match (req.method().as_str(), path) {
        ("GET", "/1.0/instances") => (
            500,
            serde_json::json!({"type": "error", "error": "a\nb\u{1b}[31m", "error_code": 500}),
        ),
        ("DELETE", "/1.0/instances/web-1") => (
            202,
            serde_json::json!({"type": "async", "operation": "/1.0/operations/op-1", "metadata": {}}),
        ),
        ("GET", "/1.0/instances/web-1/state") => (
            200,
            serde_json::json!({"type": "sync", "status_code": 200, "metadata": running_state()}),
        ),
        ("GET", "/1.0/instances/web-2/state") => (
            200,
            serde_json::json!({"type": "sync", "status_code": 200, "metadata": networked_state()}),
        ),
        ("GET", "/1.0/operations/op-1/wait") => (
            200,
            serde_json::json!({"type": "sync", "metadata": {
                "status": "Failure", "err": "stopping:\r\nREADY=1\u{0}\u{7f}"}}),
        ),
        _ => (
            404,
            serde_json::json!({"type": "error", "error": "not found", "error_code": 404}),
        ),
    }
}

/// Answers the requests of `stream` with [`answer`] until it is closed.
async fn serve(stream: tokio::net::UnixStream) {
    let service = service_fn(|req| {
        let (status, body) = answer(&req);
        let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
        *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
        async move { Ok::<_, Infallible>(r) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// A client of a server on a unix socket in `dir` that answers with [`answer`].
async fn client_of_test_server(dir: &std::path::Path) -> Client {
    let socket = dir.join("incus.socket");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                serve(stream).await;
            });
        }
    });
    Client::new(&socket.to_string_lossy()).unwrap()
}

fn assert_no_control(text: &str) {
    assert!(!text.chars().any(char::is_control), "{text:?}");
}

#[tokio::test]
async fn an_incus_error_message_comes_without_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let client = client_of_test_server(dir.path()).await;
    let e = client.list("default").await.unwrap_err();
    assert!(matches!(e, IncusError::Api { status: 500, .. }), "{e:?}");
    let shown = e.to_string();
    assert_no_control(&shown);
    assert_eq!(
        shown,
        "Incus refused listing instances: a b [31m (HTTP 500)"
    );
}

#[tokio::test]
async fn a_failed_operation_s_err_comes_without_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let client = client_of_test_server(dir.path()).await;
    let e = client.delete("default", "web-1").await.unwrap_err();
    let IncusError::Operation { message, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(message, "stopping:  READY=1  ");
    assert_no_control(&e.to_string());
}

/// The state of a running container as incusd 6.0 writes it (network cut).
fn running_state() -> serde_json::Value {
    serde_json::json!({
        "status": "Running", "status_code": 103, "disk": {}, "network": null,
        "memory": {"usage": 33554432, "usage_peak": 41943040, "total": 67108864,
                   "swap_usage": 0, "swap_usage_peak": 0},
        "cpu": {"usage": 2513643288_u64, "allocated_time": 1000000000},
        "pid": 4242, "processes": 3, "started_at": "2026-12-01T15:32:00Z",
    })
}

#[test]
fn state_gives_memory_and_cpu_time_but_no_pressure() {
    use super::calls::state_reading as reading;
    let mut state = running_state();
    assert_eq!(
        reading(&state),
        Some(Memory {
            usage: 32 << 20,
            limit: 64 << 20,
            oom_kills: None,
            cpu_ns: Some(2_513_643_288),
            pressure: None,
        })
    );
    // -1: incusd could not read the counter; 0: the host has no CPU accounting; or none.
    for cpu in [
        serde_json::json!({"usage": -1}),
        serde_json::json!({"usage": 0, "allocated_time": 0}),
        serde_json::json!({}),
        serde_json::json!(null),
    ] {
        state["cpu"] = cpu.clone();
        let m = reading(&state).expect("a memory reading");
        assert_eq!((m.usage, m.cpu_ns), (32 << 20, None), "{cpu}");
    }
    // A stopped instance reports zeros: no reading at all.
    state["memory"] = serde_json::json!({"usage": 0, "total": 0});
    assert_eq!(reading(&state), None);
}

#[tokio::test]
async fn memory_state_reads_the_instance_s_state() {
    let dir = tempfile::tempdir().unwrap();
    let client = client_of_test_server(dir.path()).await;
    let m = client.memory_state("default", "web-1").await.unwrap();
    assert_eq!(m.and_then(|m| m.cpu_ns), Some(2_513_643_288), "{m:?}");
}

/// The state of a running container with addresses on eth0 (as incusd 6.0 writes it, cut).
fn networked_state() -> serde_json::Value {
    serde_json::json!({
        "status": "Running", "status_code": 103,
        "network": {
            "eth0": {"addresses": [
                {"family": "inet6", "address": "fe80::216:3eff:fe12:3456", "netmask": "64", "scope": "link"},
                {"family": "inet6", "address": "fd42:1::5", "netmask": "64", "scope": "global"},
                {"family": "inet", "address": "10.1.2.3", "netmask": "24", "scope": "global", "new": 1},
                {"family": "inet", "address": "garbage", "scope": "global"},
                {"family": "inet", "address": "10.1.2.4", "netmask": "24", "scope": "global"}
            ], "host_name": "veth1", "state": "up", "type": "broadcast"},
            "lo": {"addresses": [
                {"family": "inet", "address": "127.0.0.1", "netmask": "8", "scope": "local"}
            ]},
            "eth1": {"addresses": [
                {"family": "inet6", "address": "2001:db8::7", "netmask": "64", "scope": "global"}
            ]}
        },
    })
}

#[test]
fn addresses_are_the_global_ones_ipv4_first() {
    use super::calls::state_addresses as addresses;
    let state = networked_state();
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    assert_eq!(
        addresses(&state, "eth0"),
        [ip("10.1.2.3"), ip("10.1.2.4"), ip("fd42:1::5")]
    );
    assert_eq!(addresses(&state, "eth1"), [ip("2001:db8::7")]);
    assert!(addresses(&state, "lo").is_empty());
    assert!(addresses(&state, "eth9").is_empty());
    assert!(addresses(&running_state(), "eth0").is_empty());
}

#[tokio::test]
async fn addresses_read_the_instance_s_state() {
    let dir = tempfile::tempdir().unwrap();
    let client = client_of_test_server(dir.path()).await;
    let a = client.addresses("default", "web-2", "eth0").await.unwrap();
    assert_eq!(a.first(), Some(&"10.1.2.3".parse().unwrap()));
    let e = client
        .addresses("default", "web-9", "eth0")
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e:?}");
}

/// incusd 6.0 accepts the connections of its unix socket one at a time and reads the first
/// bytes of each before it accepts the next (to tell TLS from HTTP): a connection opened and
/// left idle before it sent anything stops everyone else's requests, the `incus` command's
/// and other daemons', until it is used or closed. A pool of idle connections makes such
/// connections: a request that finds none idle opens one, takes the one freed meanwhile
/// instead, and leaves the new one idle in the pool (up to 90 s). Back-to-back requests (a
/// read then a write of a store) made one about once a minute, and `incus` stalled that long.
/// So the socket's client keeps no connection: each request opens its own, sends at once, and
/// closes it when answered.
#[test]
fn each_request_to_the_socket_has_a_connection_of_its_own() {
    use std::sync::mpsc;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("incus.socket");
    let server = tokio::runtime::Runtime::new().unwrap();
    // Each connection's index (in accept order, which is connect order) and its first byte,
    // or none when it was closed having sent nothing.
    let (tx, rx) = mpsc::channel::<(usize, Option<u8>)>();
    let listener = server.block_on(async { tokio::net::UnixListener::bind(&socket).unwrap() });
    server.spawn(async move {
        let mut index = 0;
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                let sent = stream
                    .async_io(tokio::io::Interest::READABLE, || {
                        use std::os::fd::AsRawFd;
                        // SAFETY: reads at most one byte into `first`, which outlives the
                        // call; MSG_PEEK leaves it in the socket for the HTTP server.
                        let n = unsafe {
                            libc::recv(
                                stream.as_raw_fd(),
                                first.as_mut_ptr().cast(),
                                1,
                                libc::MSG_PEEK,
                            )
                        };
                        if n < 0 {
                            Err(std::io::Error::last_os_error())
                        } else {
                            Ok(n)
                        }
                    })
                    .await;
                let _ = tx.send((index, matches!(sent, Ok(1)).then_some(first[0])));
                serve(stream).await;
            });
            index += 1;
        }
    });
    // Reads then writes back to back, as a store's compare-and-swap does, on a runtime of
    // several threads as the daemon's.
    const REQUESTS: usize = 100;
    let daemon = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    daemon.block_on(async {
        let client = Client::new(&socket.to_string_lossy()).unwrap();
        for _ in 0..REQUESTS / 2 {
            let _ = client.learned("default").await;
            let _ = client.list("default").await;
        }
    });
    // Its runtime gone, the client opens nothing more and every connection it had is closed.
    drop(daemon);
    // One more, after all of them: once it is seen, every connection before it was accepted.
    let mut last = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    std::io::Write::write_all(&mut last, b"!").unwrap();
    let mut seen = std::collections::BTreeMap::new();
    let mut last_index = None;
    while last_index.is_none_or(|k| (0..k).any(|i| !seen.contains_key(&i))) {
        let (i, first) = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the test server reports each connection");
        if first == Some(b'!') {
            last_index = Some(i);
        }
        seen.insert(i, first);
    }
    let idle: Vec<usize> = seen
        .iter()
        .filter(|(_, first)| first.is_none())
        .map(|(i, _)| *i)
        .collect();
    assert!(
        idle.is_empty(),
        "{} connections were opened and closed without a request: {idle:?}",
        idle.len()
    );
    assert_eq!(
        last_index,
        Some(REQUESTS),
        "{REQUESTS} requests came on {} connections",
        seen.len() - 1
    );
    drop(last);
}
