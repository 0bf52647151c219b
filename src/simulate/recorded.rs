//! A group's own recorded passes (`crate::history`) as a trace `simulate` replays, and the
//! `--set KEY=VALUE` changes a replay makes to the group's table. Pure: the rows and the text
//! come in, a trace's CSV and a desired state's text go out.
//!
//! A row says what the group's measured instances used (their working sets, `demand_mib`) with
//! the count then; the trace's demand is what they used beyond each instance's base use
//! (`--base-mib`), as the simulated instances add it back. The CPU column is the group's CPU
//! signal times the count (percent of one instance's limit); pressure and the external value
//! are taken as they were read. A pass without a reading keeps the value before it. Time runs
//! from the first row; while the daemon was stopped the values are those of the last row
//! before.

use std::fmt::Write;

use crate::history::Record;
use crate::model::GroupSpec;

/// What the rows say happened: instance-hours, the highest count, the OOM kills.
#[derive(Debug, Clone, PartialEq)]
pub struct AsRecorded {
    pub seconds: f64,
    pub instance_hours: f64,
    pub peak: u32,
    pub oom_kills: u64,
}

/// What `rows` (oldest first) say happened.
pub fn as_recorded(rows: &[Record]) -> AsRecorded {
    let mut instance_s = 0.0;
    for pair in rows.windows(2) {
        let dt = (pair[1].unix_ms - pair[0].unix_ms).max(0) as f64 / 1000.0;
        instance_s += f64::from(pair[0].current) * dt;
    }
    AsRecorded {
        seconds: match (rows.first(), rows.last()) {
            (Some(a), Some(b)) => (b.unix_ms - a.unix_ms).max(0) as f64 / 1000.0,
            _ => 0.0,
        },
        instance_hours: instance_s / 3600.0,
        peak: rows.iter().map(|r| r.current).max().unwrap_or(0),
        oom_kills: rows.iter().map(|r| u64::from(r.oom_kills)).sum(),
    }
}

/// `rows` (oldest first, at least two) as a trace for the group `spec`: a column for each of
/// its signals the rows read (memory, CPU, pressure, its first external value).
pub fn trace_csv(spec: &GroupSpec, rows: &[Record], base_mib: f64) -> Result<String, String> {
    let (Some(first), Some(_)) = (rows.first(), rows.get(1)) else {
        return Err("fewer than two passes recorded: nothing to replay".into());
    };
    type Pick = fn(&Record, f64) -> Option<f64>;
    let all: [(bool, &str, Pick); 4] = [
        (spec.memory_threshold.is_some(), "demand_mib", |r, base| {
            r.demand_mib
                .map(|d| (d - f64::from(r.current) * base).max(0.0))
        }),
        (spec.cpu_threshold.is_some(), "cpu_percent", |r, _| {
            r.cpu_pct.map(|c| (c * f64::from(r.current)).max(0.0))
        }),
        (spec.pressure_threshold.is_some(), "pressure", |r, _| {
            r.pressure_pct.map(|p| p.clamp(0.0, 100.0))
        }),
        (!spec.external.is_empty(), "external", |r, _| r.external),
    ];
    let columns: Vec<(&str, Pick)> = all
        .into_iter()
        .filter(|(used, _, pick)| *used && rows.iter().any(|r| pick(r, base_mib).is_some()))
        .map(|(_, name, pick)| (name, pick))
        .collect();
    if columns.is_empty() {
        return Err("no reading of the group's signals was recorded: nothing to replay".into());
    }
    let mut out = format!("# recorded: group {}, {} passes\nt", spec.name, rows.len());
    for (name, _) in &columns {
        let _ = write!(out, ",{name}");
    }
    out.push('\n');
    let mut last: Vec<f64> = vec![0.0; columns.len()];
    let mut written: Option<Vec<f64>> = None;
    let end = rows.len() - 1;
    for (k, r) in rows.iter().enumerate() {
        for (i, (_, pick)) in columns.iter().enumerate() {
            if let Some(v) = pick(r, base_mib) {
                last[i] = (v * 1000.0).round() / 1000.0;
            }
        }
        if written.as_ref() != Some(&last) || k == end {
            let t = (r.unix_ms - first.unix_ms).max(0) as f64 / 1000.0;
            let _ = write!(out, "{t}");
            for v in &last {
                let _ = write!(out, ",{v}");
            }
            out.push('\n');
            written = Some(last.clone());
        }
    }
    Ok(out)
}

/// `text` (a desired-state file) with each `KEY=VALUE` of `sets` set in `[groups.GROUP]`:
/// `KEY` a key of the group's table (`config.NAME` for an instance config key), `VALUE` a TOML
/// value (`2`, `true`, `"2m"`), or else taken as a string (`2m`, `kubernetes`, `128MiB`).
pub fn apply_sets(text: &str, group: &str, sets: &[String]) -> Result<String, String> {
    if sets.is_empty() {
        return Ok(text.to_owned());
    }
    let mut doc: toml::Table = text.parse().map_err(|e| format!("{e}"))?;
    for set in sets {
        let Some((key, value)) = set.split_once('=') else {
            return Err(format!("--set {set:?}: write it KEY=VALUE, e.g. min=2"));
        };
        let key = key.trim();
        let value = value.trim();
        let parsed = format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_owned()));
        let table = doc
            .get_mut("groups")
            .and_then(|g| g.get_mut(group))
            .and_then(toml::Value::as_table_mut)
            .ok_or_else(|| format!("--set {set:?}: no group {group:?} in the file"))?;
        let (table, key) = match key.split_once('.') {
            Some(("config", name)) => (
                table
                    .entry("config")
                    .or_insert_with(|| toml::Value::Table(Default::default()))
                    .as_table_mut()
                    .ok_or_else(|| {
                        format!("--set {set:?}: groups.{group}.config is not a table")
                    })?,
                name,
            ),
            Some(_) => {
                return Err(format!(
                    "--set {set:?}: a key of [groups.{group}], or config.NAME for an instance \
                     config key"
                ))
            }
            None => (table, key),
        };
        if key.is_empty() {
            return Err(format!("--set {set:?}: no key"));
        }
        table.insert(key.to_owned(), parsed);
    }
    toml::to_string(&doc).map_err(|e| e.to_string())
}

#[cfg(test)]
#[path = "recorded_tests.rs"]
mod tests;
