//! Act: carries out a [`Plan`]'s steps against Incus, a bounded number at a time
//! (`[daemon] max_parallel_actions`), and reports each outcome.
//! It never decides; it only refuses to touch an instance that is not (or no longer) the
//! group's own. What it did is written into the informer's cache at once (from a fresh read),
//! so the next pass never sees the world as it was before the action.
//!
//! - create: one request with image, profiles, config, the ownership keys and `start: true`.
//!   If it fails, what is left of it is removed only when it carries the identity given in that
//!   very request: an existing instance with the same name (a collision) is never touched. A
//!   created instance whose identity Incus did not keep is removed and reported as a failure;
//! - start: a stopped instance of the group; a failed start leaves it as it is (the decision
//!   core retries it with a backoff);
//! - remove: checks ownership again on a fresh read, runs the group's `drain_command` in it
//!   (within `drain_timeout`; a failed or timed-out drain still removes it), stops gracefully
//!   within the group's `stop_timeout`, then by force, then deletes.

use std::collections::HashMap;

use futures_util::stream::{FuturesUnordered, StreamExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::decide::owner_value;
use crate::incus::{CreateInstance, ImageSource, Incus, IncusError, StateChange};
use crate::informer::Store;
use crate::model::{
    Action, Cause, GroupSpec, InstanceStatus, GROUP_KEY, OWNER_KEY, UUID_KEY, WARM_KEY,
};
use crate::observe::is_owned;

/// What was done for one action.
#[derive(Debug)]
pub struct Outcome {
    pub action: &'static str,
    /// How long it took.
    pub took: Duration,
    pub instance: String,
    pub cause: Cause,
    pub result: Result<(), IncusError>,
}

/// Runs the actions in their order, at most `parallel` at a time, one phase after the other:
/// what brings instances up (starts, promotions, creations), then removals, then the warm
/// pool's refills. On Incus 6.0 a start that runs beside a forced stop or a delete can stall
/// until the 90 s start timeout (and stall the next starts with it), so the phases never
/// overlap. Once `stop` is set (a shutdown) or an action has failed (the next pass looks
/// again: acting on after a failure could compound it), no new action starts; the ones in
/// flight always complete.
pub async fn apply(
    incus: &dyn Incus,
    store: &Store,
    spec: &GroupSpec,
    actions: &[Action],
    stop: &AtomicBool,
    parallel: usize,
    until: Instant,
) -> Vec<Outcome> {
    let mut pending = actions.iter().peekable();
    let mut running = FuturesUnordered::new();
    let mut phase = None;
    let mut failed = false;
    let mut outcomes = Vec::new();
    loop {
        // No action starts past `until`, the end of the group's lease (less its margin).
        while running.len() < parallel.max(1)
            && !failed
            && !stop.load(Ordering::SeqCst)
            && Instant::now() < until
        {
            let Some(action) = pending.peek() else {
                break;
            };
            if phase.is_some_and(|p| p != action.phase()) && !running.is_empty() {
                break;
            }
            phase = Some(action.phase());
            running.push(run(incus, store, spec, action));
            pending.next();
        }
        let Some(outcome) = running.next().await else {
            break;
        };
        failed |= outcome.result.is_err();
        outcomes.push(outcome);
    }
    outcomes
}

/// Carries out one action and logs its outcome.
async fn run(incus: &dyn Incus, store: &Store, spec: &GroupSpec, action: &Action) -> Outcome {
    let (kind, instance) = match action {
        Action::Create { .. } => ("create", new_name(&spec.instance_prefix)),
        Action::CreateWarm => ("create-warm", new_name(&spec.instance_prefix)),
        Action::Start { name, .. } => ("start", name.clone()),
        Action::Promote { name, .. } => ("promote", name.clone()),
        Action::Remove { name, .. } => ("delete", name.clone()),
    };
    // Events about the instance are not read while the daemon works on it (it reads the
    // result itself; a read during a start can stall it on Incus 6.0).
    store.begin(&spec.project, &instance);
    let t0 = tokio::time::Instant::now();
    let result = match action {
        Action::Create { .. } => create_as(incus, store, spec, &instance, false).await,
        Action::CreateWarm => create_as(incus, store, spec, &instance, true).await,
        Action::Start { .. } => start(incus, store, spec, &instance).await,
        Action::Promote { .. } => promote(incus, store, spec, &instance).await,
        Action::Remove { .. } => remove(incus, store, spec, &instance).await,
    };
    store.end(incus, &spec.project, &instance).await;
    let cause = action.cause();
    match &result {
        Ok(()) => tracing::info!(
            group = %spec.name, instance = %instance, action = kind, reason = cause.as_str(),
            outcome = "ok", "{} {instance} ({cause})", past(kind)
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

/// Takes `name` out of the warm pool (its key set to `false`, so that it is an ordinary
/// instance of the group from now on, crash loops and all) and starts it.
async fn promote(
    incus: &dyn Incus,
    store: &Store,
    spec: &GroupSpec,
    name: &str,
) -> Result<(), IncusError> {
    let result = incus
        .set_config(&spec.project, name, WARM_KEY, "false")
        .await;
    if result.is_err() {
        store.refresh(incus, &spec.project, name).await;
        return result;
    }
    start(incus, store, spec, name).await
}

async fn create_as(
    incus: &dyn Incus,
    store: &Store,
    spec: &GroupSpec,
    name: &str,
    warm: bool,
) -> Result<(), IncusError> {
    let uuid = new_uuid();
    let req = create_request(spec, name, &uuid, warm);
    let mine = owner_value(&spec.project, name, &uuid);
    let result = incus.create(&spec.project, &req).await;
    // Whatever happened, the instance must now be ours as we made it, or gone.
    let ticket = store.ticket();
    let found = match incus.get(&spec.project, name).await {
        Ok(found) => found,
        Err(e) => {
            store.invalidate(&spec.project);
            return result.and(Err(e));
        }
    };
    store.put(&spec.project, name, ticket, found.clone());
    let Some(inst) = found else {
        return result.and(Err(IncusError::Operation {
            what: format!("creating {name}"),
            message: "Incus reported success but the instance does not exist".into(),
        }));
    };
    let made_here = inst.config.get(OWNER_KEY) == Some(&mine);
    if result.is_ok() && is_owned(&inst, spec) {
        return Ok(());
    }
    if !made_here {
        // Another instance by that name: not ours to clean up.
        return result.and(Err(IncusError::Operation {
            what: format!("creating {name}"),
            message: "another instance has that name".into(),
        }));
    }
    if let Err(e) = remove_instance(incus, store, spec, name, inst.status()).await {
        tracing::warn!(group = %spec.name, instance = name, error = %e,
            "could not remove {name}, which failed to come up: {e}");
    }
    result.and(Err(IncusError::Operation {
        what: format!("creating {name}"),
        message: format!(
            "Incus did not keep its identity ({UUID_KEY}): the group could not own it, so it \
             was removed"
        ),
    }))
}

/// Starts `name`; a start that fails because someone else started it meanwhile (an
/// `incus restart` in progress, say) is no failure: what matters is that it runs.
async fn start(
    incus: &dyn Incus,
    store: &Store,
    spec: &GroupSpec,
    name: &str,
) -> Result<(), IncusError> {
    let result = incus
        .change_state(&spec.project, name, StateChange::Start)
        .await;
    let ticket = store.ticket();
    match incus.get(&spec.project, name).await {
        Ok(found) => {
            let running = found.as_ref().is_some_and(|i| i.status().is_healthy());
            store.put(&spec.project, name, ticket, found);
            if running {
                return Ok(());
            }
        }
        Err(_) => store.invalidate(&spec.project),
    }
    result
}

/// Stops (gracefully, then by force) and deletes `name`, after checking on a fresh read that it
/// is still the group's own. An instance that is gone already counts as removed.
async fn remove(
    incus: &dyn Incus,
    store: &Store,
    spec: &GroupSpec,
    name: &str,
) -> Result<(), IncusError> {
    let ticket = store.ticket();
    let Some(inst) = incus.get(&spec.project, name).await? else {
        store.put(&spec.project, name, ticket, None);
        return Ok(());
    };
    if !is_owned(&inst, spec) {
        return Err(IncusError::Operation {
            what: format!("deleting {name}"),
            message: format!(
                "refused: it is not an instance incus-hpa created for {}",
                spec.name
            ),
        });
    }
    if inst.status().is_healthy() && !spec.drain_command.is_empty() {
        drain(incus, spec, name).await;
    }
    remove_instance(incus, store, spec, name, inst.status()).await
}

/// Runs the group's `drain_command` in `name` before its stop, within `drain_timeout`, and logs
/// how it went. Whatever happens, the removal goes on.
async fn drain(incus: &dyn Incus, spec: &GroupSpec, name: &str) {
    let t0 = std::time::Instant::now();
    let ran = tokio::time::timeout(
        spec.drain_timeout,
        incus.exec(&spec.project, name, &spec.drain_command),
    )
    .await;
    let took = format!("{:.1}s", t0.elapsed().as_secs_f64());
    let g = spec.name.as_str();
    match ran {
        Ok(Ok(0)) => tracing::info!(group = g, instance = name, action = "drain", outcome = "ok",
            exit = 0, duration = %took, "drained {name} in {took} (exit status 0)"),
        Ok(Ok(code)) => tracing::warn!(group = g, instance = name, action = "drain",
            outcome = "failed", exit = code, duration = %took,
            "the drain command in {name} exited {code} after {took}: removing it anyway"),
        Ok(Err(e)) => tracing::warn!(group = g, instance = name, action = "drain",
            outcome = "failed", error = %e, duration = %took,
            "the drain command could not run in {name} ({e}): removing it anyway"),
        Err(_) => tracing::warn!(group = g, instance = name, action = "drain",
            outcome = "timeout", duration = %took,
            "the drain command in {name} did not end within {}: removing it anyway",
            humantime::format_duration(spec.drain_timeout)),
    }
}

async fn remove_instance(
    incus: &dyn Incus,
    store: &Store,
    spec: &GroupSpec,
    name: &str,
    status: InstanceStatus,
) -> Result<(), IncusError> {
    if status != InstanceStatus::Stopped {
        // A frozen instance cannot stop gracefully (Incus thaws it and times out): force it.
        let graceful = !spec.stop_timeout.is_zero() && status != InstanceStatus::Frozen;
        let stopped = graceful
            && incus
                .change_state(
                    &spec.project,
                    name,
                    StateChange::Stop {
                        timeout: spec.stop_timeout,
                        force: false,
                    },
                )
                .await
                .is_ok();
        if !stopped {
            let force = StateChange::Stop {
                timeout: Duration::from_secs(30),
                force: true,
            };
            if let Err(e) = incus.change_state(&spec.project, name, force).await {
                // It may have stopped meanwhile; DELETE tells.
                tracing::debug!(instance = name, error = %e, "force stop failed");
            }
        }
    }
    let result = match incus.delete(&spec.project, name).await {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    };
    if result.is_ok() {
        store.put(&spec.project, name, store.ticket(), None);
    } else {
        store.refresh(incus, &spec.project, name).await;
    }
    result
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
}
