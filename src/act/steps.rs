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
//!   then by force, then deletes, asking the lease before each of these steps, and checking
//!   ownership and protection again on a fresh read before each step that takes it further
//!   out of service: one protected meanwhile is left running, or started again when the
//!   removal had stopped it. For a group with endpoints, a running instance first leaves the
//!   set: the set without it is published (the removal is held when that fails) and
//!   `deregistration_delay` passes, cut short by a shutdown, before the drain; one that was
//!   not in the set is removed without waiting.

use std::time::Duration;

use super::{ActError, Ctx, Done};
use crate::decide::owner_value;
use crate::endpoints::publisher::Left;
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
/// is still the group's own and not protected, and again before each step that takes it
/// further out of service (see [`removal`]). An instance that is gone already counts as
/// removed.
pub(super) async fn remove(ctx: &Ctx<'_>, name: &str) -> Result<(), ActError> {
    let result = removal(ctx, name).await;
    if let Some(board) = ctx.ready {
        board.set_leaving(&ctx.spec.project, ctx.spec.name.as_str(), name, false);
    }
    if let (Some(p), Some(_)) = (ctx.endpoints, &ctx.spec.endpoints) {
        p.done(ctx.spec, name, result.is_ok());
    }
    if matches!(result, Err(ActError::LeaseLost { .. })) {
        // Half-way: the next pass (of whoever holds the lease) reads it again.
        ctx.store.invalidate(&ctx.spec.project);
    }
    result
}

/// How far a removal went when it reads the instance again.
#[derive(Debug, Clone, Copy, Default)]
struct Stage {
    /// It ran (or was ready) when the removal began.
    ran: bool,
    /// Its drain command ran.
    drained: bool,
    /// This removal asked Incus to stop it.
    stop_asked: bool,
}

/// A removal's steps. A drain can take `drain_timeout` (up to 5 minutes) and a graceful stop
/// `stop_timeout` (up to 2), so the instance is read again after each before the next step
/// (the stop after a drain, the forced stop after a graceful one that did not end, the delete
/// after a stop): one that a person protected meanwhile, or that is no longer the group's own,
/// goes no further (see [`recheck`] for what it is left as).
async fn removal(ctx: &Ctx<'_>, name: &str) -> Result<(), ActError> {
    let (incus, spec) = (ctx.incus, ctx.spec);
    let mut stage = Stage::default();
    let Some(mut status) = recheck(ctx, name, stage).await? else {
        return Ok(());
    };
    stage.ran = status.is_healthy();
    if status.is_healthy() {
        deregister(ctx, name).await?;
        if let Some(board) = ctx.ready {
            board.set_leaving(&spec.project, spec.name.as_str(), name, true);
        }
    }
    if status.is_healthy() && !spec.drain_command.is_empty() {
        ctx.fenced(|| format!("draining {name}"))?;
        drain(ctx, name).await;
        stage.drained = true;
        let Some(now) = recheck(ctx, name, stage).await? else {
            return Ok(());
        };
        status = now;
    }
    if status != InstanceStatus::Stopped {
        // A frozen instance cannot stop gracefully (Incus thaws it and times out): force it.
        if !spec.stop_timeout.is_zero() && status != InstanceStatus::Frozen {
            ctx.fenced(|| format!("stopping {name}"))?;
            stage.stop_asked = true;
            if incus
                .change_state(&spec.project, name, graceful(spec))
                .await
                .is_err()
            {
                let Some(now) = recheck(ctx, name, stage).await? else {
                    return Ok(());
                };
                status = now;
            } else {
                status = InstanceStatus::Stopped;
            }
        }
        if status != InstanceStatus::Stopped {
            ctx.fenced(|| format!("force-stopping {name}"))?;
            stage.stop_asked = true;
            force_stop(ctx, name).await;
        }
    }
    if stage.stop_asked && recheck(ctx, name, stage).await?.is_none() {
        return Ok(());
    }
    delete(ctx, name).await
}

