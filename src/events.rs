//! Incus lifecycle events as reconcile triggers: when an instance stops, is paused, renamed,
//! updated (detached) or deleted, the groups of its project are reconciled at once instead of at
//! their next interval. Events only wake the loop up; what to do is still decided from a fresh
//! observation, and if the event stream is down the interval alone keeps everything converging.
//! Every (re)connection of the stream says that Incus answers again.

use futures_util::StreamExt;
use serde::Deserialize;
use tokio::net::UnixStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio_tungstenite::tungstenite::Message;

use crate::daemon::{Event, WAIT_MAX};
use crate::incus::Unreachable;
use crate::reconciler::backoff;

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
    metadata: Lifecycle,
}

#[derive(Debug, Default, Deserialize)]
struct Lifecycle {
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

/// The (project, instance) a raw event message is about, when it should wake groups up.
pub fn trigger(message: &str) -> Option<(String, String)> {
    let env: Envelope = serde_json::from_str(message).ok()?;
    if env.kind != "lifecycle" || !TRIGGERS.contains(&env.metadata.action.as_str()) {
        return None;
    }
    let project = if env.metadata.project.is_empty() {
        env.project
    } else {
        env.metadata.project
    };
    let project = if project.is_empty() {
        "default".to_owned()
    } else {
        project
    };
    // A rename takes the instance away from the group under its old name.
    let name = if env.metadata.context.old_name.is_empty() {
        env.metadata.name
    } else {
        env.metadata.context.old_name
    };
    Some((project, name))
}

/// Follows `/1.0/events` over the unix socket forever, reconnecting with backoff (at most
/// [`WAIT_MAX`] apart), sends [`Event::IncusBack`] on every connection and
/// [`Event::InstanceChanged`] for every triggering lifecycle event.
pub async fn follow(socket: String, events: UnboundedSender<Event>) {
    let mut failures = 0;
    loop {
        let mut connected = false;
        let result = stream(&socket, &events, &mut connected).await;
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
    socket: &str,
    events: &UnboundedSender<Event>,
    connected: &mut bool,
) -> Result<(), String> {
    let unix = UnixStream::connect(socket)
        .await
        .map_err(|e| Unreachable::from_io(socket, &e).to_string())?;
    let url = "ws://incus/1.0/events?type=lifecycle&all-projects=true";
    let (mut ws, _) = tokio_tungstenite::client_async(url, unix)
        .await
        .map_err(|e| e.to_string())?;
    *connected = true;
    if events.send(Event::IncusBack).is_err() {
        return Ok(());
    }
    tracing::debug!("following Incus lifecycle events");
    // Reading continuously also answers the server's pings (tungstenite queues the pongs).
    while let Some(msg) = ws.next().await {
        match msg.map_err(|e| e.to_string())? {
            Message::Text(text) => {
                if let Some((project, name)) = trigger(text.as_str()) {
                    if events
                        .send(Event::InstanceChanged { project, name })
                        .is_err()
                    {
                        return Ok(());
                    }
                }
            }
            Message::Close(_) => return Err("closed by Incus".into()),
            _ => {}
        }
    }
    Err("the event stream ended".into())
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
        assert_eq!(trigger("not json"), None);
    }
}
