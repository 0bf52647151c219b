//! Liveness of Incus' event websocket: the daemon pings it every [`PING_EVERY`] and takes it
//! for dead when nothing at all (an event, a pong, a ping) was read from it for
//! [`SILENT_MAX`]. A half-open connection (the peer gone without a FIN, a proxy that stopped
//! forwarding) then ends the stream with an error, so that [`super::follow`] reconnects and the
//! cache is listed again, instead of the cache staying stale until the next resync.
//!
//! This applies to the real websocket only: the event sources of the tests end in their own
//! ways.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::{parse, EventStream, Lifecycle};

/// How often the daemon pings the event stream (Incus answers with a pong, which counts as a
/// sign of life when no event comes).
pub const PING_EVERY: Duration = Duration::from_secs(10);

/// How long the event stream may stay silent (no event, no pong, no ping read) before it is
/// given up and followed again from a new connection: two and a half pings, so one lost pong
/// is not enough to give it up, and short enough that the reconnection (2 s later) and the
/// listing that follows it leave the cache fresh again within 30 s. Connecting (the upgrade,
/// and TLS over HTTPS) must be done within it too.
pub const SILENT_MAX: Duration = Duration::from_secs(25);

/// The lifecycle events of an open websocket, pinged every [`PING_EVERY`]; the stream ends with
/// an error once nothing was read for [`SILENT_MAX`].
pub fn lifecycle<S>(ws: WebSocketStream<S>) -> EventStream
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let now = Instant::now();
    let watch = Watch {
        ws,
        heard: now,
        ping: now + PING_EVERY,
        over: false,
    };
    futures_util::stream::unfold(watch, |mut w| async move {
        if w.over {
            return None;
        }
        let next = w.next().await;
        // After an error the connection is of no more use: the stream ends.
        w.over = !matches!(next, Some(Ok(_)));
        next.map(|item| (item, w))
    })
    .boxed()
}

/// The error the stream ends with when it stayed silent.
fn silent() -> String {
    format!(
        "no sign of life from the event stream for {} (pinged every {}): giving it up",
        humantime::format_duration(SILENT_MAX),
        humantime::format_duration(PING_EVERY)
    )
}

/// A websocket being followed, and when it was last heard and is next pinged.
struct Watch<S> {
    ws: WebSocketStream<S>,
    heard: Instant,
    ping: Instant,
    over: bool,
}

impl<S> Watch<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    /// The next lifecycle event; `None` when the connection ended, an error when it failed or
    /// stayed silent too long.
    async fn next(&mut self) -> Option<Result<Lifecycle, String>> {
        loop {
            let deadline = self.heard + SILENT_MAX;
            tokio::select! {
                msg = self.ws.next() => {
                    self.heard = Instant::now();
                    match msg? {
                        Ok(Message::Text(text)) => {
                            if let Some(ev) = parse(text.as_str()) {
                                return Some(Ok(ev));
                            }
                        }
                        Ok(Message::Close(_)) => return Some(Err("closed by Incus".to_owned())),
                        // Pongs, and pings: reading on answers them (tungstenite queues the pong
                        // and sends it with the next read).
                        Ok(_) => {}
                        Err(e) => return Some(Err(e.to_string())),
                    }
                }
                () = sleep_until(self.ping) => {
                    self.ping = Instant::now() + PING_EVERY;
                    // A peer that reads nothing any more must not hold the deadline up.
                    let ping = self.ws.send(Message::Ping(Default::default()));
                    match timeout_at(deadline, ping).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Some(Err(e.to_string())),
                        Err(_) => return Some(Err(silent())),
                    }
                }
                () = sleep_until(deadline) => return Some(Err(silent())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::DuplexStream;
    use tokio::time::{timeout, Instant};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::WebSocketStream;

    use super::*;

    const EVENT: &str = r#"{"metadata":{"action":"instance-stopped","name":"web-a","project":"default"},"project":"default","type":"lifecycle"}"#;

    /// A websocket client of an in-process server, which accepts and is handed to `serve`.
    async fn connect<F, Fut>(serve: F) -> WebSocketStream<DuplexStream>
    where
        F: FnOnce(WebSocketStream<DuplexStream>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let (client, server) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let ws = tokio_tungstenite::accept_async(server).await.unwrap();
            serve(ws).await;
        });
        let url = "ws://incus/1.0/events?type=lifecycle";
        tokio_tungstenite::client_async(url, client)
            .await
            .unwrap()
            .0
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_goes_silent_without_closing_ends_the_stream_by_the_deadline() {
        let ws = connect(|mut ws| async move {
            ws.send(Message::text(EVENT)).await.unwrap();
            // Silent and open: never reads (so never answers a ping), never closes.
            std::future::pending::<()>().await;
            drop(ws);
        })
        .await;
        let mut events = lifecycle(ws);
        let first = events.next().await.unwrap().unwrap();
        assert_eq!(first.name, "web-a");
        let heard = Instant::now();
        let end = timeout(SILENT_MAX + PING_EVERY, events.next())
            .await
            .expect("still following a silent stream after the deadline");
        let err = end.expect("an error, not a plain end").unwrap_err();
        assert!(err.contains("no sign of life"), "{err}");
        assert!(heard.elapsed() >= SILENT_MAX, "given up early");
        assert!(
            events.next().await.is_none(),
            "the stream ends after its error"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_answers_pings_stays_followed_past_the_deadline() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let ws = connect(|mut ws| async move {
            ws.send(Message::text(EVENT)).await.unwrap();
            // No event for a long while, but reading answers the pings.
            loop {
                tokio::select! {
                    msg = ws.next() => if !matches!(msg, Some(Ok(_))) { return },
                    Some(()) = rx.recv() => ws.send(Message::text(EVENT)).await.unwrap(),
                }
            }
        })
        .await;
        let mut events = lifecycle(ws);
        assert!(events.next().await.unwrap().is_ok());
        let quiet = timeout(SILENT_MAX * 3, events.next()).await;
        assert!(quiet.is_err(), "the stream ended: {:?}", quiet.unwrap());
        tx.send(()).unwrap();
        let later = events.next().await.unwrap().unwrap();
        assert_eq!(later.action, "instance-stopped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_from_the_peer_ends_the_stream_with_an_error() {
        let ws = connect(|mut ws| async move {
            ws.close(None).await.unwrap();
            while ws.next().await.is_some() {}
        })
        .await;
        let mut events = lifecycle(ws);
        let err = events.next().await.unwrap().unwrap_err();
        assert_eq!(err, "closed by Incus");
        assert!(events.next().await.is_none());
    }
}
