//! A fault-injecting HTTP/1.1 proxy in front of incusd's unix socket, for tests.
//!
//! The daemon under test is pointed at the proxy's socket (`--incus-socket PATH`); the proxy
//! forwards to the real (or a fake) incusd socket, except for the requests that a [`Rule`]
//! picks, which get a [`Fault`] instead: an error status, a dropped connection, a delay, a
//! garbage body, a truncated answer, or a failed operation. Rules are added and cleared at run
//! time through a [`ProxyHandle`], which also counts what was seen and injected.
//!
//! Every client connection carries one request: each answer says `Connection: close` (the
//! proxy adds it to forwarded answers that lack it) and the connection is closed after it, so
//! a client never reuses a connection the proxy is about to drop, and never retries on its
//! own. Each forwarded request gets its own upstream connection and is sent with
//! `Connection: close`, except websocket upgrades (`GET /1.0/events`), which are forwarded as
//! they are and then piped both ways until either side closes, or until
//! [`ProxyHandle::silence_events`] silences them: then nothing more is forwarded either way and
//! both sides are kept open (a half-open connection, as the client sees it) until the client
//! leaves.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Longest request or response head the proxy reads.
const MAX_HEAD: usize = 64 * 1024;

/// What `GET /1.0/operations/UUID/wait` answers for a failed operation (HTTP 200).
pub const OPERATION_FAILURE: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"id":"x","class":"task","status":"Failure","status_code":400,"err":"injected operation failure","resources":{},"metadata":null}}"#;

/// What the proxy does to a request a rule picked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status with an Incus-style error body (`error_code` = status).
    Status(u16),
    /// Close the client connection without answering (the client reads EOF: hyper's
    /// "connection closed before message completed").
    Reset,
    /// Wait, then forward (even if the client gave up meanwhile: the request still happens).
    Delay(Duration),
    /// Answer 200 with exactly this body.
    Body(String),
    /// Forward, then send the client the head and only the first half of the body (raw bytes,
    /// chunk framing included), and close. Never matches websocket upgrades.
    TruncateUpstream,
    /// Forward and let the request complete upstream, then answer [`OPERATION_FAILURE`].
    /// Meant for `/wait` paths. Never matches websocket upgrades.
    OperationFailure,
}

/// Which of a rule's matching requests get the fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Times {
    /// All of them.
    Always,
    /// The first n (then the rule lets requests through to later rules, or upstream).
    First(u64),
    /// The k-th, 2k-th, ... (k > 0).
    Every(u64),
}

/// Requests whose method is `method` (any if `None`, case-insensitive) and whose target (path
/// and query string) contains `path_contains` get `fault`, as `times` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub method: Option<String>,
    pub path_contains: String,
    pub fault: Fault,
    pub times: Times,
}

impl Rule {
    /// `fault` for every request, of any method, whose target contains `path_contains`.
    pub fn new(path_contains: &str, fault: Fault) -> Self {
        Self {
            method: None,
            path_contains: path_contains.to_owned(),
            fault,
            times: Times::Always,
        }
    }

    /// Only for requests with this method.
    pub fn method(mut self, method: &str) -> Self {
        self.method = Some(method.to_owned());
        self
    }

    /// Only as often as `times` says.
    pub fn times(mut self, times: Times) -> Self {
        self.times = times;
        self
    }

    fn matches(&self, method: &str, target: &str, upgrade: bool) -> bool {
        let forwards = matches!(
            self.fault,
            Fault::TruncateUpstream | Fault::OperationFailure
        );
        self.method
            .as_ref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && target.contains(&self.path_contains)
            && !(upgrade && forwards)
    }
}

/// The well-formed requests the proxy has read since it started (`requests`; those refused
/// with 400 are not counted), and per rule added since the last [`ProxyHandle::clear`], in the
/// order added: the requests it matched and those it faulted. A request a rule faults is not
/// seen by the rules after it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub matched: Vec<u64>,
    pub injected: Vec<u64>,
}

