//! The Incus REST client, over the local unix socket (reqwest's unix-socket connector) or over
//! HTTPS with a client certificate (rustls, see [`super::tls`]).
//!
//! Every request has a timeout. Asynchronous answers are followed to their operation, which is
//! waited for with `/wait`, whose body (not its HTTP status, always 200) says how it ended.
//! `/1.0/metrics` is the one answer that is not JSON: Prometheus text, read by
//! [`super::metrics::from_metrics`]. What each call of the [`Incus`](super::Incus) trait sends,
//! and how its answer is read, is in `calls`; the lease store's reads and writes are in
//! [`store`].

mod calls;
mod store;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::tls::Tls;
use super::{Endpoint, IncusError, Unreachable};
use crate::text::printable;

/// Default socket of a Debian Incus install.
pub const DEFAULT_SOCKET: &str = "/var/lib/incus/unix.socket";

/// Longest a single request may take (operations get their own, longer budget), unless the
/// environment variable [`TIMEOUT_ENV`] says otherwise.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Environment variable that overrides [`REQUEST_TIMEOUT`] (a duration such as `2s`); meant for
/// tests that inject slow answers.
pub const TIMEOUT_ENV: &str = "INCUS_HPA_REQUEST_TIMEOUT";
/// Longest a creation, a start or a command is waited for, unless the environment variable
/// [`OPERATION_TIMEOUT_ENV`] says otherwise; a graceful stop is waited for its own timeout and
/// a little more, a forced stop and a delete [`DELETE_WAIT`].
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(120);
/// Environment variable that overrides [`OPERATION_TIMEOUT`] (a duration such as `2s`); meant
/// for tests that hold an operation's answer.
pub const OPERATION_TIMEOUT_ENV: &str = "INCUS_HPA_OPERATION_TIMEOUT";
/// How long a delete is waited for (deleting a stopped container takes well under a second).
pub const DELETE_WAIT: Duration = Duration::from_secs(20);
/// What a graceful stop is waited for beyond its own timeout (Incus answers at its end).
const STOP_MARGIN: Duration = Duration::from_secs(5);

/// A client for one incusd (or cluster member), reached through its unix socket or HTTPS.
pub struct Client {
    http: reqwest::Client,
    /// Where requests go: `http://incus` on the socket, `https://HOST:PORT` otherwise.
    base: String,
    /// Where Incus is, for messages: the socket's path or the HTTPS address.
    socket: String,
    /// The TLS set-up over HTTPS, for the "untrusted" message.
    tls: Option<Tls>,
    timeout: Duration,
    /// How long creations, starts and commands are waited for.
    operation_timeout: Duration,
    requests: AtomicU64,
    /// Requests by endpoint and status class, for `/metrics` (see [`Client::counting`]).
    counted: Option<crate::control::Requests>,
}

/// The envelope every Incus answer comes in, as it is read: its metadata borrowed from the
/// answer's text.
#[derive(Debug, Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    operation: String,
    #[serde(borrow, default)]
    metadata: Option<&'a RawValue>,
}

/// An answer: the envelope's fields, and the answer's text with where its metadata lies in it.
/// The metadata is read once, into what its caller wants, straight from the text that came:
/// a listing of a thousand instances (2.8 MB) is neither copied nor made a tree of JSON values
/// first (a tree took about 7 MiB at its peak, a copy 2.8 MB more, which the allocator kept).
#[derive(Debug)]
struct Envelope {
    kind: String,
    error: String,
    operation: String,
    body: Vec<u8>,
    /// The metadata's bytes in `body`, when there is any.
    metadata: Option<std::ops::Range<usize>>,
}

impl Envelope {
    /// The envelope of `body`, an answer's text.
    fn read(body: Vec<u8>) -> Result<Self, serde_json::Error> {
        let head: Head<'_> = serde_json::from_slice(&body)?;
        let metadata = head.metadata.map(|raw| {
            // `raw` borrows from `body`: its place there.
            let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
            start..start + raw.get().len()
        });
        Ok(Self {
            kind: head.kind,
            error: head.error,
            operation: head.operation,
            metadata,
            body,
        })
    }

    /// The metadata, read as `T` (as `null` when there is none).
    fn metadata<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        match &self.metadata {
            Some(at) => serde_json::from_slice(&self.body[at.clone()]),
            None => serde_json::from_str("null"),
        }
    }
}

