//! The proxy against a fake upstream, through reqwest (as the daemon talks) or raw bytes, and
//! once against the real incusd (ignored by a plain `cargo test`; `scripts/test.sh` runs it).

use std::error::Error as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::proxy::{Fault, Proxy, Rule, Times, OPERATION_FAILURE};

const VERSION: &str = r#"{"type":"sync","status":"Success","status_code":200,"metadata":{"environment":{"server_version":"6.0.4"}}}"#;

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A fake incusd: `GET /1.0` gets [`VERSION`], `/hang…` never an answer, a websocket upgrade
/// `101` and then an echo of every byte, anything else an echo of its method, target and
/// body. Each request (head and body, as text) goes to `seen` before it is answered, and
/// what a websocket echoed to `echoed` once it is closed. Answers have a `Content-Length` and
/// no `Connection` header; the connection is closed after each.
struct Upstream {
    path: PathBuf,
    seen: mpsc::UnboundedReceiver<String>,
    echoed: mpsc::UnboundedReceiver<Vec<u8>>,
    task: JoinHandle<()>,
}

impl Upstream {
    fn start(path: PathBuf) -> Self {
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, seen) = mpsc::unbounded_channel();
        let (echo_tx, echoed) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(fake_conn(conn, tx.clone(), echo_tx.clone()));
            }
        });
        Self {
            path,
            seen,
            echoed,
            task,
        }
    }

    /// The requests it has read so far (every one answered already is among them).
    fn drain(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.seen.try_recv().ok()).collect()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn fake_conn(
    mut s: UnixStream,
    seen: mpsc::UnboundedSender<String>,
    echoed: mpsc::UnboundedSender<Vec<u8>>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut need = usize::MAX;
    let mut end = 0;
    while buf.len() < need {
        if need == usize::MAX {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                end = i + 4;
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                need = end + len;
                continue;
            }
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let body = String::from_utf8_lossy(&buf[end..need]).into_owned();
    let mut words = head.split(' ');
    let (method, target) = (words.next().unwrap(), words.next().unwrap());
    let _ = seen.send(format!("{head}{body}"));
    if target.starts_with("/hang") {
        std::future::pending::<()>().await;
    }
    if head.to_ascii_lowercase().contains("upgrade: websocket") {
        let switch =
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
        let _ = s.write_all(switch.as_bytes()).await;
        let _ = s.write_all(&buf[need..]).await;
        let mut all = buf[need..].to_vec();
        while let Ok(n @ 1..) = s.read(&mut chunk).await {
            let _ = s.write_all(&chunk[..n]).await;
            all.extend_from_slice(&chunk[..n]);
        }
        let _ = echoed.send(all);
        return;
    }
    let answer = if method == "GET" && target == "/1.0" {
        VERSION.to_owned()
    } else {
        let meta = json!({"method": method, "target": target, "body": body});
        json!({"type": "sync", "status": "Success", "status_code": 200, "metadata": meta})
            .to_string()
    };
    let resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
        answer.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
}

/// A fake upstream, a proxy in front of it and a reqwest client of the proxy.
struct Setup {
    up: Upstream,
    proxy: Proxy,
    client: reqwest::Client,
    dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start(dir.path().join("upstream.sock"));
    let proxy = Proxy::start(&dir.path().join("proxy.sock"), &up.path);
    let client = client(proxy.path());
    Setup {
        up,
        proxy,
        client,
        dir,
    }
}

fn client(socket: &Path) -> reqwest::Client {
    incus_hpa::incus::tls::provider();
    reqwest::Client::builder()
        .unix_socket(socket)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn url(path: &str) -> String {
    format!("http://incus{path}")
}

/// The error and its sources, for the record (`--nocapture` shows what clients see).
fn chain(label: &str, e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    eprintln!("{label}: {s}");
    s
}

/// Sends raw bytes and reads until the proxy closes.
async fn raw(socket: &Path, request: &str) -> String {
    let mut s = UnixStream::connect(socket).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

async fn get_status(client: &reqwest::Client, path: &str) -> u16 {
    client
        .get(url(path))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn forwards_several_requests_on_one_client() {
    let mut t = setup();
    for i in 0..5 {
        let resp = t.client.get(url("/1.0")).send().await.unwrap();
        assert_eq!(resp.headers()["connection"], "close");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["metadata"]["environment"]["server_version"], "6.0.4");
        let path = format!("/1.0/instances?recursion=1&project=p{i}");
        let v: Value = t
            .client
            .get(url(&path))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["metadata"]["target"], path.as_str());
    }
    let resp = t
        .client
        .post(url("/1.0/instances"))
        .json(&json!({"name": "c1"}));
    let v: Value = resp.send().await.unwrap().json().await.unwrap();
    assert_eq!(v["metadata"]["method"], "POST");
    assert_eq!(v["metadata"]["body"], r#"{"name":"c1"}"#);

    assert_eq!(t.proxy.handle().counts().requests, 11);
    let seen = t.up.drain();
    assert_eq!(seen.len(), 11);
    for req in seen {
        let lower = req.to_ascii_lowercase();
        let conn: Vec<_> = lower
            .lines()
            .filter(|l| l.starts_with("connection:"))
            .collect();
        assert_eq!(conn, ["connection: close"], "{req}");
        assert!(!lower.contains("keep-alive"), "{req}");
    }
}

#[tokio::test]
async fn status_faults_answer_incus_errors_by_method_and_path() {
    let mut t = setup();
    let h = t.proxy.handle();
    h.add(Rule::new("/1.0/instances", Fault::Status(503)).method("GET"));
    h.add(Rule::new("/1.0/instances", Fault::Status(423)).method("post"));
    h.add(Rule::new("/1.0/operations", Fault::Status(500)));

    let resp = t.client.get(url("/1.0/instances?recursion=1")).send().await;
    let resp = resp.unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let v: Value = resp.json().await.unwrap();
    let want = json!({"type": "error", "status": "", "status_code": 0, "operation": "",
        "error_code": 503, "error": "injected 503", "metadata": null});
    assert_eq!(v, want);
    let resp = t.client.post(url("/1.0/instances")).body("{}").send().await;
    assert_eq!(resp.unwrap().status().as_u16(), 423);
    assert_eq!(get_status(&t.client, "/1.0/operations/abc").await, 500);
    let resp = t.client.delete(url("/1.0/instances/c1")).send().await;
    assert_eq!(resp.unwrap().status().as_u16(), 200);
    assert_eq!(get_status(&t.client, "/1.0").await, 200);

    let counts = h.counts();
    assert_eq!(counts.requests, 5);
    assert_eq!(counts.matched, [1, 1, 1]);
    assert_eq!(counts.injected, [1, 1, 1]);
    assert_eq!(
        t.up.drain().len(),
        2,
        "faulted requests never reach upstream"
    );
}

#[tokio::test]
async fn reset_closes_without_answer_and_the_client_does_not_retry() {
    let mut t = setup();
    let h = t.proxy.handle();
    h.add(Rule::new("/1.0/instances", Fault::Reset).times(Times::First(1)));
    let err = t
        .client
        .get(url("/1.0/instances"))
        .send()
        .await
        .unwrap_err();
    let msg = chain("Reset", &err);
    assert!(
        err.is_request() && !err.is_timeout() && !err.is_connect(),
        "{msg}"
    );
    assert!(
        msg.contains("connection closed before message completed"),
        "{msg}"
    );
    assert_eq!(h.counts().requests, 1);
    assert_eq!(get_status(&t.client, "/1.0/instances").await, 200);
    assert_eq!(h.counts().injected, [1]);
    assert_eq!(t.up.drain().len(), 1);
}

#[tokio::test]
async fn delay_forwards_late_even_after_the_client_gave_up() {
    let mut t = setup();
    let h = t.proxy.handle();
    h.add(Rule::new(
        "/1.0/slow",
        Fault::Delay(Duration::from_millis(150)),
    ));
    let start = Instant::now();
    assert_eq!(get_status(&t.client, "/1.0/slow").await, 200);
    assert!(start.elapsed() >= Duration::from_millis(150));

    h.clear();
    h.add(Rule::new(
        "/1.0/slow",
        Fault::Delay(Duration::from_millis(300)),
    ));
    let req = t
        .client
        .get(url("/1.0/slow?late"))
        .timeout(Duration::from_millis(50));
    let err = req.send().await.unwrap_err();
    let msg = chain("Delay beyond the client's timeout", &err);
    assert!(err.is_timeout(), "{msg}");
    assert_eq!(t.up.drain().len(), 1, "only the first one so far");
    let late = t.up.seen.recv().await.unwrap();
    assert!(late.starts_with("GET /1.0/slow?late "), "{late}");
}

#[tokio::test]
async fn body_faults_answer_200_with_exactly_that_body() {
    let mut t = setup();
    let h = t.proxy.handle();
    let truncated = r#"{"type":"sync","metadata":[{"name":"#;
    h.add(Rule::new("/1.0/a", Fault::Body("not json at all".into())));
    h.add(Rule::new("/1.0/b", Fault::Body(truncated.into())));
    for (path, body) in [("/1.0/a", "not json at all"), ("/1.0/b", truncated)] {
        let resp = t.client.get(url(path)).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert_eq!(resp.text().await.unwrap(), body);
        let resp = t.client.get(url(path)).send().await.unwrap();
        let err = resp.json::<Value>().await.unwrap_err();
        let msg = chain(&format!("Body {body:?} read as JSON"), &err);
        assert!(err.is_decode(), "{msg}");
    }
    assert!(t.up.drain().is_empty());
}

#[tokio::test]
async fn truncate_upstream_sends_half_the_body_then_closes() {
    let mut t = setup();
    let h = t.proxy.handle();
    h.add(Rule::new("/1.0/instances", Fault::TruncateUpstream));
    let resp = t.client.get(url("/1.0/instances")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200, "the head is intact");
    let err = resp.bytes().await.unwrap_err();
    let msg = chain("TruncateUpstream, reading the body", &err);
    assert!(
        err.is_decode() && !err.is_body(),
        "reqwest calls it decoding: {msg}"
    );
    assert!(
        msg.contains("end of file before message length reached"),
        "{msg}"
    );

    let out = raw(
        t.proxy.path(),
        "GET /1.0/instances HTTP/1.1\r\nHost: incus\r\n\r\n",
    )
    .await;
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(body.len(), len / 2, "{out}");
    assert_eq!(t.up.drain().len(), 2, "both reached upstream");
}

#[tokio::test]
async fn operation_failure_lets_upstream_complete_and_reports_failure() {
    let mut t = setup();
    let h = t.proxy.handle();
    h.add(Rule::new("/wait", Fault::OperationFailure));
    let path = "/1.0/operations/abc/wait?timeout=120";
    let resp = t.client.get(url(path)).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body = resp.text().await.unwrap();
    assert_eq!(body, OPERATION_FAILURE);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["metadata"]["status"], "Failure");
    let seen = t.up.drain();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].starts_with(&format!("GET {path} ")), "{}", seen[0]);
}

