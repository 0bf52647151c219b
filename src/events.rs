//! Incus lifecycle events: they keep the informer's cache ([`crate::informer`]) current, and
//! when an instance stops, is paused, renamed, updated (detached) or deleted they wake the groups
//! of its project at once instead of at their next interval. Events only wake the loop up; what
//! to do is still decided from an observation, and if the event stream is down the interval
//! alone keeps everything converging. Every (re)connection of the stream says that Incus answers
//! again, and that events may have been missed (the cache lists again). The websocket is
//! pinged, and given up when it stays silent ([`live`]): a half-open connection is followed
//! again from a new one, and the cache listed again, within [`SILENT_MAX`].
//!
//! The events are taken in by one task, their reads queued per instance ([`queue`]), so that a
//! storm of events grows neither tasks nor memory.
//!
//! Only `type=lifecycle` is followed: with `operation` events followed as well, about half of
//! the container starts running beside the daemon stalled here on Incus 6.0.4 (`forkstart`
//! hung until its 90 s timeout); with lifecycle events only, none did.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::stream::{BoxStream, FuturesUnordered};
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::{sleep_until, Instant};

use crate::daemon::{Event, WAIT_MAX};
use crate::incus::tls::Tls;
use crate::incus::{Endpoint, Incus, Unreachable};
pub use crate::informer::Lifecycle;
use crate::informer::{Store, READS_AT_ONCE};
use crate::reconciler::backoff;

mod live;
pub mod queue;
pub use live::{PING_EVERY, SILENT_MAX};
use queue::{Key, Queue, PENDING_MAX};

/// The lifecycle actions that can leave a group short of instances.
pub const TRIGGERS: &[&str] = &[
    "instance-stopped",
    "instance-shutdown",
    "instance-deleted",
    "instance-paused",
    "instance-renamed",
    "instance-updated",
];

#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    project: String,
    #[serde(default)]
    metadata: Metadata,
}

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    /// `instance-started`…
    #[serde(default)]
    action: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    project: String,
    #[serde(default)]
    context: Context,
}

#[derive(Debug, Default, Deserialize)]
struct Context {
    /// The name before a rename.
    #[serde(default)]
    old_name: String,
}

/// The lifecycle event a raw message is, when it is about an instance.
pub fn parse(message: &str) -> Option<Lifecycle> {
    let env: Envelope = serde_json::from_str(message).ok()?;
    if env.kind != "lifecycle" || !env.metadata.action.starts_with("instance-") {
        return None;
    }
    let project = [env.metadata.project, env.project]
        .into_iter()
        .find(|p| !p.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    let old = env.metadata.context.old_name;
    Some(Lifecycle {
        project,
        action: env.metadata.action,
        name: env.metadata.name,
        old_name: (!old.is_empty()).then_some(old),
    })
}

/// The (project, instance) an event is about, when it should wake groups up. A rename takes
/// the instance away from its group under its old name.
pub fn wakes(ev: &Lifecycle) -> Option<(String, String)> {
    TRIGGERS.contains(&ev.action.as_str()).then(|| {
        let name = ev.old_name.clone().unwrap_or_else(|| ev.name.clone());
        (ev.project.clone(), name)
    })
}

/// The (project, instance) a raw event message is about, when it should wake groups up.
pub fn trigger(message: &str) -> Option<(String, String)> {
    wakes(&parse(message)?)
}

/// A stream of lifecycle events, until it ends or fails.
pub type EventStream = BoxStream<'static, Result<Lifecycle, String>>;

/// Where lifecycle events come from: Incus' `/1.0/events` (in tests, a fake).
#[async_trait]
pub trait EventSource: Send + Sync {
    /// Connects and starts following.
    async fn connect(&self) -> Result<EventStream, String>;
}

/// What `/1.0/events` is asked for.
const EVENTS_PATH: &str = "/1.0/events?type=lifecycle&all-projects=true";

/// `/1.0/events` as a websocket, over the Incus unix socket or over HTTPS (wss, with the
/// client certificate). A cluster member forwards the events of every member.
pub struct IncusEvents {
    endpoint: Endpoint,
    tls: Option<Tls>,
}

/// The event source of the unix socket (the same type).
pub type UnixEvents = IncusEvents;

impl IncusEvents {
    /// Events from the unix socket at `socket`.
    pub fn new(socket: &str) -> Self {
        Self::at(Endpoint::Unix(socket.into()), None)
    }

    /// Events from `endpoint`, with `tls` over HTTPS.
    pub fn at(endpoint: Endpoint, tls: Option<Tls>) -> Self {
        Self { endpoint, tls }
    }
}

#[async_trait]
impl EventSource for IncusEvents {
    async fn connect(&self) -> Result<EventStream, String> {
        // A connection that goes silent while it is being set up is given up as well.
        tokio::time::timeout(SILENT_MAX, self.open())
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "{}: no answer to the event stream's upgrade within {}",
                    self.endpoint,
                    humantime::format_duration(SILENT_MAX)
                ))
            })
    }
}

