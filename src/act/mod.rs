//! Act: carries out a [`Plan`](crate::model::Plan)'s steps against Incus, a bounded number at a
//! time (`[daemon] max_parallel_actions`), and reports each outcome. It never decides; it only
//! refuses what a fresh read shows it must not do, and stops when its lease runs out. What it
//! did is written into the informer's cache at once (from a fresh read), so the next pass never
//! sees the world as it was before the action. The steps themselves are in [`steps`].
//!
//! - **Fresh reads decide**: every start, promotion and removal reads the instance right
//!   before it acts, and refuses an instance that is no longer the group's own (and a removal,
//!   one that a person protected meanwhile), whatever the cache said. A removal reads it again
//!   before each step that takes it further out of service (the stop after a drain, the delete
//!   after a stop): minutes can pass in between.
//! - **Fenced**: the lease is asked again right before every step that changes something
//!   (each creation, start, promotion's key and start, and a removal's drain, stop, forced
//!   stop and delete): a daemon whose lease ran out mid-removal stops there.
//! - **A slow creation is never undone**: when Incus does not say how a creation ended (its
//!   wait timed out, the connection dropped), the instance, if it is the one this request
//!   made, is left as it is and counted by the next pass. Only a creation that Incus reports
//!   failed is cleaned up.
//! - **Shutdown**: no new action starts, a drain in flight is cut short, the rest completes
//!   (the daemon's loop bounds how long it waits for it, see `crate::daemon`).

mod steps;

use std::collections::HashMap;

use futures_util::stream::{FuturesUnordered, StreamExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::decide::owner_value;
use crate::incus::{CreateInstance, ImageSource, Incus, IncusError};
use crate::informer::Store;
use crate::model::{Action, Cause, GroupSpec, GROUP_KEY, OWNER_KEY, UUID_KEY, WARM_KEY};

/// Why one action did not do what it was for.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    #[error(transparent)]
    Incus(#[from] IncusError),
    /// A fresh read showed it must not be done.
    #[error("refused to {action} {name}: {why}")]
    Refused {
        action: &'static str,
        name: String,
        why: String,
    },
    /// The daemon's lease of the group ran out before this step.
    #[error("stopped before {step}: this daemon's lease of the group ran out")]
    LeaseLost { step: String },
    /// A removal held: the set without the instance could not be published (the endpoints
    /// command failed or did not end in time), so it stays in service and is tried again at
    /// a later pass.
    #[error(
        "held the removal of {name}: {why}; it stays in the endpoints and is tried again later"
    )]
    Held { name: String, why: String },
}

impl ActError {
    /// True when Incus could not be reached.
    pub fn is_transport(&self) -> bool {
        matches!(self, ActError::Incus(e) if e.is_transport())
    }
}

/// How an action that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// It did what it was for.
    Finished,
    /// A creation Incus did not say the end of: the instance is there, the daemon's own, and
    /// left to Incus (see the module's header).
    StillRunning,
}

/// What was done for one action.
#[derive(Debug)]
pub struct Outcome {
    pub action: &'static str,
    /// How long it took.
    pub took: Duration,
    pub instance: String,
    pub cause: Cause,
    pub result: Result<Done, ActError>,
}

/// What one [`apply`] did.
#[derive(Debug, Default)]
pub struct Applied {
    /// One per action started, in the order they ended.
    pub outcomes: Vec<Outcome>,
    /// Actions not started because the lease ran out (the group is looked at again at once).
    pub fenced: usize,
}