struct Slot {
    rule: Rule,
    matched: u64,
    injected: u64,
}

/// Adds and clears rules, and reads the counters, while the proxy runs. Cheap to clone.
#[derive(Clone)]
pub struct ProxyHandle {
    rules: Arc<Mutex<Vec<Slot>>>,
    requests: watch::Sender<u64>,
    /// Bumped to silence the websockets piped at the time; each one piped holds a receiver.
    silence: watch::Sender<u64>,
}

impl ProxyHandle {
    fn new() -> Self {
        Self {
            rules: Arc::default(),
            requests: watch::Sender::new(0),
            silence: watch::Sender::new(0),
        }
    }

    /// Silences every websocket piped now (the event streams): from now on nothing is
    /// forwarded on them either way, and they stay open until their client leaves. Later
    /// upgrades are piped as usual. Returns how many websockets are open through the proxy
    /// (all of them silent now).
    pub fn silence_events(&self) -> usize {
        self.silence.send_modify(|n| *n += 1);
        self.silence.receiver_count()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a rule after the existing ones (the first matching rule with budget left wins).
    pub fn add(&self, rule: Rule) {
        assert!(rule.times != Times::Every(0), "Times::Every(0) never fires");
        self.lock().push(Slot {
            rule,
            matched: 0,
            injected: 0,
        });
    }

    /// The rules in force, in order.
    pub fn rules(&self) -> Vec<Rule> {
        self.lock().iter().map(|s| s.rule.clone()).collect()
    }

    /// Removes every rule (and its counters): everything is forwarded again.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The counters now.
    pub fn counts(&self) -> Counts {
        let rules = self.lock();
        Counts {
            requests: *self.requests.borrow(),
            matched: rules.iter().map(|s| s.matched).collect(),
            injected: rules.iter().map(|s| s.injected).collect(),
        }
    }

    /// Returns once the proxy has seen at least `n` requests in all (heads read, not answered).
    pub async fn wait_requests(&self, n: u64) {
        let mut rx = self.requests.subscribe();
        rx.wait_for(|&seen| seen >= n)
            .await
            .expect("the handle holds the sender");
    }

    /// Counts one request and picks the fault for it, if any.
    fn pick(&self, method: &str, target: &str, upgrade: bool) -> Option<Fault> {
        let mut rules = self.lock();
        self.requests.send_modify(|n| *n += 1);
        for slot in rules.iter_mut() {
            if !slot.rule.matches(method, target, upgrade) {
                continue;
            }
            slot.matched += 1;
            let fire = match slot.rule.times {
                Times::Always => true,
                Times::First(n) => slot.matched <= n,
                Times::Every(k) => slot.matched % k == 0,
            };
            if fire {
                slot.injected += 1;
                return Some(slot.rule.fault.clone());
            }
        }
        None
    }
}

/// A running proxy. Dropping it (or [`Proxy::stop`]) stops listening, removes the socket file
/// and aborts the connections in flight (piped websockets included).
pub struct Proxy {
    path: PathBuf,
    handle: ProxyHandle,
    task: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on `listen` (replacing any file there) and forwards to `upstream`, which is only
    /// connected to per request. Must be called inside a tokio runtime; panics if it can't bind.
    pub fn start(listen: &Path, upstream: &Path) -> Proxy {
        let _ = std::fs::remove_file(listen);
        let listener = UnixListener::bind(listen)
            .unwrap_or_else(|e| panic!("proxy: cannot listen on {}: {e}", listen.display()));
        let handle = ProxyHandle::new();
        let task = tokio::spawn(accept(listener, upstream.to_owned(), handle.clone()));
        Proxy {
            path: listen.to_owned(),
            handle,
            task: Some(task),
        }
    }

    /// The socket the proxy listens on.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle on the rules and counters.
    pub fn handle(&self) -> ProxyHandle {
        self.handle.clone()
    }

