//! The client's paths and queries, and what it makes of Incus' own words: an error message or
//! an operation's `err` with control characters in it (a newline, an escape sequence) comes
//! out of the client without them, answered by a small HTTP server on a unix socket; and the
//! reading it takes from an instance's `/state`.

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

/// A client of a server on a unix socket in `dir` that answers with [`answer`].
async fn client_of_test_server(dir: &std::path::Path) -> Client {
    let socket = dir.join("incus.socket");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = service_fn(|req| {
                    let (status, body) = answer(&req);
                    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
                    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                    async move { Ok::<_, Infallible>(r) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
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
