//! The steps of each action, against Incus (see the parent module for the rules they keep):
//!
//! - create: one request with image, profiles, config, the ownership keys and `start: true`,
//!   on the member the decision placed it on (else the group's `target`).
//!   If Incus reports it failed, what is left of it is removed only when it carries the
//!   identity given in that very request: an existing instance with the same name (a
//!   collision) is never touched. A created instance whose identity Incus did not keep is
//!   removed and reported as a failure. A creation whose end Incus did not tell is left alone;
//! - start: a stopped instance of the group, still the group's own on a fresh read; a failed
//!   start leaves it as it is (the decision core retries it with a backoff);
//! - promote: the same, after its warm-pool key is set to `false`;
//! - remove: checks ownership and protection again on a fresh read, runs the group's
//!   `drain_command` in it (within `drain_timeout`, cut short by a shutdown; a failed or
//!   timed-out drain still removes it), stops gracefully within the group's `stop_timeout`,
//!   then by force, then deletes, asking the lease before each of these steps.

use std::time::Duration;

use super::{ActError, Ctx, Done};
use crate::decide::owner_value;
use crate::incus::{IncusError, Instance, StateChange};
use crate::model::{InstanceStatus, OWNER_KEY, PROTECTED_KEY, UUID_KEY, WARM_KEY};
use crate::observe::is_owned;

/// Reads `name` afresh (and writes what it found into the cache).
async fn fresh(ctx: &Ctx<'_>, name: &str) -> Result<Option<Instance>, ActError> {
    let project = &ctx.spec.project;
    let ticket = ctx.store.ticket();
    let found = ctx.incus.get(project, name).await?;
    ctx.store.put(project, name, ticket, found.clone());
    Ok(found)
}

/// `Ok` when the fresh read `found` is an instance the daemon created for the group.
fn owned<'i>(
    ctx: &Ctx<'_>,
    action: &'static str,
    name: &str,
    found: Option<&'i Instance>,
) -> Result<&'i Instance, ActError> {
    let refused = |why: String| ActError::Refused {
        action,
        name: name.to_owned(),
        why,
    };
    let inst = found.ok_or_else(|| refused("it no longer exists".into()))?;
    if !is_owned(inst, ctx.spec) {
        return Err(refused(format!(
            "it is not (or no longer) an instance incus-hpa created for {}",
            ctx.spec.name
        )));
    }
    Ok(inst)
}

/// Creates `name` for the group (stopped in the warm pool when `warm`), on the cluster member
/// `target` when the decision placed it (else where the group's `target` says).
pub(super) async fn create_as(
    ctx: &Ctx<'_>,
    name: &str,
    warm: bool,
    target: Option<&str>,
) -> Result<Done, ActError> {
    // The lease was asked right before (`apply`): a creation is one request.
    let (incus, store, spec) = (ctx.incus, ctx.store, ctx.spec);
    let uuid = super::new_uuid();
    let mut req = super::create_request(spec, name, &uuid, warm);
    if let Some(member) = target {
        req.target = Some(member.to_owned());
    }
    let mine = owner_value(&spec.project, name, &uuid);
    let result = incus.create(&spec.project, &req).await;
    let in_doubt = matches!(&result, Err(e) if e.is_in_doubt());
    // Whatever happened, the instance must now be ours as we made it, gone, or still being
    // made by Incus.
    let ticket = store.ticket();
    let found = match incus.get(&spec.project, name).await {
        Ok(found) => found,
        Err(e) => {
            store.invalidate(&spec.project);
            return Err(result.err().unwrap_or(e).into());
        }
    };
    store.put(&spec.project, name, ticket, found.clone());
    let Some(inst) = found else {
        return Err(match result {
            Err(e) => e.into(),
            Ok(()) => IncusError::Operation {
                what: format!("creating {name}"),
                message: "Incus reported success but the instance does not exist".into(),
            }
            .into(),
        });
    };
    let made_here = inst.config.get(OWNER_KEY) == Some(&mine);
    if result.is_ok() && is_owned(&inst, spec) {
        return Ok(Done::Finished);
    }
    if !made_here {
        // Another instance by that name: not ours to clean up.
        return Err(result
            .err()
            .unwrap_or_else(|| IncusError::Operation {
                what: format!("creating {name}"),
                message: "another instance has that name".into(),
            })
            .into());
    }
    if in_doubt {
        // Incus may still be unpacking the image: undoing it would keep the group from ever
        // growing on slow storage.
        return Ok(Done::StillRunning);
    }
    if let Err(e) = remove_instance(ctx, name, inst.status()).await {
        tracing::warn!(group = %spec.name, instance = name, error = %e,
            "could not remove {name}, which failed to come up: {e}");
    }
    Err(result
        .err()
        .unwrap_or_else(|| IncusError::Operation {
            what: format!("creating {name}"),
            message: format!(
                "Incus did not keep its identity ({UUID_KEY}): the group could not own it, so \
                 it was removed"
            ),
        })
        .into())
}

