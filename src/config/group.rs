//! One `[groups.NAME]` table → a [`GroupSpec`], every problem reported at its place; its
//! `[groups.NAME.config]` and the rule of instance name prefixes.

use std::collections::BTreeMap;
use std::time::Duration;

use toml::de::DeValue;

use super::diag::{Collector, Severity};
use super::fields::{self, Fields};
use super::{
    endpoints, keys, ready, security, signals, DRAIN_TIMEOUT_MAX, DURATION_MAX, SUFFIX_LEN,
    WARM_POOL_MAX,
};
use crate::model::{
    GroupName, GroupSpec, Policy, ScaleDownOrder, GROUP_KEY, MAX_INSTANCES, RESTART_BACKOFF_MAX,
    STOP_TIMEOUT_MAX,
};

pub(super) fn group(
    c: &mut Collector,
    name: GroupName,
    mut t: Fields,
    interval: Duration,
    check_files: bool,
) -> Option<GroupSpec> {
    let before = c.diagnostics.len();
    let min = t.count(c, "min");
    let max = t.count(c, "max");
    let max = t.required(c, "max", max);
    let image = t.string(c, "image");
    let image = t.required(c, "image", image);
    let prefix = t.string(c, "instance_prefix");
    let profiles = t.strings(c, "profiles");
    let project = t.string(c, "project");
    let down = t.duration_within(c, "scale_down_stabilization", Duration::ZERO, DURATION_MAX);
    let up = t.duration_within(c, "scale_up_stabilization", Duration::ZERO, DURATION_MAX);
    let up_step = t.count(c, "max_scale_up_step");
    let down_step = t.count(c, "max_scale_down_step");
    for (key, step) in [
        ("max_scale_up_step", &up_step),
        ("max_scale_down_step", &down_step),
    ] {
        if let Some((0, span)) = step {
            c.error(
                Some(span.clone()),
                &t.key(key),
                "must be at least 1 (leave it out for no limit)",
            );
        }
    }
    let warm_pool = t.count(c, "warm_pool");
    if let Some((n, span)) = &warm_pool {
        if *n > WARM_POOL_MAX {
            c.error(
                Some(span.clone()),
                &t.key("warm_pool"),
                format!("{n} is out of range: must be at most {WARM_POOL_MAX}"),
            );
        }
    }
    let stop_timeout = t.duration_within(c, "stop_timeout", Duration::ZERO, STOP_TIMEOUT_MAX);
    let grace = t.duration_within(c, "unhealthy_grace", Duration::ZERO, DURATION_MAX);
    let restart_backoff = t.duration_within(
        c,
        "restart_backoff",
        Duration::from_millis(100),
        RESTART_BACKOFF_MAX,
    );
    let allow_privileged = t.boolean(c, "allow_privileged").is_some_and(|(b, _)| b);
    let paused = t.boolean(c, "paused").is_some_and(|(b, _)| b);
    let scale_down_order = t
        .choice(
            c,
            "scale_down_order",
            &[
                ("newest", ScaleDownOrder::Newest),
                ("oldest", ScaleDownOrder::Oldest),
                ("least-memory", ScaleDownOrder::LeastMemory),
            ],
        )
        .unwrap_or_default();
    let policy = t
        .choice(
            c,
            "policy",
            &[
                ("adaptive", Policy::Adaptive),
                ("kubernetes", Policy::Kubernetes),
            ],
        )
        .unwrap_or_default();
    let drain_command = t
        .strings(c, "drain_command")
        .map_or_else(Vec::new, |(v, span)| {
            if v.is_empty() || v[0].is_empty() {
                c.error(
                    Some(span),
                    &t.key("drain_command"),
                    "must name a program, e.g. [\"/bin/sh\", \"-c\", \"…\"]",
                );
            }
            v
        });
    let drain_timeout = t.duration_within(
        c,
        "drain_timeout",
        Duration::from_secs(1),
        DRAIN_TIMEOUT_MAX,
    );
    let config = t
        .table(c, "config")
        .map(|ct| instance_config(c, ct, allow_privileged));
    let target = t.string(c, "target").and_then(|(v, span)| {
        let name = v.strip_prefix('@').unwrap_or(&v);
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'));
        if !ok {
            c.error(
                Some(span),
                &t.key("target"),
                format!(
                    "{v:?} is not a cluster member or @cluster-group name (letters, digits, \
                     '-', '_', '.'), as in \"node2\" or \"@web-nodes\""
                ),
            );
        }
        ok.then_some(v)
    });

    if let Some((max, span)) = &max {
        if *max == 0 {
            c.error(Some(span.clone()), &t.key("max"), "must be at least 1");
        } else if *max > MAX_INSTANCES {
            c.error(
                Some(span.clone()),
                &t.key("max"),
                format!("must be at most {}", MAX_INSTANCES),
            );
        }
        if let Some((min, min_span)) = &min {
            if min > max {
                c.error(
                    Some(min_span.clone()),
                    &t.key("min"),
                    format!("min ({min}) is greater than max ({max})"),
                );
            }
        }
    }
    if let Some((img, span)) = &image {
        if img.trim().is_empty() {
            c.error(
                Some(span.clone()),
                &t.key("image"),
                "must name an image alias or fingerprint",
            );
        }
    }
    if let Some((p, span)) = &prefix {
        if let Err(e) = check_prefix(p) {
            c.error(Some(span.clone()), &t.key("instance_prefix"), e);
        }
    }
    if let Some((profiles, span)) = &profiles {
        if profiles.iter().any(|p| p.trim().is_empty()) {
            c.error(
                Some(span.clone()),
                &t.key("profiles"),
                "a profile name cannot be empty",
            );
        }
    }
    if let Some((p, span)) = &project {
        if p.trim().is_empty() || p.contains(['/', '?', '&', '#', ' ']) {
            c.error(
                Some(span.clone()),
                &t.key("project"),
                format!("{p:?} is not a valid project name"),
            );
        }
    }
    let config = config.unwrap_or_default();
    let signals = signals::read(c, &mut t, &config, check_files);
    let ready = ready::read(c, &mut t);
    let ready_port = ready.as_ref().and_then(|r| r.probe.port());
    let endpoints = endpoints::read(c, &mut t, ready_port, check_files);
    let profiles = profiles.map_or_else(|| vec!["default".to_owned()], |(p, _)| p);
    if !config.contains_key("limits.memory") {
        c.warning(
            Some(t.span()),
            &t.key("config"),
            format!(
                "no \"limits.memory\": unless profile(s) {} set it, each instance's memory is measured \
                 against the host's total memory",
                profiles.join(", ")
            ),
        );
    }
    t.finish(c, &keys::names(keys::Table::Group));

    if c.diagnostics[before..]
        .iter()
        .any(|d| d.severity == Severity::Error)
    {
        return None;
    }
    let secs = |d: Option<Duration>, default: u64| d.unwrap_or(Duration::from_secs(default));
    Some(GroupSpec {
        instance_prefix: prefix.map_or_else(|| format!("{name}-"), |(p, _)| p),
        min: min.map_or(1, |(m, _)| m),
        max: max?.0,
        memory_threshold: signals.memory_threshold,
        cpu_threshold: signals.cpu_threshold,
        pressure_threshold: signals.pressure_threshold,
        tolerance_up: signals.tolerance_up,
        tolerance_down: signals.tolerance_down,
        cpu_limit: signals.cpu_limit,
        external: signals.external,
        schedule: signals.schedule,
        image: image?.0,
        profiles,
        project: project.map_or_else(|| "default".to_owned(), |(p, _)| p),
        config,
        scale_down_stabilization: secs(down, 300),
        scale_up_stabilization: secs(up, 0),
        max_scale_up_step: up_step.map(|(s, _)| s),
        max_scale_down_step: down_step.map(|(s, _)| s),
        stop_timeout: secs(stop_timeout, 30),
        unhealthy_grace: secs(grace, 300),
        restart_backoff: secs(restart_backoff, 10),
        interval,
        warm_pool: warm_pool.map_or(0, |(n, _)| n),
        paused,
        scale_down_order,
        policy,
        drain_command,
        drain_timeout: secs(drain_timeout, 30),
        target,
        ready,
        endpoints,
        name,
    })
}

