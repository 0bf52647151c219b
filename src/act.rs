//! Act: carries out a [`Plan`]'s steps against Incus, one at a time, and reports each outcome.
//! It never decides; it only refuses to touch an instance that is not (or no longer) managed.
//!
//! - create: one request with image, profiles, config and `start: true`; an instance whose start
//!   failed is removed, not left behind;
//! - start: a stopped managed instance; if it cannot start it is removed (a later reconcile
//!   replaces it);
//! - remove: graceful stop within the group's `stop_timeout`, then by force, then delete.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::incus::{CreateInstance, ImageSource, Incus, IncusError, StateChange};
use crate::model::{Action, GroupSpec, InstanceStatus, Plan, GROUP_KEY};
use crate::observe::is_managed_by;

/// What was done for one action.
#[derive(Debug)]
pub struct Outcome {
    pub action: &'static str,
    pub instance: String,
    pub result: Result<(), IncusError>,
}

/// Runs the plan's actions in order, stopping before the next one once `stop` is set
/// (the action in flight always completes).
pub async fn apply(
    incus: &dyn Incus,
    spec: &GroupSpec,
    plan: &Plan,
    stop: &AtomicBool,
) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for action in &plan.actions {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let outcome = match action {
            Action::Create => {
                let name = new_name(&spec.instance_prefix);
                let result = create(incus, spec, &name).await;
                Outcome {
                    action: "create",
                    instance: name,
                    result,
                }
            }
            Action::Start { name } => Outcome {
                action: "start",
                instance: name.clone(),
                result: start(incus, spec, name).await,
            },
            Action::Remove { name } => Outcome {
                action: "delete",
                instance: name.clone(),
                result: remove(incus, spec, name).await,
            },
        };
        let ok = outcome.result.is_ok();
        match &outcome.result {
            Ok(()) => tracing::info!(
                group = %spec.name, instance = %outcome.instance, action = outcome.action,
                outcome = "ok", "{} {}", past(outcome.action), outcome.instance
            ),
            Err(e) => tracing::warn!(
                group = %spec.name, instance = %outcome.instance, action = outcome.action,
                outcome = "failed", error = %e, "could not {} {}: {e}", outcome.action, outcome.instance
            ),
        }
        outcomes.push(outcome);
        if !ok {
            // The next reconcile looks again; acting on after a failure could compound it.
            break;
        }
    }
    outcomes
}

fn past(action: &str) -> &'static str {
    match action {
        "create" => "created",
        "start" => "started",
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

async fn create(incus: &dyn Incus, spec: &GroupSpec, name: &str) -> Result<(), IncusError> {
    let mut config: HashMap<String, String> = spec.config.clone().into_iter().collect();
    config.insert(GROUP_KEY.to_owned(), spec.name.to_string());
    let req = CreateInstance {
        name: name.to_owned(),
        kind: "container".into(),
        source: ImageSource::local(&spec.image),
        config,
        profiles: spec.profiles.clone(),
        start: true,
    };
    // Creation may have got as far as a stopped instance.
    let result = incus.create(&spec.project, &req).await;
    remove_if_failed(incus, spec, name, result).await
}

async fn start(incus: &dyn Incus, spec: &GroupSpec, name: &str) -> Result<(), IncusError> {
    let result = incus
        .change_state(&spec.project, name, StateChange::Start)
        .await;
    remove_if_failed(incus, spec, name, result).await
}

/// After a failed creation or start, removes what is left of `name` (if it is ours), so that no
/// broken instance stays behind; returns the original result.
async fn remove_if_failed(
    incus: &dyn Incus,
    spec: &GroupSpec,
    name: &str,
    result: Result<(), IncusError>,
) -> Result<(), IncusError> {
    if result.is_err() {
        if let Err(e) = remove(incus, spec, name).await {
            tracing::warn!(group = %spec.name, instance = name, error = %e,
                "could not remove {name}, which failed to come up: {e}");
        }
    }
    result
}

/// Stops (gracefully, then by force) and deletes `name`, after checking it is still managed.
/// An instance that is gone already counts as removed.
async fn remove(incus: &dyn Incus, spec: &GroupSpec, name: &str) -> Result<(), IncusError> {
    let Some(inst) = incus.get(&spec.project, name).await? else {
        return Ok(());
    };
    if !is_managed_by(&inst, spec.name.as_str()) {
        return Err(IncusError::Operation {
            what: format!("deleting {name}"),
            message: format!("refused: it does not carry {GROUP_KEY}={}", spec.name),
        });
    }
    if inst.status() != InstanceStatus::Stopped {
        let graceful = StateChange::Stop {
            timeout: spec.stop_timeout,
            force: false,
        };
        if spec.stop_timeout.is_zero()
            || incus
                .change_state(&spec.project, name, graceful)
                .await
                .is_err()
        {
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
    match incus.delete(&spec.project, name).await {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}