/// Starts `name`, still the group's own on a fresh read; one running already (a person or an
/// `incus restart` started it meanwhile) is no failure: what matters is that it runs.
pub(super) async fn start(ctx: &Ctx<'_>, name: &str) -> Result<(), ActError> {
    let found = fresh(ctx, name).await?;
    let inst = owned(ctx, "start", name, found.as_ref())?;
    if inst.status().is_healthy() {
        return Ok(());
    }
    start_read(ctx, name).await
}

/// Starts `name`, read afresh already.
async fn start_read(ctx: &Ctx<'_>, name: &str) -> Result<(), ActError> {
    let (incus, store, project) = (ctx.incus, ctx.store, &ctx.spec.project);
    ctx.fenced(|| format!("starting {name}"))?;
    let result = incus.change_state(project, name, StateChange::Start).await;
    let ticket = store.ticket();
    match incus.get(project, name).await {
        Ok(found) => {
            let running = found.as_ref().is_some_and(|i| i.status().is_healthy());
            store.put(project, name, ticket, found);
            if running {
                return Ok(());
            }
        }
        Err(_) => store.invalidate(project),
    }
    Ok(result?)
}

/// Takes `name` out of the warm pool (its key set to `false`, so that it is an ordinary
/// instance of the group from now on, crash loops and all) and starts it.
pub(super) async fn promote(ctx: &Ctx<'_>, name: &str) -> Result<(), ActError> {
    let found = fresh(ctx, name).await?;
    let inst = owned(ctx, "promote", name, found.as_ref())?;
    let healthy = inst.status().is_healthy();
    ctx.fenced(|| format!("taking {name} out of the warm pool"))?;
    let result = ctx
        .incus
        .set_config(&ctx.spec.project, name, WARM_KEY, "false")
        .await;
    if let Err(e) = result {
        ctx.store.refresh(ctx.incus, &ctx.spec.project, name).await;
        return Err(e.into());
    }
    if healthy {
        // Started by someone meanwhile: it serves already.
        ctx.store.refresh(ctx.incus, &ctx.spec.project, name).await;
        return Ok(());
    }
    start_read(ctx, name).await
}

/// Stops (gracefully, then by force) and deletes `name`, after checking on a fresh read that it
/// is still the group's own and not protected. An instance that is gone already counts as
/// removed.
pub(super) async fn remove(ctx: &Ctx<'_>, name: &str) -> Result<(), ActError> {
    let found = fresh(ctx, name).await?;
    if found.is_none() {
        return Ok(());
    }
    let inst = owned(ctx, "delete", name, found.as_ref())?;
    if inst.config.get(PROTECTED_KEY).is_some_and(|v| v == "true") {
        return Err(ActError::Refused {
            action: "delete",
            name: name.to_owned(),
            why: format!("a person protected it ({PROTECTED_KEY}=true)"),
        });
    }
    let status = inst.status();
    let result = async {
        if status.is_healthy() && !ctx.spec.drain_command.is_empty() {
            ctx.fenced(|| format!("draining {name}"))?;
            drain(ctx, name).await;
        }
        remove_instance(ctx, name, status).await
    }
    .await;
    if matches!(result, Err(ActError::LeaseLost { .. })) {
        // Half-way: the next pass (of whoever holds the lease) reads it again.
        ctx.store.invalidate(&ctx.spec.project);
    }
    result
}

