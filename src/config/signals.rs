//! A group's signals in the file: the thresholds, the tolerances, `[[groups.NAME.external]]`,
//! `[[groups.NAME.schedule]]`, and the CPU limit the CPU signal is measured against.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use super::diag::Collector;
use super::fields::Fields;
use super::keys::{self, Table};
use super::{EXTERNAL_TIMEOUT_MAX, WINDOW_MAX};
use crate::model::{ExternalSpec, ScheduleSpec};

/// What the signal keys of one group say.
#[derive(Debug, Default)]
pub struct Signals {
    pub memory_threshold: Option<f64>,
    pub cpu_threshold: Option<f64>,
    pub pressure_threshold: Option<f64>,
    pub tolerance_up: f64,
    pub tolerance_down: f64,
    pub cpu_limit: Option<f64>,
    pub external: Vec<ExternalSpec>,
    pub schedule: Vec<ScheduleSpec>,
}

/// A percentage key from 1 to 100, with what it is a percentage of.
fn percent(c: &mut Collector, t: &mut Fields, key: &str, of: &str) -> Option<f64> {
    let (v, span) = t.number(c, key)?;
    if (1.0..=100.0).contains(&v) {
        Some(v)
    } else {
        c.error(
            Some(span),
            &t.key(key),
            format!("{v} is outside 1–100 ({of})"),
        );
        None
    }
}

fn tolerance(c: &mut Collector, t: &mut Fields, key: &str) -> Option<f64> {
    let (v, span) = t.number(c, key)?;
    if (0.0..1.0).contains(&v) {
        Some(v)
    } else {
        c.error(
            Some(span),
            &t.key(key),
            "must be from 0 up to (not including) 1",
        );
        None
    }
}

/// Reads the signal keys of the group `t`, whose instance config is `config`.
/// With `check_files`, an external program's file is checked too (see [`check_program`]).
pub fn read(
    c: &mut Collector,
    t: &mut Fields,
    config: &BTreeMap<String, String>,
    check_files: bool,
) -> Signals {
    let memory_threshold = percent(
        c,
        t,
        "memory_threshold",
        "percent of each instance's memory limit",
    );
    let cpu_threshold = percent(
        c,
        t,
        "cpu_threshold",
        "percent of each instance's CPU limit",
    );
    let pressure_threshold = percent(
        c,
        t,
        "pressure_threshold",
        "percent of time some task waits, PSI some avg10",
    );
    let both = tolerance(c, t, "tolerance").unwrap_or(0.1);
    let tolerance_up = tolerance(c, t, "tolerance_up").unwrap_or(both);
    let tolerance_down = tolerance(c, t, "tolerance_down").unwrap_or(both);
    let external: Vec<ExternalSpec> = t
        .tables(c, "external")
        .into_iter()
        .filter_map(|e| external(c, e, check_files))
        .collect();
    let schedule: Vec<ScheduleSpec> = t
        .tables(c, "schedule")
        .into_iter()
        .filter_map(|w| window(c, w))
        .collect();
    let limit = cpu_limit(config);
    if let (Some(_), Err((key, e))) = (cpu_threshold, &limit) {
        // At the value in [groups.NAME.config], named as that table names its keys.
        let at = t.table(c, "config").and_then(|mut config| {
            config
                .entries()
                .into_iter()
                .find(|(k, _)| k.get_ref().as_ref() == *key)
                .map(|(_, v)| (v.span(), config.key(&format!("{key:?}"))))
        });
        let (span, path) = at.unwrap_or_else(|| (t.span(), t.key("config")));
        c.error(Some(span), &path, e.clone());
    }
    let cpu_limit = limit.unwrap_or(None);
    if cpu_threshold.is_some() && cpu_limit.is_none() && !config_refused(config) {
        c.error(
            Some(t.span()),
            &t.key("cpu_threshold"),
            "the CPU signal is a percentage of each instance's CPU limit, and the group's \
             config sets none: add \"limits.cpu\" = \"1\" (a number of CPUs) or \
             \"limits.cpu.allowance\" = \"50ms/100ms\" to [groups.NAME.config]",
        );
    }
    if memory_threshold.is_none()
        && cpu_threshold.is_none()
        && pressure_threshold.is_none()
        && external.is_empty()
        && !t.has("memory_threshold")
        && !t.has("cpu_threshold")
        && !t.has("pressure_threshold")
        && !t.has("external")
    {
        c.error(
            Some(t.span()),
            &t.key("memory_threshold"),
            "missing: a group scales on at least one signal: memory_threshold, cpu_threshold, \
             pressure_threshold or an [[external]] table",
        );
    }
    Signals {
        memory_threshold,
        cpu_threshold,
        pressure_threshold,
        tolerance_up,
        tolerance_down,
        cpu_limit,
        external,
        schedule,
    }
}