/// Set when the daemon shuts down: no new action starts, and a drain in flight is cut short.
#[derive(Debug, Default)]
pub struct Shutdown {
    set: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Shutdown {
    /// The daemon is shutting down.
    pub fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Returns once the daemon shuts down.
    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

/// Whether the daemon may still act on the group (it holds the group's lease): asked before
/// every step that changes something.
pub type Fence<'a> = &'a (dyn Fn() -> bool + Sync);

/// What every action of one [`apply`] works with.
pub struct Ctx<'a> {
    pub incus: &'a dyn Incus,
    pub store: &'a Store,
    pub spec: &'a GroupSpec,
    pub shutdown: &'a Shutdown,
    pub fence: Fence<'a>,
    /// The group's endpoints: a removal takes its instance out of the set first (`None`:
    /// nothing is published, as in a look taken once).
    pub endpoints: Option<&'a crate::endpoints::Publisher>,
    /// The readiness board: a removal marks its instance as leaving there before it drains
    /// and stops it, so that its checks stop (`None`: nothing is checked).
    pub ready: Option<&'a crate::ready::Board>,
    /// Held for reading by each action that creates, starts or promotes an instance, while it
    /// runs: the daemon's lease writes take it for writing ([`crate::lease::Leases::quiet`]),
    /// so that no lease (a profile) is written beside a start, which can stall it on Incus 6.0.
    /// A round waiting to write holds back the next such action until the ones in flight are
    /// done (`None`: nothing to wait for).
    pub quiet: Option<&'a tokio::sync::RwLock<()>>,
}

impl Ctx<'_> {
    /// `Err` when the lease ran out before `step`.
    fn fenced(&self, step: impl FnOnce() -> String) -> Result<(), ActError> {
        if (self.fence)() {
            Ok(())
        } else {
            Err(ActError::LeaseLost { step: step() })
        }
    }
}

/// Runs the actions in their order, at most `parallel` at a time, one phase after the other:
/// what brings instances up (starts, promotions, creations), then removals, then the warm
/// pool's refills. On Incus 6.0 a start that runs beside a forced stop or a delete can stall
/// until the 90 s start timeout (and stall the next starts with it), so the phases never
/// overlap. Once shutting down or once an action has failed (the next pass looks again:
/// acting on after a failure could compound it), no new action starts; the ones in flight
/// always complete. Nor does one start once the lease ran out: those are counted in
/// [`Applied::fenced`].
pub async fn apply(ctx: &Ctx<'_>, actions: &[Action], parallel: usize) -> Applied {
    let mut pending = actions.iter().peekable();
    let mut running = FuturesUnordered::new();
    let mut phase = None;
    let mut failed = false;
    let mut lost = false;
    let mut applied = Applied::default();
    loop {
        while running.len() < parallel.max(1) && !failed && !lost && !ctx.shutdown.is_set() {
            let Some(action) = pending.peek() else {
                break;
            };
            if phase.is_some_and(|p| p != action.phase()) && !running.is_empty() {
                break;
            }
            if !(ctx.fence)() {
                applied.fenced = pending.len();
                lost = true;
                break;
            }
            phase = Some(action.phase());
            running.push(run(ctx, action));
            pending.next();
        }
        let Some(outcome) = running.next().await else {
            break;
        };
        failed |= outcome.result.is_err();
        applied.outcomes.push(outcome);
    }
    applied
}