#[tokio::test]
async fn budgets_first_and_every_fall_through_to_later_rules() {
    let t = setup();
    let h = t.proxy.handle();
    h.add(Rule::new("/1.0/instances", Fault::Status(500)).times(Times::First(2)));
    h.add(Rule::new("/1.0/instances", Fault::Status(503)).times(Times::Every(3)));
    let mut got = Vec::new();
    for _ in 0..8 {
        got.push(get_status(&t.client, "/1.0/instances").await);
    }
    assert_eq!(got, [500, 500, 200, 200, 503, 200, 200, 503]);
    let counts = h.counts();
    assert_eq!((counts.matched, counts.injected), (vec![8, 6], vec![2, 2]));
}

#[tokio::test]
async fn clear_removes_rules_and_their_counters() {
    let t = setup();
    let h = t.proxy.handle();
    h.add(Rule::new("/1.0", Fault::Status(500)));
    assert_eq!(get_status(&t.client, "/1.0").await, 500);
    assert_eq!(h.counts().injected, [1]);
    h.clear();
    assert_eq!(get_status(&t.client, "/1.0").await, 200);
    let counts = h.counts();
    assert_eq!(counts.requests, 2);
    assert!(counts.matched.is_empty() && counts.injected.is_empty());
    t.proxy.handle().add(Rule::new("/1.0", Fault::Status(503)));
    assert_eq!(get_status(&t.client, "/1.0").await, 503);
}