fn external(c: &mut Collector, mut t: Fields, check_files: bool) -> Option<ExternalSpec> {
    let command = t.strings(c, "command");
    let command = t.required(c, "command", command);
    let target = t.number(c, "target");
    let target = t.required(c, "target", target);
    let timeout = t.duration_within(
        c,
        "timeout",
        Duration::from_millis(100),
        EXTERNAL_TIMEOUT_MAX,
    );
    let (command_key, target_key) = (t.key("command"), t.key("target"));
    t.finish(c, &keys::names(Table::External));
    if let Some((cmd, span)) = &command {
        match cmd.first() {
            None => c.error(
                Some(span.clone()),
                &command_key,
                "must name a program, e.g. [\"/usr/local/bin/queue-depth\", \"jobs\"]",
            ),
            Some(program) => {
                let checked = if check_files {
                    check_program(program)
                } else {
                    absolute(program)
                };
                if let Err(e) = checked {
                    c.error(Some(span.clone()), &command_key, e);
                }
            }
        }
    }
    if let Some((v, span)) = &target {
        if *v <= 0.0 {
            c.error(
                Some(span.clone()),
                &target_key,
                format!("{v} must be above 0 (the value one instance can take)"),
            );
        }
    }
    let ((command, _), (target, _)) = (command?, target?);
    (!command.is_empty() && target > 0.0).then(|| ExternalSpec {
        command,
        target,
        timeout: timeout.unwrap_or(Duration::from_secs(5)),
    })
}

/// Checks the program of an external signal (`command[0]`) for the config parser: an absolute
/// path, and what [`super::open_program`] checks again before every run (a root file that
/// nobody else can write and someone may execute, in root's directories, and a script's
/// interpreter likewise). The error names what is wrong and the fix.
pub fn check_program(path: &str) -> Result<(), String> {
    absolute(path)?;
    super::open_program(path).map(drop)
}

/// The part of [`check_program`] that reads no file: an absolute path.
fn absolute(path: &str) -> Result<(), String> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(format!(
            "the program {:?} is not an absolute path: name it from / (such as \
             /usr/local/bin/queue-depth); it is not looked up in PATH",
            crate::text::printable(path)
        ))
    }
}

fn window(c: &mut Collector, mut t: Fields) -> Option<ScheduleSpec> {
    let cron = t.string(c, "cron");
    let cron = t.required(c, "cron", cron);
    let duration = t.duration_within(c, "duration", Duration::from_secs(60), WINDOW_MAX);
    let duration = t.required(c, "duration", duration);
    let min = t.count(c, "min");
    let max = t.count(c, "max");
    let timezone = t.string(c, "timezone");
    let key = |k: &str| t.key(k);
    let (min_key, max_key, cron_key) = (key("min"), key("max"), key("cron"));
    let span = t.span();
    t.finish(c, &keys::names(Table::Schedule));
    if min.is_none() && max.is_none() {
        c.error(
            Some(span),
            &min_key,
            "a window sets min, max or both (what the group's bounds are while it is open)",
        );
    }
    if let (Some((lo, span)), Some((hi, _))) = (&min, &max) {
        if lo > hi {
            c.error(
                Some(span.clone()),
                &min_key,
                format!("min ({lo}) is greater than max ({hi})"),
            );
        }
    }
    if let Some((0, span)) = &max {
        c.error(Some(span.clone()), &max_key, "must be at least 1");
    }
    let (cron, cron_span): (String, Range<usize>) = cron?;
    if let Err(e) = crate::schedule::check(&cron, timezone.as_ref().map(|(z, _)| z.as_str())) {
        c.error(Some(cron_span), &cron_key, e);
        return None;
    }
    Some(ScheduleSpec {
        cron,
        duration: duration?,
        min: min.map(|(m, _)| m),
        max: max.map(|(m, _)| m),
        timezone: timezone.map(|(z, _)| z),
    })
}