    /// Stops the proxy and waits until the listener and every connection task are gone.
    pub async fn stop(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Accepts connections; owns their tasks, so aborting it aborts them.
async fn accept(listener: UnixListener, upstream: PathBuf, handle: ProxyHandle) {
    let mut conns = JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        while conns.try_join_next().is_some() {}
        conns.spawn(serve(client, upstream.clone(), handle.clone()));
    }
}

/// One parsed request: what the rules look at and the bytes to send upstream.
struct Request {
    method: String,
    target: String,
    upgrade: bool,
    forward: Vec<u8>,
}

async fn serve(mut client: UnixStream, upstream: PathBuf, handle: ProxyHandle) {
    let req = match read_request(&mut client).await {
        Ok(req) => req,
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            let _ = respond(&mut client, 400, &error_body(400, &e.to_string())).await;
            return;
        }
        Err(_) => return,
    };
    let _ = match handle.pick(&req.method, &req.target, req.upgrade) {
        None => forward(client, &upstream, &req, &handle).await,
        Some(Fault::Status(code)) => {
            let body = error_body(code, &format!("injected {code}"));
            respond(&mut client, code, &body).await
        }
        Some(Fault::Reset) => Ok(()), // `client` is dropped (closed) on return
        Some(Fault::Delay(d)) => {
            tokio::time::sleep(d).await;
            forward(client, &upstream, &req, &handle).await
        }
        Some(Fault::Body(body)) => respond(&mut client, 200, &body).await,
        Some(Fault::TruncateUpstream) => match exchange(&mut client, &upstream, &req).await {
            Some(resp) => {
                let head = find(&resp, b"\r\n\r\n").map_or(resp.len(), |i| i + 4);
                let cut = head + (resp.len() - head) / 2;
                client.write_all(&resp[..cut]).await
            }
            None => Ok(()),
        },
        Some(Fault::OperationFailure) => match exchange(&mut client, &upstream, &req).await {
            Some(_) => respond(&mut client, 200, OPERATION_FAILURE).await,
            None => Ok(()),
        },
    };
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads into `buf` until it holds a whole head; returns the head's length (CRLF CRLF included).
async fn read_head(stream: &mut UnixStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            return Ok(i + 4);
        }
        if buf.len() > MAX_HEAD {
            return Err(bad("head too large"));
        }
        read_more(stream, buf).await?;
    }
}

async fn read_more(stream: &mut UnixStream, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk).await? {
        0 => Err(io::ErrorKind::UnexpectedEof.into()),
        n => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
    }
}

