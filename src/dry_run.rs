//! `incus-hpa plan`: each group observed and decided once, as the daemon's pass would, acted
//! on nothing. [`plan`] writes what it found; [`crate::app::plan`] loads the file and reaches
//! Incus around it.
//!
//! Like a pass, it decides with every signal: memory, CPU and pressure as read now (CPU has
//! no reading in a single look, as in the daemon's first pass), each external program run
//! once through [`crate::external::read`] (a failure is said as the journal says it, and the
//! signal has no reading), and the schedule windows open now. Unlike a pass, it starts from an
//! empty history: no stabilization window holds a recommendation back.

use std::fmt::Write as _;
use std::time::SystemTime;

use tokio::time::Instant;

use crate::decide::{decide, History};
use crate::incus::{Incus, IncusError};
use crate::informer::Store;
use crate::memory::MemorySource;
use crate::model::{DesiredState, GroupSpec, Window};
use crate::observe::observe;
use crate::report::fmt_util;
use crate::schedule::{Windows, Zone};

/// A group that could not be observed.
#[derive(Debug, thiserror::Error)]
#[error("observing group {group}: {source}")]
pub struct PlanError {
    pub group: String,
    #[source]
    pub source: IncusError,
}

/// Whether [`plan`] runs the groups' external programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Programs {
    /// Each once, as the daemon does at each pass.
    Run,
    /// None: their signals have no reading (the caller says why).
    NotRun,
}

/// Observes and decides once per group of `state`, acting on nothing; returns what it shows,
/// a paragraph per group: its count, signals and recommendation, the external programs that
/// gave no reading, then its instances. With [`Programs::Run`], every group's programs run at
/// once, before anything is observed: it takes as long as the slowest (its `timeout` at most).
pub async fn plan(
    incus: &dyn Incus,
    memory: &dyn MemorySource,
    store: &Store,
    state: &DesiredState,
    programs: Programs,
) -> Result<String, PlanError> {
    let readings = match programs {
        Programs::Run => {
            let groups = state.groups.values().map(|spec| {
                futures_util::future::join_all(spec.external.iter().map(crate::external::read))
            });
            futures_util::future::join_all(groups).await
        }
        Programs::NotRun => Vec::new(),
    };
    let now = Instant::now();
    let wall = SystemTime::now();
    let resync = state.daemon.resync;
    let mut out = String::new();
    // Each group with checks is checked once, just before it is observed.
    let board = crate::ready::Board::default();
    for (g, spec) in state.groups.values().enumerate() {
        crate::ready::check_once(incus, store, &board, spec, resync).await;
        let mut obs = observe(incus, memory, store, &board, spec, resync)
            .await
            .map_err(|source| PlanError {
                group: spec.name.to_string(),
                source,
            })?;
        let read = readings.get(g).map_or(&[][..], Vec::as_slice);
        obs.external = (0..spec.external.len())
            .map(|i| read.get(i).and_then(|r| r.as_ref().ok().copied()))
            .collect();
        obs.window = window(spec, wall);
        // A fresh history would hold every scale-down back: show the bare recommendation.
        let p = decide(spec, &obs, &mut History::default(), now);
        let signals: Vec<String> = p
            .signals
            .iter()
            .map(|s| {
                let value = s
                    .value
                    .map_or_else(|| "unknown".into(), |v| format!("{v:.1}"));
                let wants = s.wants.map_or_else(|| "-".into(), |w| w.to_string());
                format!("{} {value} (target {}) wants {wants}", s.name, s.target)
            })
            .collect();
        let _ = writeln!(
            out,
            "{}: {} instance(s), {}; recommends {} ({})",
            spec.name,
            p.current,
            signals.join(", "),
            p.recommendation,
            p.reason
        );
        for (i, result) in read.iter().enumerate() {
            if let Err(e) = result {
                let program = spec.external[i].command.first().map_or("", String::as_str);
                let said = crate::external::no_reading(spec.name.as_str(), i, program, e);
                let _ = writeln!(out, "  {said}");
            }
        }
        for i in &obs.instances {
            let mem = i
                .memory
                .map_or_else(|| "-".into(), |m| fmt_util(m.percent()));
            let _ = writeln!(out, "  {:<24} {:?} {mem}", i.name, i.status);
        }
    }
    Ok(out)
}

/// The bounds of the group's schedule windows open at `wall`, as a pass reads them (the
/// host's zone for a window that names none, UTC when it cannot be told).
fn window(spec: &GroupSpec, wall: SystemTime) -> Option<Window> {
    if spec.schedule.is_empty() {
        return None;
    }
    let host = Zone::host().unwrap_or(Zone::UTC);
    // The parser checked every expression and zone.
    Windows::new(&spec.schedule, &host).ok()?.at(wall).window()
}
