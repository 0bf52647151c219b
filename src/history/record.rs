//! One pass of one group as the history keeps it: a CSV row of what the pass saw and decided.
//! The same row is written at pass resolution (`passes.csv`) and, a day later, folded into one
//! row per minute (`minutes.csv`): the highest of each figure within the minute, the kills
//! summed, the last reason.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::SystemTime;

use crate::model::{Observation, Plan};

/// The first line of each history file.
pub const HEADER: &str =
    "unix_ms,current,desired,demand_mib,limit_mib,memory_pct,cpu_pct,pressure_pct,external,oom_kills,reason";

/// One pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// When the pass decided, milliseconds since the Unix epoch.
    pub unix_ms: i64,
    /// The capacity the pass found.
    pub current: u32,
    /// The count it decided.
    pub desired: u32,
    /// What the measured healthy instances used, MiB (working sets); `None`: none measured.
    pub demand_mib: Option<f64>,
    /// Their mean memory limit, MiB.
    pub limit_mib: Option<f64>,
    /// The signals' readings (percent; an external signal's value): `None` without one.
    pub memory_pct: Option<f64>,
    pub cpu_pct: Option<f64>,
    pub pressure_pct: Option<f64>,
    /// The first external signal's value.
    pub external: Option<f64>,
    /// Instances the OOM killer killed in since the pass before.
    pub oom_kills: u32,
    /// The decision's reason, as the journal's `REASON` names it.
    pub reason: String,
}

const MIB: f64 = 1024.0 * 1024.0;

/// `t` in milliseconds since the Unix epoch, as rows keep time (0 before it).
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The instant of `unix_ms` (the epoch for a time before it).
pub fn at_unix_ms(unix_ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(unix_ms).unwrap_or(0))
}

impl Record {
    /// The row of a pass that observed `obs` and planned `plan` at `unix_ms`; `kills` holds
    /// each instance's OOM counter of the pass before and takes in this pass' counters.
    pub fn of(
        obs: &Observation,
        plan: &Plan,
        unix_ms: i64,
        kills: &mut BTreeMap<String, u64>,
    ) -> Record {
        let measured: Vec<_> = obs
            .instances
            .iter()
            .filter(|i| i.status.is_healthy())
            .filter_map(|i| i.memory)
            .collect();
        let n = measured.len() as f64;
        let signal = |name: &str| {
            plan.signals
                .iter()
                .find(|s| s.name == name)
                .and_then(|s| s.value)
        };
        let killed = crate::decide::adaptive::new_kills(
            kills,
            obs.instances
                .iter()
                .map(|i| (i.name.as_str(), i.memory.and_then(|m| m.oom_kills))),
        );
        Record {
            unix_ms,
            current: plan.current,
            desired: plan.desired,
            demand_mib: (n > 0.0).then(|| {
                measured
                    .iter()
                    .map(|m| m.usage.min(m.limit) as f64)
                    .sum::<f64>()
                    / MIB
            }),
            limit_mib: (n > 0.0)
                .then(|| measured.iter().map(|m| m.limit as f64).sum::<f64>() / n / MIB),
            memory_pct: signal("memory"),
            cpu_pct: signal("cpu"),
            pressure_pct: signal("pressure"),
            external: signal("external 1"),
            oom_kills: killed.len() as u32,
            reason: plan.reason.as_str().to_owned(),
        }
    }

    /// The row, with its line end.
    pub fn line(&self) -> String {
        let mut out = String::with_capacity(96);
        let _ = write!(out, "{},{},{}", self.unix_ms, self.current, self.desired);
        for v in [
            self.demand_mib,
            self.limit_mib,
            self.memory_pct,
            self.cpu_pct,
            self.pressure_pct,
            self.external,
        ] {
            out.push(',');
            if let Some(v) = v {
                // Three decimals: a kibibyte of a MiB, a thousandth of a percent.
                let _ = write!(out, "{}", (v * 1000.0).round() / 1000.0);
            }
        }
        let _ = writeln!(out, ",{},{}", self.oom_kills, self.reason);
        out
    }

    /// The record of one row (without its line end); `None` when it is not one.
    pub fn parse(row: &str) -> Option<Record> {
        let f: Vec<&str> = row.split(',').collect();
        if f.len() != 11 {
            return None;
        }
        let num = |s: &str| -> Option<Option<f64>> {
            if s.is_empty() {
                Some(None)
            } else {
                s.parse::<f64>().ok().filter(|v| v.is_finite()).map(Some)
            }
        };
        let reason = f[10];
        if reason.is_empty() || !reason.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
            return None;
        }
        Some(Record {
            unix_ms: f[0].parse().ok()?,
            current: f[1].parse().ok()?,
            desired: f[2].parse().ok()?,
            demand_mib: num(f[3])?,
            limit_mib: num(f[4])?,
            memory_pct: num(f[5])?,
            cpu_pct: num(f[6])?,
            pressure_pct: num(f[7])?,
            external: num(f[8])?,
            oom_kills: f[9].parse().ok()?,
            reason: reason.to_owned(),
        })
    }

    /// Takes `other`, a later pass of the same minute, into this minute's row.
    pub fn fold(&mut self, other: &Record) {
        let high = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.current = self.current.max(other.current);
        self.desired = self.desired.max(other.desired);
        self.demand_mib = high(self.demand_mib, other.demand_mib);
        self.limit_mib = other.limit_mib.or(self.limit_mib);
        self.memory_pct = high(self.memory_pct, other.memory_pct);
        self.cpu_pct = high(self.cpu_pct, other.cpu_pct);
        self.pressure_pct = high(self.pressure_pct, other.pressure_pct);
        self.external = high(self.external, other.external);
        self.oom_kills = self.oom_kills.saturating_add(other.oom_kills);
        self.reason.clone_from(&other.reason);
    }
}

#[cfg(test)]
impl Record {
    /// A pass at `unix_ms` that found `current` instances using `demand_mib`, decided to keep
    /// them, and read nothing else: what tests build on.
    pub fn sample(unix_ms: i64, current: u32, demand_mib: Option<f64>) -> Record {
        Record {
            unix_ms,
            current,
            desired: current,
            demand_mib,
            limit_mib: None,
            memory_pct: None,
            cpu_pct: None,
            pressure_pct: None,
            external: None,
            oom_kills: 0,
            reason: "within-tolerance".into(),
        }
    }
}

/// `rows` (oldest first) folded into one row per minute, each at the minute's start.
pub fn by_minute(rows: impl IntoIterator<Item = Record>) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    for mut r in rows {
        let minute = r.unix_ms.div_euclid(60_000) * 60_000;
        match out.last_mut() {
            Some(last) if last.unix_ms == minute => last.fold(&r),
            _ => {
                r.unix_ms = minute;
                out.push(r);
            }
        }
    }
    out
}