/// Reads one request (head and `Content-Length` body) and prepares its upstream bytes.
async fn read_request(client: &mut UnixStream) -> io::Result<Request> {
    let mut buf = Vec::new();
    let end = read_head(client, &mut buf).await?;
    let head = String::from_utf8(buf[..end - 4].to_vec()).map_err(|_| bad("head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let (method, target) = match line.split(' ').collect::<Vec<_>>()[..] {
        [m, t, v] if v.starts_with("HTTP/1.") => (m.to_owned(), t.to_owned()),
        _ => return Err(bad(&format!("bad request line {line:?}"))),
    };
    let mut headers = Vec::new();
    for l in lines {
        let (name, value) = l.split_once(':').ok_or_else(|| bad("malformed header"))?;
        headers.push((name.trim(), value.trim()));
    }
    let header = |n: &str| {
        headers
            .iter()
            .find(|h| h.0.eq_ignore_ascii_case(n))
            .map(|h| h.1)
    };
    if header("transfer-encoding").is_some() {
        return Err(bad("chunked request bodies are not supported"));
    }
    let len: usize = match header("content-length") {
        Some(v) => v.parse().map_err(|_| bad("bad Content-Length"))?,
        None => 0,
    };
    let upgrade = header("upgrade").is_some_and(|v| v.to_ascii_lowercase().contains("websocket"));
    while buf.len() < end + len {
        read_more(client, &mut buf).await?;
    }
    let mut out = format!("{line}\r\n");
    for (name, value) in &headers {
        let hop =
            name.eq_ignore_ascii_case("connection") || name.eq_ignore_ascii_case("keep-alive");
        if upgrade || !hop {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    if !upgrade {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    let mut forward = out.into_bytes();
    // An upgrade keeps whatever the client sent early; otherwise only this request's body.
    forward.extend_from_slice(&buf[end..if upgrade { buf.len() } else { end + len }]);
    Ok(Request {
        method,
        target,
        upgrade,
        forward,
    })
}

/// Connects upstream and sends the request; on failure answers the client 502.
async fn connect(client: &mut UnixStream, upstream: &Path, req: &Request) -> Option<UnixStream> {
    let sent = async {
        let mut up = UnixStream::connect(upstream).await?;
        up.write_all(&req.forward).await?;
        io::Result::Ok(up)
    };
    match sent.await {
        Ok(up) => Some(up),
        Err(e) => {
            let msg = format!("proxy: upstream {}: {e}", upstream.display());
            let _ = respond(client, 502, &error_body(502, &msg)).await;
            None
        }
    }
}

/// Pipes an upgraded connection both ways until either side closes, or until `silence` changes
/// (see [`ProxyHandle::silence_events`]): then whatever either side sends is read and dropped,
/// and both stay open until the client leaves.
async fn pipe(
    mut client: UnixStream,
    mut up: UnixStream,
    mut silence: watch::Receiver<u64>,
) -> io::Result<()> {
    tokio::select! {
        piped = tokio::io::copy_bidirectional(&mut client, &mut up) => return piped.map(drop),
        Ok(()) = silence.changed() => {}
    }
    let (mut from_client, mut from_up) = ([0u8; 4096], [0u8; 4096]);
    let mut up_open = true;
    loop {
        tokio::select! {
            n = client.read(&mut from_client) => if !matches!(n, Ok(1..)) {
                return Ok(());
            },
            n = up.read(&mut from_up), if up_open => up_open = matches!(n, Ok(1..)),
        }
    }
}

/// Forwards the request and streams the answer back (or pipes an upgrade both ways).
async fn forward(
    mut client: UnixStream,
    upstream: &Path,
    req: &Request,
    handle: &ProxyHandle,
) -> io::Result<()> {
    let Some(mut up) = connect(&mut client, upstream, req).await else {
        return Ok(());
    };
    if req.upgrade {
        return pipe(client, up, handle.silence.subscribe()).await;
    }
    let mut buf = Vec::new();
    if let Ok(end) = read_head(&mut up, &mut buf).await {
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let close = head
            .split("\r\n")
            .any(|l| l.starts_with("connection:") && l.contains("close"));
        if !close {
            buf.splice(end - 2..end - 2, b"Connection: close\r\n".iter().copied());
        }
    }
    // An upstream that closed before a whole head: the client gets what it sent.
    client.write_all(&buf).await?;
    tokio::io::copy(&mut up, &mut client).await?;
    client.shutdown().await
}

/// Forwards the request and reads the whole answer (upstream closes: `Connection: close`).
async fn exchange(client: &mut UnixStream, upstream: &Path, req: &Request) -> Option<Vec<u8>> {
    let mut up = connect(client, upstream, req).await?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp).await.ok()?;
    Some(resp)
}

/// An Incus-style error body.
fn error_body(code: u16, msg: &str) -> String {
    let msg = serde_json::Value::from(msg);
    format!(
        r#"{{"type":"error","status":"","status_code":0,"operation":"","error_code":{code},"error":{msg},"metadata":null}}"#
    )
}

/// Answers with `body` as JSON and closes.
async fn respond(client: &mut UnixStream, code: u16, body: &str) -> io::Result<()> {
    let reason = reqwest::StatusCode::from_u16(code).ok();
    let reason = reason
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Injected");
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    client.write_all(head.as_bytes()).await?;
    client.write_all(body.as_bytes()).await?;
    client.shutdown().await
}