impl IncusEvents {
    /// Connects, upgrades to a websocket and follows it, pinged (see [`live`]).
    async fn open(&self) -> Result<EventStream, String> {
        let place = self.endpoint.to_string();
        match (&self.endpoint, &self.tls) {
            (Endpoint::Unix(socket), _) => {
                let unix = UnixStream::connect(socket)
                    .await
                    .map_err(|e| Unreachable::from_io(&place, &e).to_string())?;
                let url = format!("ws://incus{EVENTS_PATH}");
                let (ws, _) = tokio_tungstenite::client_async(url, unix)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(live::lifecycle(ws))
            }
            (Endpoint::Https { host, .. }, Some(tls)) => {
                let authority = self.endpoint.authority().unwrap_or_default();
                let tcp = TcpStream::connect(&authority)
                    .await
                    .map_err(|e| Unreachable::from_io(&place, &e).to_string())?;
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| format!("{host}: {e}"))?;
                let stream = tokio_rustls::TlsConnector::from(tls.config.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| {
                        Unreachable::from_error(&place, &e, std::time::Duration::ZERO).to_string()
                    })?;
                let url = format!("wss://{authority}{EVENTS_PATH}");
                let (ws, _) = tokio_tungstenite::client_async(url, stream)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(live::lifecycle(ws))
            }
            (Endpoint::Https { .. }, None) => {
                Err(format!("{place}: HTTPS needs a client certificate"))
            }
        }
    }
}

/// Follows the event source forever, reconnecting with backoff (at most [`WAIT_MAX`] apart),
/// and counts the reconnections in `reconnects`.
/// On every connection the cache is to be listed again and [`Event::IncusBack`] is sent; every
/// lifecycle event updates the cache, then sends [`Event::InstanceChanged`] when it may leave a
/// group short. One task does it all, whatever the rate of events: the reads they ask for wait
/// in a [`queue::Queue`] (one entry per instance, at most [`PENDING_MAX`]) and are made
/// [`READS_AT_ONCE`] at a time. When the stream ends, the reads not made yet are given up: the
/// cache is listed again and their groups woken.
pub async fn follow(
    source: Arc<dyn EventSource>,
    incus: Arc<dyn Incus>,
    store: Arc<Store>,
    events: UnboundedSender<Event>,
    reconnects: prometheus_client::metrics::counter::Counter,
) {
    let mut failures = 0;
    let mut ever = false;
    loop {
        let mut connected = false;
        let result = stream(source.as_ref(), &incus, &store, &events, &mut || {
            connected = true;
            if std::mem::replace(&mut ever, true) {
                reconnects.inc();
            }
        })
        .await;
        if events.is_closed() {
            return;
        }
        if connected {
            // It worked for a while: start the backoff (and the one log line) afresh.
            failures = 0;
        }
        if let Err(e) = result {
            if failures == 0 {
                tracing::info!(error = %e,
                    "Incus lifecycle events unavailable ({e}): relying on the interval, retrying");
            }
            failures += 1;
        }
        tokio::time::sleep(backoff(failures).min(WAIT_MAX)).await;
    }
}