#[tokio::test]
async fn bad_requests_get_400_and_reach_nobody() {
    let mut t = setup();
    let chunked = "POST /1.0/instances HTTP/1.1\r\nHost: incus\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    let out = raw(t.proxy.path(), chunked).await;
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    assert!(
        out.contains("chunked request bodies are not supported"),
        "{out}"
    );
    let out = raw(t.proxy.path(), "HELLO\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    assert!(t.up.drain().is_empty());
    assert_eq!(t.proxy.handle().counts().requests, 0);
}

#[tokio::test]
async fn websocket_upgrades_are_piped_both_ways_and_can_be_refused() {
    let mut t = setup();
    let h = t.proxy.handle();
    h.add(Rule::new("/1.0/events", Fault::Status(503)).times(Times::First(1)));
    h.add(Rule::new("/1.0/events", Fault::TruncateUpstream));
    let upgrade = "GET /1.0/events?type=lifecycle HTTP/1.1\r\nHost: incus\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let out = raw(t.proxy.path(), upgrade).await;
    assert!(
        out.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{out}"
    );

    let mut s = UnixStream::connect(t.proxy.path()).await.unwrap();
    s.write_all(upgrade.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    while find(&got, b"\r\n\r\n").is_none() {
        let mut chunk = [0u8; 1024];
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the 101");
        got.extend_from_slice(&chunk[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 101 Switching Protocols\r\n"));
    for word in [&b"hello"[..], b"events"] {
        s.write_all(word).await.unwrap();
        let mut back = vec![0u8; word.len()];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(back, word);
    }
    s.shutdown().await.unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "the upstream's close reaches the client");

    let counts = h.counts();
    assert_eq!(
        counts.matched,
        [2, 0],
        "TruncateUpstream never matches an upgrade"
    );
    assert_eq!(counts.injected, [1, 0]);
    let seen = t.up.drain();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].contains("\r\nConnection: Upgrade\r\n"),
        "{}",
        seen[0]
    );
}

/// Upgrades to a websocket through the proxy at `socket` (reads the 101).
async fn upgraded(socket: &Path) -> UnixStream {
    let upgrade = "GET /1.0/events?type=lifecycle HTTP/1.1\r\nHost: incus\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let mut s = UnixStream::connect(socket).await.unwrap();
    s.write_all(upgrade.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    while find(&got, b"\r\n\r\n").is_none() {
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte)
            .await
            .expect("closed before the 101");
        got.push(byte[0]);
    }
    assert!(got.starts_with(b"HTTP/1.1 101 Switching Protocols\r\n"));
    s
}

/// Writes `word` and reads it back from the echoing upstream.
async fn echo(s: &mut UnixStream, word: &[u8]) {
    s.write_all(word).await.unwrap();
    let mut back = vec![0u8; word.len()];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(back, word);
}

#[tokio::test]
async fn silenced_websockets_forward_nothing_and_stay_open_until_the_client_leaves() {
    let mut t = setup();
    let h = t.proxy.handle();
    assert_eq!(h.silence_events(), 0, "no websocket yet");
    let mut silent = upgraded(t.proxy.path()).await;
    echo(&mut silent, b"hello").await;
    assert_eq!(h.silence_events(), 1);
    silent.write_all(b"lost").await.unwrap();
    // A later upgrade is piped as usual, and its close goes through.
    let mut fresh = upgraded(t.proxy.path()).await;
    echo(&mut fresh, b"fresh").await;
    fresh.shutdown().await.unwrap();
    let mut rest = Vec::new();
    fresh.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    assert_eq!(t.up.echoed.recv().await.unwrap(), b"fresh");
    // The silenced one is still open: nothing to read, and no end either.
    let mut buf = [0u8; 16];
    let err = silent.try_read(&mut buf).unwrap_err();
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::WouldBlock,
        "closed or answered"
    );
    // Once its client leaves, it is closed both ways; what was sent after the silence never
    // reached upstream, nor came back.
    silent.shutdown().await.unwrap();
    let mut rest = Vec::new();
    silent.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert_eq!(t.up.echoed.recv().await.unwrap(), b"hello");
    assert_eq!(h.counts().requests, 2);
}

#[tokio::test]
async fn stop_aborts_requests_in_flight_and_a_new_proxy_takes_over() {
    let Setup {
        mut up,
        proxy,
        client,
        dir,
    } = setup();
    let path = proxy.path().to_owned();
    let c = client.clone();
    let hung = tokio::spawn(async move { c.get(url("/hang")).send().await });
    proxy.handle().wait_requests(1).await;
    assert!(up.seen.recv().await.unwrap().starts_with("GET /hang "));
    proxy.stop().await;
    let err = hung.await.unwrap().unwrap_err();
    let msg = chain("proxy stopped while a request was in flight", &err);
    assert!(err.is_request() && !err.is_timeout(), "{msg}");
    let err = client.get(url("/1.0")).send().await.unwrap_err();
    let msg = chain("proxy stopped, new request", &err);
    assert!(err.is_connect(), "{msg}");

    let proxy = Proxy::start(&path, &up.path);
    assert_eq!(get_status(&client, "/1.0").await, 200);
    drop(proxy);
    assert!(!path.exists(), "dropping removes the socket");
    let upstream_down = Proxy::start(&path, &dir.path().join("missing.sock"));
    let resp = client.get(url("/1.0")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 502);
    let v: Value = resp.json().await.unwrap();
    let err = v["error"].as_str().unwrap();
    assert!(err.starts_with("proxy: upstream "), "{err}");
    drop(upstream_down);
}

/// Fails (never skips) when there is no incusd.
#[tokio::test]
#[ignore = "needs a real Incus (scripts/test.sh runs it)"]
async fn real_incus_through_the_proxy() {
    let real = Path::new("/var/lib/incus/unix.socket");
    assert!(
        real.exists(),
        "real-Incus test cannot run: no {} — run scripts/setup-incus.sh first",
        real.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(&dir.path().join("incus.sock"), real);
    let client = client(proxy.path());
    let h = proxy.handle();

    let resp = client.get(url("/1.0")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["connection"], "close");
    let v: Value = resp.json().await.unwrap();
    let version = v["metadata"]["environment"]["server_version"].as_str();
    assert!(version.is_some_and(|s| !s.is_empty()), "{v}");

    h.add(Rule::new("/1.0", Fault::Status(503)).times(Times::First(1)));
    let resp = client.get(url("/1.0")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error_code"], 503);

    // `GET /1.0` is large enough for incusd to answer it chunked.
    h.add(Rule::new("/1.0", Fault::TruncateUpstream).times(Times::First(1)));
    let resp = client.get(url("/1.0")).send().await.unwrap();
    assert_eq!(resp.headers()["transfer-encoding"], "chunked");
    let err = resp.bytes().await.unwrap_err();
    chain("TruncateUpstream, real incusd (chunked)", &err);

    let unix = UnixStream::connect(proxy.path()).await.unwrap();
    let ws = "ws://incus/1.0/events?type=lifecycle";
    let (_ws, resp) = tokio_tungstenite::client_async(ws, unix).await.unwrap();
    assert_eq!(resp.status().as_u16(), 101);
    assert_eq!(h.counts().requests, 4);
    assert_eq!(h.counts().injected, [1, 1]);
}