/// Carries out one action and logs its outcome.
async fn run(ctx: &Ctx<'_>, action: &Action) -> Outcome {
    let spec = ctx.spec;
    let (kind, instance) = match action {
        Action::Create { .. } => ("create", new_name(&spec.instance_prefix)),
        Action::CreateWarm { .. } => ("create-warm", new_name(&spec.instance_prefix)),
        Action::Start { name, .. } => ("start", name.clone()),
        Action::Promote { name, .. } => ("promote", name.clone()),
        Action::Remove { name, .. } => ("delete", name.clone()),
    };
    // Not beside a lease write (see `Ctx::quiet`): a removal starts nothing, and its drain can
    // last minutes.
    let quiet = match ctx.quiet {
        Some(lock) if !matches!(action, Action::Remove { .. }) => Some(lock.read().await),
        _ => None,
    };
    // The lease was asked when the action was taken up (`apply`), but a lease round may have
    // run since: a creation is one request, asked again here (the other steps ask themselves).
    let creates = matches!(action, Action::Create { .. } | Action::CreateWarm { .. });
    let lost = match quiet {
        Some(_) if creates => ctx.fenced(|| format!("creating {instance}")).err(),
        _ => None,
    };
    let t0 = tokio::time::Instant::now();
    let result = match lost {
        Some(lost) => Err(lost),
        None => {
            // Events about the instance are not read while the daemon works on it (it reads
            // the result itself; a read during a start can stall it on Incus 6.0).
            ctx.store.begin(&spec.project, &instance);
            let result = match action {
                Action::Create { target, .. } => {
                    steps::create_as(ctx, &instance, false, target.as_deref()).await
                }
                Action::CreateWarm { target } => {
                    steps::create_as(ctx, &instance, true, target.as_deref()).await
                }
                Action::Start { .. } => steps::start(ctx, &instance).await.map(|()| Done::Finished),
                Action::Promote { .. } => steps::promote(ctx, &instance)
                    .await
                    .map(|()| Done::Finished),
                Action::Remove { .. } => {
                    steps::remove(ctx, &instance).await.map(|()| Done::Finished)
                }
            };
            ctx.store.end(ctx.incus, &spec.project, &instance).await;
            result
        }
    };
    drop(quiet);
    let cause = action.cause();
    match &result {
        Ok(Done::Finished) => tracing::info!(
            group = %spec.name, instance = %instance, action = kind, reason = cause.as_str(),
            outcome = "ok", "{} {instance} ({cause})", past(kind)
        ),
        Ok(Done::StillRunning) => tracing::warn!(
            group = %spec.name, instance = %instance, action = kind, reason = cause.as_str(),
            outcome = "pending",
            "Incus has not said how the creation of {instance} ended ({cause}): it is the \
             daemon's own and left as it is (a large image may still be unpacking); the next \
             pass counts it"
        ),
        Err(e) => tracing::warn!(
            group = %spec.name, instance = %instance, action = kind, reason = cause.as_str(),
            outcome = "failed", error = %e, "could not {kind} {instance} ({cause}): {e}"
        ),
    }
    Outcome {
        took: t0.elapsed(),
        action: kind,
        instance,
        cause,
        result,
    }
}

fn past(action: &str) -> &'static str {
    match action {
        "create" => "created",
        "create-warm" => "created (warm pool)",
        "start" => "started",
        "promote" => "started (from the warm pool)",
        _ => "deleted",
    }
}

/// `prefix` + 6 random lowercase letters and digits.
pub fn new_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let suffix: String = (0..crate::config::SUFFIX_LEN)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{suffix}")
}

/// A random (version 4) UUID, the `volatile.uuid` a new instance is given.
pub fn new_uuid() -> String {
    let b: [u8; 16] = std::array::from_fn(|i| match i {
        6 => 0x40 | (fastrand::u8(..) & 0x0f),
        8 => 0x80 | (fastrand::u8(..) & 0x3f),
        _ => fastrand::u8(..),
    });
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The body of the request that creates `name` for the group, with its identity `uuid`:
/// started, or stopped in the warm pool.
pub fn create_request(spec: &GroupSpec, name: &str, uuid: &str, warm: bool) -> CreateInstance {
    let mut config: HashMap<String, String> = spec.config.clone().into_iter().collect();
    config.insert(GROUP_KEY.to_owned(), spec.name.to_string());
    config.insert(OWNER_KEY.to_owned(), owner_value(&spec.project, name, uuid));
    config.insert(UUID_KEY.to_owned(), uuid.to_owned());
    if warm {
        config.insert(WARM_KEY.to_owned(), "true".to_owned());
    }
    CreateInstance {
        name: name.to_owned(),
        kind: "container".into(),
        source: ImageSource::local(&spec.image),
        config,
        profiles: spec.profiles.clone(),
        start: !warm,
        target: spec.target.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_version_4() {
        let u = new_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
        assert_ne!(u, new_uuid());
    }

    #[tokio::test]
    async fn a_shutdown_wakes_whoever_waits_for_it() {
        let s = std::sync::Arc::new(Shutdown::default());
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!s.is_set());
        s.set();
        waiter.await.unwrap();
        // Set already: returns at once.
        s.wait().await;
    }
}