/// `[groups.NAME.config]`: Incus instance config, values as strings (numbers and booleans are
/// accepted and written as Incus expects them).
fn instance_config(
    c: &mut Collector,
    mut t: Fields,
    allow_privileged: bool,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in t.entries() {
        let key = k.get_ref().to_string();
        let path = t.key(&format!("{key:?}"));
        let value = match v.get_ref() {
            DeValue::String(s) => s.to_string(),
            DeValue::Integer(i) => i.as_str().to_owned(),
            DeValue::Boolean(b) => b.to_string(),
            other => {
                c.error(
                    Some(v.span()),
                    &path,
                    format!("expected a string, found {}", fields::type_name(other)),
                );
                continue;
            }
        };
        if key.starts_with("user.incus-hpa.") {
            c.error(
                Some(k.span()),
                &path,
                format!("keys under user.incus-hpa. are the daemon's own (it sets {GROUP_KEY})"),
            );
        } else if key.starts_with("volatile.") || key.starts_with("image.") {
            c.error(
                Some(k.span()),
                &path,
                "Incus manages this key; it cannot be set at creation",
            );
        } else if let Some(why) = security::grants_host_root(&key, &value) {
            if !allow_privileged {
                c.error(
                    Some(k.span()),
                    &path,
                    format!("{why}; set allow_privileged = true in this group to accept that"),
                );
            }
        }
        out.insert(key, value);
    }
    out
}

/// An instance name prefix: a letter first, then letters, digits and '-', leaving room for the
/// random suffix within Incus' 63 characters.
fn check_prefix(p: &str) -> Result<(), String> {
    let max = 63 - SUFFIX_LEN;
    if p.is_empty() || p.len() > max {
        return Err(format!("must have 1 to {max} characters"));
    }
    if !p.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err("must start with a letter (instance names are host names)".into());
    }
    if !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err("may hold only letters, digits and '-'".into());
    }
    Ok(())
}