/// Each instance's CPU limit in CPUs, from `limits.cpu` (a count, or a set such as "0-1,4") and
/// `limits.cpu.allowance` as a quota ("25ms/100ms"); the smaller when both are set. `Ok(None)`
/// when neither is; an error, with the key it is about, for a value that is neither, and for an
/// allowance given as a percentage (a soft share under contention, not a limit) when it is the
/// only one.
pub fn cpu_limit(config: &BTreeMap<String, String>) -> Result<Option<f64>, (&'static str, String)> {
    let cpus = match config.get("limits.cpu") {
        None => None,
        Some(v) => Some(cpu_count(v).map_err(|e| ("limits.cpu", e))?),
    };
    let quota = match config.get("limits.cpu.allowance") {
        None => None,
        Some(v) if v.ends_with('%') => {
            if cpus.is_none() {
                return Err((
                    "limits.cpu.allowance",
                    format!(
                        "\"limits.cpu.allowance\" = {v:?} is a share under contention, not a \
                         limit the CPU signal can be a percentage of: give a quota such as \
                         \"50ms/100ms\", or also set \"limits.cpu\""
                    ),
                ));
            }
            None
        }
        Some(v) => Some(quota(v).ok_or_else(|| {
            (
                "limits.cpu.allowance",
                format!("\"limits.cpu.allowance\" = {v:?} is not a quota such as \"50ms/100ms\""),
            )
        })?),
    };
    Ok(match (cpus, quota) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// The CPU keys are there but refused (said by [`cpu_limit`]'s error).
fn config_refused(config: &BTreeMap<String, String>) -> bool {
    cpu_limit(config).is_err()
}

/// "2" → 2 CPUs; "0-1,4" → 3 CPUs; "0-3,2" → 4 CPUs (a set: a CPU named twice counts once).
/// Counted in u64, where every set fits, and checked on the way back: a set of more CPUs than
/// a `u32` holds is an error, never a panic or a wrapped count.
fn cpu_count(v: &str) -> Result<f64, String> {
    let bad = || {
        format!("\"limits.cpu\" = {v:?} is not a number of CPUs or a set of them such as \"0-1\"")
    };
    if let Ok(n) = v.trim().parse::<u32>() {
        return if n > 0 { Ok(f64::from(n)) } else { Err(bad()) };
    }
    // Each part as an inclusive range of CPU numbers.
    let mut ranges = Vec::new();
    for part in v.split(',') {
        let number = |s: &str| s.trim().parse::<u32>().map_err(|_| bad());
        let range = match part.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => (number(part)?, number(part)?),
        };
        if range.0 > range.1 {
            return Err(bad());
        }
        ranges.push(range);
    }
    // The CPUs of the union, overlaps counted once: in u64, where 2^32 CPU numbers fit.
    ranges.sort_unstable();
    let (mut n, mut next) = (0u64, 0u64); // CPUs counted; the lowest number not counted.
    for (a, b) in ranges {
        let (from, after) = (u64::from(a).max(next), u64::from(b) + 1);
        if after > from {
            n += after - from;
            next = after;
        }
    }
    match u32::try_from(n) {
        Ok(n) => Ok(f64::from(n)),
        Err(_) => Err(format!(
            "\"limits.cpu\" = {v:?} names more than {} CPUs",
            u32::MAX
        )),
    }
}

/// "50ms/100ms" → 0.5 CPU.
fn quota(v: &str) -> Option<f64> {
    let (used, period) = v.split_once('/')?;
    let used = humantime::parse_duration(used.trim()).ok()?.as_secs_f64();
    let period = humantime::parse_duration(period.trim()).ok()?.as_secs_f64();
    (used > 0.0 && period > 0.0).then_some(used / period)
}