/// Reads `name` afresh before the removal's next step: its status when the removal may go on,
/// `None` when it is gone (removed, as far as the group is concerned), and a refusal when it
/// is no longer the group's own (left as it is: it is not the daemon's to touch) or a person
/// protected it. A protected instance is left as it is, except one that ran before this
/// removal stopped it, which is started again: whoever protected it meant to keep it serving.
/// The refusal says what it was left as (the journal shows it).
async fn recheck(
    ctx: &Ctx<'_>,
    name: &str,
    stage: Stage,
) -> Result<Option<InstanceStatus>, ActError> {
    if stage.drained || stage.stop_asked {
        // Half-way, the lease first: a holder whose lease ran out during the drain or the stop
        // goes no further, and does not take an instance the next holder removed meanwhile
        // for one it removed itself.
        ctx.fenced(|| {
            if stage.stop_asked {
                format!("going on with stopping and deleting {name}")
            } else {
                format!("stopping {name}")
            }
        })?;
    }
    let found = fresh(ctx, name).await?;
    if found.is_none() {
        return Ok(None);
    }
    let begun = stage.drained || stage.stop_asked;
    let when = match (stage.drained, stage.stop_asked) {
        (_, true) => " while it was being stopped",
        (true, false) => " while its drain command ran",
        (false, false) => "",
    };
    let drained = if stage.drained {
        " (its drain command ran)"
    } else {
        ""
    };
    let inst = match owned(ctx, "delete", name, found.as_ref()) {
        Ok(inst) => inst,
        Err(ActError::Refused { action, name, why }) if begun => {
            let status = found
                .as_ref()
                .map_or(InstanceStatus::Stopped, Instance::status);
            return Err(ActError::Refused {
                action,
                why: format!("{why}{when}: left {status}{drained}"),
                name,
            });
        }
        Err(e) => return Err(e),
    };
    let status = inst.status();
    if inst.config.get(PROTECTED_KEY).is_none_or(|v| v != "true") {
        return Ok(Some(status));
    }
    let mut why = format!("a person protected it ({PROTECTED_KEY}=true)");
    if begun {
        let left = if stage.ran && stage.stop_asked && status == InstanceStatus::Stopped {
            match start_read(ctx, name).await {
                Ok(()) => "started again".to_owned(),
                Err(e) => format!("left stopped (starting it again failed: {e})"),
            }
        } else {
            format!("left {status}")
        };
        why = format!("{why}{when}: {left}{drained}");
    }
    Err(ActError::Refused {
        action: "delete",
        name: name.to_owned(),
        why,
    })
}

/// Takes `name` out of the group's endpoints before it is drained and stopped: the set
/// without it is published, then `deregistration_delay` passes (cut short by a shutdown).
/// Nothing is waited for when the group has no endpoints, or `name` was not in the set. A
/// set that could not be published holds the removal ([`ActError::Held`]).
async fn deregister(ctx: &Ctx<'_>, name: &str) -> Result<(), ActError> {
    let (Some(publisher), Some(e)) = (ctx.endpoints, &ctx.spec.endpoints) else {
        return Ok(());
    };
    ctx.fenced(|| format!("taking {name} out of the endpoints"))?;
    let g = ctx.spec.name.as_str();
    match publisher.leave(ctx.spec, name).await {
        Ok(Left::NotInSet) => Ok(()),
        Ok(Left::Deregistered) => {
            let delay = e.deregistration_delay;
            tracing::info!(
                group = g,
                instance = name,
                action = "deregister",
                outcome = "ok",
                "took {name} out of the endpoints of {g}; stopping it in {}",
                humantime::format_duration(delay)
            );
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = ctx.shutdown.wait() => {}
            }
            Ok(())
        }
        Err(why) => Err(ActError::Held {
            name: name.to_owned(),
            why,
        }),
    }
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

/// A graceful stop within the group's `stop_timeout`.
fn graceful(spec: &crate::model::GroupSpec) -> StateChange {
    StateChange::Stop {
        timeout: spec.stop_timeout,
        force: false,
    }
}

/// Stops `name` by force; a failure is only logged (it may have stopped meanwhile: the delete
/// tells).
async fn force_stop(ctx: &Ctx<'_>, name: &str) {
    let force = StateChange::Stop {
        timeout: FORCE_STOP_WAIT,
        force: true,
    };
    if let Err(e) = ctx.incus.change_state(&ctx.spec.project, name, force).await {
        tracing::debug!(instance = name, error = %e, "force stop failed");
    }
}

/// Stops `name` (gracefully, then by force) and deletes it, with no read in between: what is
/// left of a creation that failed.
async fn remove_instance(
    ctx: &Ctx<'_>,
    name: &str,
    status: InstanceStatus,
) -> Result<(), ActError> {
    let spec = ctx.spec;
    if status != InstanceStatus::Stopped {
        // A frozen instance cannot stop gracefully (Incus thaws it and times out): force it.
        let mut stopped = false;
        if !spec.stop_timeout.is_zero() && status != InstanceStatus::Frozen {
            ctx.fenced(|| format!("stopping {name}"))?;
            stopped = ctx
                .incus
                .change_state(&spec.project, name, graceful(spec))
                .await
                .is_ok();
        }
        if !stopped {
            ctx.fenced(|| format!("force-stopping {name}"))?;
            force_stop(ctx, name).await;
        }
    }
    delete(ctx, name).await
}

/// Deletes `name` (one already gone is no failure) and writes what is there into the cache.
async fn delete(ctx: &Ctx<'_>, name: &str) -> Result<(), ActError> {
    let (incus, store, spec) = (ctx.incus, ctx.store, ctx.spec);
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