/// Reads an answer's body into one buffer, chunk by chunk as it comes (a body sent in chunks
/// is then held once, not once in its chunks and once more joined).
async fn read_body(mut resp: reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::with_capacity(resp.content_length().unwrap_or(0).min(1 << 24) as usize);
    while let Some(chunk) = resp.chunk().await? {
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The client of the unix socket (the same type).
pub type UnixClient = Client;

/// `default`, unless the environment variable `var` gives another duration.
fn timeout_from_env(var: &str, default: Duration) -> Duration {
    std::env::var(var)
        .ok()
        .and_then(|t| humantime::parse_duration(&t).ok())
        .filter(|t| !t.is_zero())
        .unwrap_or(default)
}

impl Client {
    /// A client for the socket at `socket` (not contacted until the first call). It keeps no
    /// connection idle: incusd 6.0 accepts the connections of its socket one at a time and
    /// waits for the first bytes of each before it accepts the next (to tell TLS from HTTP),
    /// so a pooled connection that was opened and never used (a request that found none idle
    /// opens one, then takes one freed meanwhile) would stop every other client of the socket,
    /// the `incus` command and other daemons, for as long as it stays in the pool. A
    /// connection to a local socket costs a few microseconds. Over HTTPS connections are kept:
    /// each sends its TLS greeting as it opens, and a handshake costs more.
    pub fn new(socket: &str) -> Result<Self, IncusError> {
        let builder = reqwest::Client::builder()
            .use_preconfigured_tls(super::tls::unused())
            .unix_socket(socket)
            .pool_max_idle_per_host(0);
        Self::build(builder, "http://incus".into(), socket.to_owned(), None)
    }

    /// A client for Incus at `endpoint`: its socket, or HTTPS with `tls` (required there).
    pub fn connect(endpoint: &Endpoint, tls: Option<Tls>) -> Result<Self, IncusError> {
        match (endpoint, tls) {
            (Endpoint::Unix(p), _) => Self::new(&p.to_string_lossy()),
            (Endpoint::Https { .. }, None) => Err(IncusError::Transport(Unreachable {
                socket: endpoint.to_string(),
                problem: super::Problem::Tls(
                    "HTTPS needs a client certificate: set [daemon] tls_client_cert and \
                     tls_client_key"
                        .into(),
                ),
            })),
            (Endpoint::Https { .. }, Some(tls)) => {
                let url = endpoint.to_string();
                let builder =
                    reqwest::Client::builder().use_preconfigured_tls((*tls.config).clone());
                Self::build(builder, url.clone(), url, Some(tls))
            }
        }
    }

    /// The client `builder` makes, with the request timeouts, sending to `base`.
    fn build(
        builder: reqwest::ClientBuilder,
        base: String,
        socket: String,
        tls: Option<Tls>,
    ) -> Result<Self, IncusError> {
        let timeout = timeout_from_env(TIMEOUT_ENV, REQUEST_TIMEOUT);
        let http = builder
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(5).min(timeout))
            .build()
            .map_err(|e| IncusError::Transport(Unreachable::from_error(&socket, &e, timeout)))?;
        Ok(Self {
            http,
            base,
            socket,
            tls,
            timeout,
            operation_timeout: timeout_from_env(OPERATION_TIMEOUT_ENV, OPERATION_TIMEOUT),
            counted: None,
            requests: AtomicU64::new(0),
        })
    }

    /// How many HTTP requests this client has sent (for measurements).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Sends one request and returns the envelope of a successful answer.
    /// Counts every request in `requests` from now on.
    pub fn counting(mut self, requests: crate::control::Requests) -> Self {
        self.counted = Some(requests);
        self
    }

    fn count(&self, method: &Method, path: &str, status: Option<StatusCode>) {
        if let Some(c) = &self.counted {
            c.count(method.as_str(), path, status.map(|s| s.as_u16()));
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
        what: &str,
    ) -> Result<(StatusCode, Envelope), IncusError> {
        self.exchange(method, path, body, timeout, what, None)
            .await
            .map(|(status, _, env)| (status, env))
    }

    /// Like [`Client::send`], with an optional `If-Match`, returning the answer's `ETag`.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
        what: &str,
        if_match: Option<&str>,
    ) -> Result<(StatusCode, Option<String>, Envelope), IncusError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(%method, path, "request to Incus");
        let method_name = method.clone();
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(timeout);
        if let Some(b) = body {
            req = req.json(b);
        }
        if let Some(tag) = if_match {
            req = req.header(reqwest::header::IF_MATCH, tag);
        }
        let transport = |e: reqwest::Error| {
            IncusError::Transport(Unreachable::from_error(&self.socket, &e, timeout))
        };
        let resp = req.send().await;
        self.count(&method_name, path, resp.as_ref().ok().map(|r| r.status()));
        let resp = resp.map_err(transport)?;
        let status = resp.status();
        let etag = resp
            .headers()
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = read_body(resp).await.map_err(transport)?;
        let env = Envelope::read(body).map_err(|e| IncusError::Decode {
            what: what.to_owned(),
            message: incus_text(&format!("{e} (HTTP {status})")),
        })?;
        if !status.is_success() || env.kind == "error" {
            return Err(IncusError::Api {
                what: what.to_owned(),
                status: status.as_u16(),
                message: if env.error.is_empty() {
                    status.to_string()
                } else {
                    incus_text(&env.error)
                },
            });
        }
        Ok((status, etag, env))
    }

    async fn get_json<T: DeserializeOwned>(&self, path: &str, what: &str) -> Result<T, IncusError> {
        let (_, env) = self
            .send(Method::GET, path, None, self.timeout, what)
            .await?;
        env.metadata().map_err(|e| IncusError::Decode {
            what: what.to_owned(),
            message: incus_text(&e.to_string()),
        })
    }

    /// Sends a request that starts an operation and waits for it to end, at most `wait`.
    async fn operation(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        what: &str,
        wait: Duration,
    ) -> Result<(), IncusError> {
        self.operation_result(method, path, body, what, wait)
            .await
            .map(drop)
    }

    /// Like [`Client::operation`], returning the ended operation's own `metadata`. An
    /// operation still running when the wait ends is [`IncusError::Unfinished`].
    async fn operation_result(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        what: &str,
        wait: Duration,
    ) -> Result<Value, IncusError> {
        let (_, env) = self.send(method, path, body, self.timeout, what).await?;
        if env.kind != "async" || env.operation.is_empty() {
            return Ok(Value::Null);
        }
        let secs = wait.as_secs().max(1);
        let wait_for = wait_path(&env.operation, secs);
        let (_, done) = self
            .send(
                Method::GET,
                &wait_for,
                None,
                Duration::from_secs(secs) + Duration::from_secs(5),
                what,
            )
            .await
            .map_err(|e| match e {
                IncusError::Api { message, .. } => IncusError::Operation {
                    what: what.to_owned(),
                    message,
                },
                other => other,
            })?;
        // `/wait` answers 200 whatever happened: the operation's own status tells.
        let done: Value = done.metadata().unwrap_or(Value::Null);
        let status = done.get("status").and_then(Value::as_str).unwrap_or("");
        if status == "Success" {
            return Ok(done.get("metadata").cloned().unwrap_or(Value::Null));
        }
        if matches!(status, "Running" | "Pending" | "Cancelling") {
            return Err(IncusError::Unfinished {
                what: what.to_owned(),
                status: status.to_lowercase(),
                waited: Duration::from_secs(secs),
            });
        }
        let err = done.get("err").and_then(Value::as_str).unwrap_or("");
        Err(IncusError::Operation {
            what: what.to_owned(),
            message: if err.is_empty() {
                format!("operation ended as {status:?}")
            } else {
                incus_text(err)
            },
        })
    }
}

