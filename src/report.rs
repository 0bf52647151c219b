//! What the daemon tells people: one journal entry per decision, per finding about an instance
//! (crash loop, unhealthy, foreign) with its journald fields, and the `STATUS=` line.

use std::time::Duration;

use crate::model::{Foreign, GroupSpec, Note, Plan, Reason, Summary, GROUP_KEY, OWNER_KEY};

/// Longest `STATUS=` line: systemd reads a notification in one datagram of at most 4096 bytes,
/// so the line stays well below that whatever the number of groups.
pub const STATUS_MAX: usize = 1024;

/// Utilization for people: `45.3%`, or `unknown`.
pub fn fmt_util(u: Option<f64>) -> String {
    u.map_or_else(|| "unknown".into(), |u| format!("{u:.1}%"))
}

fn human(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// One line per decision: at info level when it acts or differs from the previous one, at
/// debug level when it repeats itself (`RUST_LOG=incus_hpa=debug` shows every tick).
/// `standby` names the daemon that holds the group's lease when it is not this one: the
/// decision is logged, and nothing is done.
pub fn decision(spec: &GroupSpec, plan: &Plan, notable: bool, standby: Option<&str>) {
    let util = fmt_util(plan.utilization);
    let util_field = plan
        .utilization
        .map_or_else(|| "unknown".into(), |u| format!("{u:.1}"));
    let target = spec
        .memory_threshold
        .map_or_else(|| "-".into(), |t| t.to_string());
    let (c, p, d) = (plan.current, plan.previous, plan.desired);
    // The signal a reason names, as "cpu 82.0% above target 70%".
    let sig = |prefix: &str, how: &str| signal_text(plan, prefix, how);
    let moved = |what: String, bound: &str, limit: u32| {
        if d > p {
            format!("{what}: scaling up from {p} to {d}")
        } else if d < p {
            format!("{what}: scaling down from {p} to {d}")
        } else {
            format!("{what}: keeping {d} ({bound} {limit})")
        }
    };
    let msg = match plan.reason {
        Reason::BelowMin => format!("{p} desired, below min {}: scaling to {d}", spec.min),
        Reason::AboveMax => format!("{p} desired, above max {}: scaling to {d}", plan.recommendation),
        Reason::ScheduleMin => format!("{p} desired, below the min of an open schedule window: scaling to {d}"),
        Reason::ScheduleMax if d < p => format!("{p} desired, above the max of an open schedule window ({}): scaling down to {d}", plan.recommendation),
        Reason::ScheduleMax => format!("{p} desired, above the max of an open schedule window ({}): keeping {d}", plan.recommendation),
        Reason::WindowClosed if d < p => format!("{p} desired, above max {} since a schedule window closed: scaling down to {d}", plan.recommendation),
        Reason::WindowClosed if plan.step_limited => format!("{p} desired, above max {} since a schedule window closed: keeping {d}", plan.recommendation),
        Reason::WindowClosed => format!("{p} desired, above max {} since a schedule window closed: keeping {d} during the scale-down stabilization window", plan.recommendation),
        Reason::AboveThreshold if d > p => format!("memory {util} above target {target}%: scaling up from {p} to {d}"),
        Reason::AboveThreshold => format!("memory {util} above target {target}%: keeping {d} (max {})", spec.max),
        Reason::BelowThreshold if d < p => format!("memory {util} below target {target}%: scaling down from {p} to {d}"),
        Reason::BelowThreshold => format!("memory {util} below target {target}%: keeping {d} (min {})", spec.min),
        Reason::CpuAboveThreshold => moved(sig("cpu", "above"), "max", spec.max),
        Reason::CpuBelowThreshold => moved(sig("cpu", "below"), "min", spec.min),
        Reason::PressureAboveThreshold => moved(sig("pressure", "above"), "max", spec.max),
        Reason::PressureBelowThreshold => moved(sig("pressure", "below half of"), "min", spec.min),
        Reason::ExternalAboveTarget => moved(sig("external", "above"), "max", spec.max),
        Reason::ExternalBelowTarget => moved(sig("external", "below"), "min", spec.min),
        Reason::Stabilizing if spec.memory_threshold.is_none() => format!("keeping {d} during the scale-down stabilization window"),
        Reason::Stabilizing => format!("memory {util} below target {target}%: keeping {d} during the scale-down stabilization window"),
        Reason::StabilizingUp if spec.memory_threshold.is_none() => format!("keeping {d} during the scale-up stabilization window"),
        Reason::StabilizingUp => format!("memory {util} above target {target}%: keeping {d} during the scale-up stabilization window"),
        Reason::MetricsMissing if spec.memory_threshold.is_none() => format!("some instances or signals have no reading: keeping {d}"),
        Reason::MetricsMissing => format!("memory {util}, but some instances have no reading: keeping {d}"),
        Reason::NoMetrics if spec.memory_threshold.is_none() => format!("no reading: keeping {d}"),
        Reason::NoMetrics => format!("no memory reading: keeping {d}"),
        Reason::WithinTolerance => format!("memory {util} near target {target}%: keeping {d}"),
        Reason::AtLimit => format!("an instance is at its memory limit (memory {util}): scaling up from {p} to {d}"),
        Reason::Forecast => format!(
            "memory {util}, and the demand repeats: a rise is due{}: scaling up from {p} to {d} before it",
            plan.hold.and_then(|h| h.forecast).map_or(String::new(), |f| format!(
                " (one period ago, {} before now)",
                human(f.every)
            ))
        ),
        Reason::Protected => format!(
            "{d} desired, but {} protected instance(s) ({}=true) cannot be removed: keeping {c}",
            plan.protected, crate::model::PROTECTED_KEY
        ),
        Reason::HostHeadroom => format!(
            "{d} desired, but {} addition(s) held back: no room above host_reserve (see the \
             host-headroom entry)",
            plan.headroom.as_ref().map_or(0, |h| h.held)
        ),
    };
    let msg = match plan.reason {
        Reason::WithinTolerance if spec.memory_threshold.is_none() => {
            format!("signals near their targets: keeping {d}")
        }
        _ => msg,
    };
    let msg = if plan.paused {
        format!("paused (nothing is done): {msg}")
    } else {
        msg
    };
    let msg = match standby {
        // The reason itself is logged once, as an error, by the leases.
        Some(why) if why.starts_with("nobody: ") => format!(
            "standby (this project's lease store cannot be used; nothing is done here): {msg}"
        ),
        Some(me)
            if me
                == crate::lease::Standing::Confirming
                    .standby()
                    .unwrap_or_default() =>
        {
            format!("confirming the lease it has just taken (nothing is done until the next round reads it back): {msg}")
        }
        Some(holder) => format!("standby ({holder} holds the lease; nothing is done here): {msg}"),
        None => msg,
    };
    let mut msg = if plan.step_limited {
        format!("{msg} (step limit; {} recommended)", plan.recommendation)
    } else {
        msg
    };
    // A scale-down, or one held back, names the window the `adaptive` policy has in force.
    if let Some(hold) = plan.hold.filter(|_| {
        matches!(plan.reason, Reason::Stabilizing | Reason::WindowClosed)
            || (d < p && plan.reason == Reason::BelowThreshold)
    }) {
        msg = format!("{msg}; {}", hold.describe());
    }
    let mut extra = counts(plan);
    if !plan.failing.is_empty() {
        extra.push(format!("failing to start: {}", plan.failing.join(", ")));
    }
    if !extra.is_empty() {
        msg = format!("{msg}; {}", extra.join(", "));
    }
    let g = spec.name.as_str();
    let reason = plan.reason.as_str();
    let (unhealthy, paused, standby) = (plan.unhealthy, plan.paused, standby.is_some());
    let (starting, not_ready) = (plan.starting, plan.not_ready);
    if !notable {
        tracing::debug!(group = g, current = c, desired = d, unhealthy, starting, not_ready, utilization = %util_field, reason, paused, standby, "{g}: {msg}");
    } else {
        tracing::info!(group = g, current = c, desired = d, unhealthy, starting, not_ready, utilization = %util_field, reason, paused, standby, "{g}: {msg}");
    }
}

/// What a decision line adds about the instances: "2 in service, 1 starting, 1 not ready".
/// A starting instance counts toward the current count and is not in service yet.
fn counts(plan: &Plan) -> Vec<String> {
    let (c, d) = (plan.current, plan.desired);
    let mut extra = Vec::new();
    let serving = c.saturating_sub(plan.starting);
    if c != d || plan.starting > 0 {
        extra.push(format!("{serving} in service"));
    }
    if plan.starting > 0 {
        extra.push(format!("{} starting", plan.starting));
    }
    if plan.unhealthy > 0 {
        extra.push(format!("{} unhealthy", plan.unhealthy));
    }
    if plan.not_ready > 0 {
        extra.push(format!("{} not ready", plan.not_ready));
    }
    extra
}

/// The first signal whose name starts with `prefix`, as "cpu 82.0% above target 70%" (or
/// "external 1 = 130 above target 20 per instance").
fn signal_text(plan: &Plan, prefix: &str, how: &str) -> String {
    let Some(s) = plan
        .signals
        .iter()
        .find(|s| s.name.starts_with(prefix) && s.wants.is_some_and(|w| w != plan.previous))
    else {
        return format!("{prefix} {how} target");
    };
    let value = s
        .value
        .map_or_else(|| "unknown".into(), |v| format!("{v:.1}"));
    if prefix == "external" {
        format!(
            "{} = {value} {how} target {} per instance",
            s.name, s.target
        )
    } else {
        format!("{} {value}% {how} target {}%", s.name, s.target)
    }
}

/// One entry for something `decide` noticed about an instance.
pub fn note(spec: &GroupSpec, note: &Note) {
    let g = spec.name.as_str();
    match note {
        Note::CrashLoop {
            instance,
            crashes,
            ran,
            restart_in,
        } => {
            let then = match restart_in {
                Some(d) if d.is_zero() => "restarting it now".to_owned(),
                Some(d) => format!("restarting it in {}", human(*d)),
                None => "replacing it".to_owned(),
            };
            tracing::warn!(group = g, instance = %instance, reason = "crash-loop", crashes,
                "{instance} stopped {} after it was started (crash {crashes} in a row): {then}",
                human(*ran));
        }
        Note::Unhealthy {
            instance,
            status,
            grace,
        } => tracing::warn!(group = g, instance = %instance, reason = "unhealthy",
            status = %status,
            "{instance} is {status}: it no longer counts as capacity and is replaced now; \
             removed if it is still {status} in {}", human(*grace)),
        Note::FailingStart {
            instance,
            failures,
            retry_in,
        } => tracing::warn!(group = g, instance = %instance, reason = "failing-start",
            failures,
            "{instance} failed to start {failures} times in a row: it no longer counts as \
             capacity and is replaced (within max); it is left in place, and its start is tried \
             again in {} (incus info --show-log {instance} tells why it fails)",
            human(*retry_in)),
        Note::Unreachable {
            instance,
            member,
            grace,
        } => tracing::warn!(group = g, instance = %instance, reason = "unreachable",
            member = %member,
            "{instance} is on cluster member {member}, which does not answer: it still counts, \
             unmeasured (no scale-down meanwhile), and is replaced in {} if {member} is still \
             away (it is left where it is: nothing can be done to it there)", human(*grace)),
        Note::NotReady {
            instance,
            why,
            grace,
        } => tracing::warn!(group = g, instance = %instance, reason = "not-ready",
            why = %why,
            "{instance} is not ready ({}): it is out of service, no longer counts as capacity \
             and is replaced now; removed if it is still not ready in {}",
            or_unknown(why), human(*grace)),
        Note::NeverReady { instance, why } => tracing::warn!(group = g, instance = %instance,
            reason = "never-ready", why = %why,
            "{instance} was never ready within the start_timeout of its check ({}): a failed \
             start, removed and replaced now (unless protected)", or_unknown(why)),
    }
}

/// A check's failure for people: `no check has ended` when there is none yet.
fn or_unknown(why: &str) -> &str {
    if why.is_empty() {
        "no check has ended"
    } else {
        why
    }
}

/// One entry (per daemon run) for an instance that carries the group's key but is not the
/// group's own, with the commands that settle it.
pub fn foreign(spec: &GroupSpec, f: &Foreign) {
    let g = spec.name.as_str();
    let project = if spec.project == "default" {
        String::new()
    } else {
        format!(" --project {}", spec.project)
    };
    let name = &f.name;
    tracing::warn!(group = g, instance = %name, reason = "foreign",
        "{name} carries {GROUP_KEY}={g} but incus-hpa did not create it for {g} ({}): it is \
         left alone. To add it to the group: incus config set{project} {name} {OWNER_KEY}={}; \
         to take it out: incus config unset{project} {name} {GROUP_KEY}",
        f.why, f.adopt);
}

/// The `STATUS=` line: `web 3/3 mem 45.0% (target 70%); db …`, failing groups first, cut to
/// [`STATUS_MAX`] bytes with a count of the groups left out.
pub fn status_line<'a>(
    groups: impl Iterator<Item = (&'a GroupSpec, Option<&'a Summary>)>,
) -> String {
    let mut parts: Vec<(bool, String)> = groups
        .map(|(spec, last)| {
            let name = &spec.name;
            match last {
                None => (false, format!("{name}: pending")),
                Some(s) => {
                    let mut line = format!("{name} {}/{}", s.current, s.desired);
                    if let Some(t) = spec.memory_threshold {
                        line.push_str(&format!(" mem {} (target {t}%)", fmt_util(s.utilization)));
                    }
                    for signal in s.signals.iter().filter(|x| x.name != "memory") {
                        let value = signal
                            .value
                            .map_or_else(|| "unknown".into(), |v| format!("{v:.1}"));
                        line.push_str(&format!(" {} {value}", signal.name));
                    }
                    if s.starting > 0 {
                        line.push_str(&format!(" ({} starting)", s.starting));
                    }
                    if s.unhealthy > 0 {
                        line.push_str(&format!(" +{} unhealthy", s.unhealthy));
                    }
                    if s.not_ready > 0 {
                        line.push_str(&format!(" +{} not ready", s.not_ready));
                    }
                    if spec.paused {
                        line.push_str(" PAUSED");
                    }
                    if let Some(e) = &s.error {
                        line.push_str(&format!(" ERROR {e}"));
                    }
                    (s.error.is_some(), line)
                }
            }
        })
        .collect();
    if parts.is_empty() {
        return "no groups configured: nothing to manage".into();
    }
    let failing = parts.iter().filter(|(f, _)| *f).count();
    parts.sort_by_key(|(f, _)| !*f);
    let total = parts.len();
    let mut line = String::new();
    for (shown, (_, part)) in parts.iter().enumerate() {
        let rest = total - shown;
        let tail = format!("; … {rest} more group(s), {failing} failing in all");
        let sep = if line.is_empty() { "" } else { "; " };
        if line.len() + sep.len() + part.len() + tail.len() > STATUS_MAX {
            if line.is_empty() {
                // Even the first part is too long: cut it on a character boundary.
                let mut cut = STATUS_MAX.saturating_sub(tail.len() + '…'.len_utf8());
                while !part.is_char_boundary(cut) {
                    cut -= 1;
                }
                line.push_str(&part[..cut]);
                line.push('…');
                line.push_str(&format!(
                    "; … {} more group(s), {failing} failing in all",
                    rest - 1
                ));
            } else {
                line.push_str(&tail);
            }
            return line;
        }
        line.push_str(sep);
        line.push_str(part);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GroupName;

    fn spec(name: &str) -> GroupSpec {
        let toml = format!("[groups.{name}]\nmax = 2\nmemory_threshold = 50\nimage = \"b\"\n");
        crate::config::parse(std::path::Path::new("t"), &toml)
            .unwrap()
            .state
            .groups
            .remove(&GroupName::parse(name).unwrap())
            .unwrap()
    }

    /// The plan of a first pass over `instances` of a group at 50 % for a 50 % target.
    fn plan_of(readiness: &[crate::model::Readiness]) -> Plan {
        use crate::model::{InstanceStatus, Memory, Observation, ObservedInstance};
        let instances = readiness
            .iter()
            .enumerate()
            .map(|(k, r)| ObservedInstance {
                name: format!("web-{k}"),
                status: InstanceStatus::Running,
                created_at: k as i64,
                since_start: Some(Duration::from_secs(60)),
                memory: Some(Memory {
                    usage: 50,
                    limit: 100,
                    ..Default::default()
                }),
                location: String::new(),
                warm: false,
                protected: false,
                readiness: r.clone(),
                address: None,
            })
            .collect();
        let obs = Observation {
            instances,
            ..Default::default()
        };
        let mut history = crate::decide::History::default();
        crate::decide::decide(
            &spec("web"),
            &obs,
            &mut history,
            tokio::time::Instant::now(),
        )
    }

    #[test]
    fn a_decision_says_how_many_instances_serve_and_how_many_start() {
        use crate::model::Readiness;
        let starting = Readiness::Starting { why: String::new() };
        let p = plan_of(&[Readiness::Ready, starting.clone()]);
        assert_eq!((p.current, p.desired), (2, 2));
        assert_eq!(counts(&p), ["1 in service", "1 starting"]);
        let not_ready = Readiness::NotReady {
            why: "HTTP 503".into(),
        };
        let p = plan_of(&[Readiness::Ready, not_ready]);
        // A first pass takes the capacity there is as the desired count: 1, met.
        assert_eq!((p.current, p.desired), (1, 1));
        assert_eq!(counts(&p), ["1 not ready"]);
        // Without checks, as before: nothing when the count is the desired one.
        let p = plan_of(&[Readiness::Unchecked, Readiness::Unchecked]);
        assert!(counts(&p).is_empty(), "{:?}", counts(&p));
    }

    #[test]
    fn the_status_line_says_what_starts_and_what_is_not_ready() {
        let spec = spec("web");
        let s = Summary {
            current: 3,
            desired: 3,
            unhealthy: 0,
            warm: 0,
            starting: 1,
            not_ready: 1,
            instances: Vec::new(),
            failing: Vec::new(),
            utilization: Some(50.0),
            signals: Vec::new(),
            reason: Reason::WithinTolerance,
            error: None,
            standby: None,
            hold: None,
        };
        let line = status_line(std::iter::once((&spec, Some(&s))));
        assert_eq!(
            line,
            "web 3/3 mem 50.0% (target 50%) (1 starting) +1 not ready"
        );
    }

    #[test]
    fn the_status_line_stays_short_however_many_groups_fail() {
        let specs: Vec<GroupSpec> = (0..500).map(|i| spec(&format!("group-{i}"))).collect();
        let failing = Summary {
            current: 1,
            desired: 2,
            unhealthy: 0,
            warm: 0,
            starting: 0,
            not_ready: 0,
            instances: Vec::new(),
            failing: Vec::new(),
            utilization: Some(50.0),
            signals: Vec::new(),
            reason: Reason::BelowMin,
            error: Some("x".repeat(3000)),
            standby: None,
            hold: None,
        };
        let line = status_line(specs.iter().map(|s| (s, Some(&failing))));
        assert!(line.len() <= STATUS_MAX, "{}", line.len());
        assert!(
            line.ends_with("499 more group(s), 500 failing in all"),
            "{line}"
        );

        let ok = Summary {
            error: None,
            ..failing.clone()
        };
        let mut all: Vec<(&GroupSpec, Option<&Summary>)> =
            specs.iter().map(|s| (s, Some(&ok))).collect();
        all[300].1 = Some(&failing);
        let line = status_line(all.into_iter());
        assert!(
            line.starts_with("group-300 1/2"),
            "failing groups come first: {line}"
        );
        assert!(line.len() <= STATUS_MAX);
        assert!(line.contains("1 failing in all"), "{line}");
    }
}