async fn stream(
    source: &dyn EventSource,
    incus: &Arc<dyn Incus>,
    store: &Arc<Store>,
    events: &UnboundedSender<Event>,
    on_connect: &mut (dyn FnMut() + Send),
) -> Result<(), String> {
    let mut stream = source.connect().await?;
    on_connect();
    // Events may have been missed while not following: list everything again.
    store.invalidate_all();
    if events.send(Event::IncusBack).is_err() {
        return Ok(());
    }
    tracing::debug!("following Incus lifecycle events");
    let wake = |(project, name): Key| {
        let _ = events.send(Event::InstanceChanged { project, name });
    };
    // The stream is never left unread while instances are read: this one task takes each
    // event in and queues the read it asks for (one per instance, see `queue`), and makes at
    // most READS_AT_ONCE of them at a time, waking their groups once each is done.
    let mut queue = Queue::default();
    let mut reads = FuturesUnordered::new();
    let mut flying: HashMap<u64, BTreeSet<Key>> = HashMap::new();
    let mut started = 0u64;
    let mut overflowed = false;
    let end = loop {
        while reads.len() < READS_AT_ONCE {
            let Some(work) = queue.take(Instant::now()) else {
                break;
            };
            started += 1;
            let id = started;
            flying.insert(id, work.wakes);
            let (project, name) = work.key;
            reads.push(async move {
                store
                    .read_event(incus.as_ref(), &project, &name, work.read)
                    .await;
                id
            });
        }
        let due = queue.next_due().filter(|_| reads.len() < READS_AT_ONCE);
        tokio::select! {
            ev = stream.next() => {
                let ev = match ev {
                    Some(Ok(ev)) => ev,
                    Some(Err(e)) => break Err(e),
                    None => break Err("the event stream ended".to_owned()),
                };
                if events.is_closed() {
                    return Ok(());
                }
                tracing::debug!(action = %ev.action, instance = %ev.name, project = %ev.project,
                    "Incus event {} {}", ev.action, ev.name);
                let Some(read) = store.intake(&ev) else {
                    if let Some(w) = wakes(&ev) {
                        wake(w);
                    }
                    continue;
                };
                let key = (ev.project.clone(), ev.name.clone());
                if let Err(overflow) = queue.push(key, read, wakes(&ev), Instant::now()) {
                    // Faster than it can be read: a listing is one request per project.
                    if !std::mem::replace(&mut overflowed, true) {
                        tracing::warn!(
                            "more than {PENDING_MAX} instances with Incus events waiting to be \
                             read: listing them again instead"
                        );
                    }
                    store.invalidate_all();
                    overflow.wakes.into_iter().for_each(wake);
                }
            }
            Some(id) = reads.next(), if !reads.is_empty() => {
                flying.remove(&id).into_iter().flatten().for_each(wake);
            }
            () = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {}
        }
    };
    // What was not read: listed again at the next pass, to which its groups are woken now.
    drop(reads);
    store.invalidate_all();
    flying.into_values().flatten().for_each(wake);
    queue.drain().into_iter().for_each(wake);
    end
}

#[cfg(test)]
mod tests {
    use super::trigger;

    #[test]
    fn stopped_and_deleted_instances_are_triggers() {
        let ev = |action: &str, project: &str| {
            format!(
                r#"{{"location":"none","metadata":{{"action":"{action}","name":"web-a","project":"{project}","source":"/1.0/instances/web-a"}},"project":"{project}","type":"lifecycle"}}"#
            )
        };
        let it = |p: &str| Some((p.to_owned(), "web-a".to_owned()));
        assert_eq!(trigger(&ev("instance-deleted", "default")), it("default"));
        assert_eq!(trigger(&ev("instance-stopped", "staging")), it("staging"));
        assert_eq!(trigger(&ev("instance-shutdown", "default")), it("default"));
        assert_eq!(trigger(&ev("instance-paused", "default")), it("default"));
        assert_eq!(trigger(&ev("instance-updated", "default")), it("default"));
        assert_eq!(trigger(&ev("instance-created", "default")), None);
        assert_eq!(trigger(&ev("instance-started", "default")), None);
        assert_eq!(trigger(r#"{"type":"logging","metadata":{}}"#), None);
        let renamed = r#"{"metadata":{"action":"instance-renamed","name":"x-b","context":{"old_name":"web-a"}},"project":"default","type":"lifecycle"}"#;
        assert_eq!(trigger(renamed), it("default"));
    }
}