/// Text from Incus (an error message, what could not be decoded in its answer) as the daemon's
/// messages carry it: without control characters, which could otherwise end `STATUS=` early
/// and start another assignment, or draw on a terminal.
fn incus_text(text: &str) -> String {
    printable(text).into_owned()
}

/// The `/wait` of an operation whose URL is `operation`, which may carry a query of its own
/// (`/1.0/operations/ID?project=P` on a cluster): `/1.0/operations/ID/wait?timeout=S&project=P`.
fn wait_path(operation: &str, secs: u64) -> String {
    match operation.split_once('?') {
        Some((path, query)) => format!("{path}/wait?timeout={secs}&{query}"),
        None => format!("{operation}/wait?timeout={secs}"),
    }
}

/// Percent-encodes a query value (our names are `[A-Za-z0-9._-]`; this covers the rest).
fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Client {
    /// Sends a GET whose successful answer is plain text rather than an envelope
    /// (`/1.0/metrics`); an error still comes as an envelope, read for its message.
    async fn get_text(&self, path: &str, what: &str) -> Result<String, IncusError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(path, "request to Incus");
        let transport = |e: reqwest::Error| {
            IncusError::Transport(Unreachable::from_error(&self.socket, &e, self.timeout))
        };
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .timeout(self.timeout)
            .send()
            .await;
        self.count(&Method::GET, path, resp.as_ref().ok().map(|r| r.status()));
        let resp = resp.map_err(transport)?;
        let status = resp.status();
        let bytes = read_body(resp).await.map_err(transport)?;
        if status.is_success() {
            return String::from_utf8(bytes).map_err(|e| IncusError::Decode {
                what: what.to_owned(),
                message: e.to_string(),
            });
        }
        let message = serde_json::from_slice::<Head<'_>>(&bytes)
            .ok()
            .map(|env| incus_text(&env.error))
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| status.to_string());
        Err(IncusError::Api {
            what: what.to_owned(),
            status: status.as_u16(),
            message,
        })
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