/// Runs the group's `drain_command` in `name` before its stop, within `drain_timeout`, cut
/// short by a shutdown, and logs how it went. Whatever happens, the removal goes on.
async fn drain(ctx: &Ctx<'_>, name: &str) {
    let spec = ctx.spec;
    let t0 = std::time::Instant::now();
    let ran = tokio::select! {
        ran = tokio::time::timeout(
            spec.drain_timeout,
            ctx.incus.exec(&spec.project, name, &spec.drain_command),
        ) => Some(ran),
        () = ctx.shutdown.wait() => None,
    };
    let took = format!("{:.1}s", t0.elapsed().as_secs_f64());
    let g = spec.name.as_str();
    match ran {
        Some(Ok(Ok(0))) => {
            tracing::info!(group = g, instance = name, action = "drain", outcome = "ok",
            exit = 0, duration = %took, "drained {name} in {took} (exit status 0)")
        }
        Some(Ok(Ok(code))) => tracing::warn!(group = g, instance = name, action = "drain",
            outcome = "failed", exit = code, duration = %took,
            "the drain command in {name} exited {code} after {took}: removing it anyway"),
        Some(Ok(Err(e))) => tracing::warn!(group = g, instance = name, action = "drain",
            outcome = "failed", error = %e, duration = %took,
            "the drain command could not run in {name} ({e}): removing it anyway"),
        Some(Err(_)) => tracing::warn!(group = g, instance = name, action = "drain",
            outcome = "timeout", duration = %took,
            "the drain command in {name} did not end within {}: removing it anyway",
            humantime::format_duration(spec.drain_timeout)),
        None => tracing::warn!(group = g, instance = name, action = "drain",
            outcome = "cut", duration = %took,
            "the drain command in {name} was cut short after {took}: incus-hpa is shutting \
             down, and the stop of {name} must fit in the unit's TimeoutStopSec"),
    }
}

/// How long a forced stop is waited for (Incus kills the instance at once).
pub const FORCE_STOP_WAIT: Duration = Duration::from_secs(20);

async fn remove_instance(
    ctx: &Ctx<'_>,
    name: &str,
    status: InstanceStatus,
) -> Result<(), ActError> {
    let (incus, store, spec) = (ctx.incus, ctx.store, ctx.spec);
    if status != InstanceStatus::Stopped {
        // A frozen instance cannot stop gracefully (Incus thaws it and times out): force it.
        let graceful = !spec.stop_timeout.is_zero() && status != InstanceStatus::Frozen;
        let mut stopped = false;
        if graceful {
            ctx.fenced(|| format!("stopping {name}"))?;
            let stop = StateChange::Stop {
                timeout: spec.stop_timeout,
                force: false,
            };
            stopped = incus.change_state(&spec.project, name, stop).await.is_ok();
        }
        if !stopped {
            ctx.fenced(|| format!("force-stopping {name}"))?;
            let force = StateChange::Stop {
                timeout: FORCE_STOP_WAIT,
                force: true,
            };
            if let Err(e) = incus.change_state(&spec.project, name, force).await {
                // It may have stopped meanwhile; DELETE tells.
                tracing::debug!(instance = name, error = %e, "force stop failed");
            }
        }
    }
    ctx.fenced(|| format!("deleting {name}"))?;
    let result = match incus.delete(&spec.project, name).await {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    };
    if result.is_ok() {
        store.put(&spec.project, name, store.ticket(), None);
    } else {
        store.refresh(incus, &spec.project, name).await;
    }
    Ok(result?)
}
