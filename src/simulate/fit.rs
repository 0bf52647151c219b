//! Which traces a group can replay. Each column of a trace feeds one of the group's signals:
//! `demand_mib` its `memory_threshold`, `cpu_percent` its `cpu_threshold`, `pressure` its
//! `pressure_threshold`, `external` its `[[external]]` programs. A column for a signal the
//! group does not have is refused (nothing would read it, and the scores would say nothing
//! about it); a signal of the group without a column reads idle throughout (no memory demand,
//! no CPU, no pressure, an external value of 0), and a note says so. The step rule reads
//! memory only: it replays `t,demand_mib` traces only.

use std::path::Path;

use super::{Column, Trace};
use crate::model::GroupSpec;

/// The setting that makes `column` a signal of a group, and whether `spec` has it.
fn signal(spec: &GroupSpec, column: Column) -> (&'static str, bool) {
    match column {
        Column::DemandMib => ("memory_threshold", spec.memory_threshold.is_some()),
        Column::CpuPercent => ("cpu_threshold", spec.cpu_threshold.is_some()),
        Column::Pressure => ("pressure_threshold", spec.pressure_threshold.is_some()),
        Column::External => ("[[external]] program", !spec.external.is_empty()),
    }
}

/// What a signal reads as without its column.
fn idle(column: Column) -> &'static str {
    match column {
        Column::DemandMib => "the group's memory reads its base use (no demand)",
        Column::CpuPercent => "the group's CPU reads 0 %",
        Column::Pressure => "the group's pressure reads 0",
        Column::External => "the group's external programs read 0",
    }
}

/// Checks that `trace` (read from `file`) fits the group `spec`: every column one of its
/// signals. The error names the file, the header's line and each column at fault; `Ok` holds
/// the notes for the signals without a column.
pub fn check(spec: &GroupSpec, trace: &Trace, file: &Path) -> Result<Vec<String>, String> {
    let at = format!("{}:{}", file.display(), trace.header_line());
    let group = spec.name.as_str();
    let its: Vec<Column> = Column::ALL
        .into_iter()
        .filter(|c| signal(spec, *c).1)
        .collect();
    let names = |columns: &[Column]| {
        columns
            .iter()
            .map(|c| format!("`{}`", c.name()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut problems: Vec<String> = trace
        .columns()
        .iter()
        .filter(|c| !its.contains(c))
        .map(|c| {
            format!(
                "{at}: column `{}`: group {group:?} has no {}, so nothing would read it",
                c.name(),
                signal(spec, *c).0
            )
        })
        .collect();
    if !its.iter().any(|c| trace.has(*c)) {
        problems.push(if its.is_empty() {
            format!("{at}: group {group:?} has no signal to scale on")
        } else {
            format!(
                "{at}: group {group:?} scales on {}, and the trace has no such column",
                names(&its)
            )
        });
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    Ok(its
        .into_iter()
        .filter(|c| !trace.has(*c))
        .map(|c| format!("{at}: note: no `{}` column: {}", c.name(), idle(c)))
        .collect())
}

/// Whether the step rule can replay `trace`: it reads memory only.
pub fn step_fits(trace: &Trace) -> bool {
    trace.columns() == [Column::DemandMib]
}
