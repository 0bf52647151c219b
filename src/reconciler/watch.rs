//! The watch between passes ([`Reconciler::peek`]): every [`PEEK_EVERY`], what the instances
//! of the `adaptive` groups that scale on memory use, read where that costs no request to
//! incusd, wakes a group whose instance reached its limit, or that went above its tolerance,
//! since its last pass, or whose instance new since the last pass reached its limit.

use std::time::Duration;

use tokio::time::Instant;

use super::{Reconciler, PEEK_EVERY};
use crate::model::Memory;

impl Reconciler {
    /// The watch between passes: for each group of the `adaptive` policy that scales on memory,
    /// reads what its instances use where that costs no request to incusd (one cgroup file
    /// each on this host; the whole reading of one near its limit, and of all of them when
    /// the files put the group above its tolerance), and makes the group due at `now` when
    /// one of them reached its limit, or the group went above its tolerance, since the last
    /// pass, or one the last pass did not measure (it created it) reached its limit
    /// ([`crate::decide::adaptive::wakes`]). Not for a group backing off, in standby, with
    /// a pass in flight, or with a pass due within [`PEEK_EVERY`].
    pub fn peek(&mut self, now: Instant) {
        use crate::decide::adaptive::{at_limit, strain, wakes, Strain};
        for g in self.groups.values_mut() {
            let since = g
                .done
                .map_or(Duration::ZERO, |d| now.saturating_duration_since(d));
            if g.failures > 0
                || g.busy()
                || g.next <= now + PEEK_EVERY
                || !wakes(&g.spec, g.strain, Strain::NewAtLimit, since)
                || self
                    .ctx
                    .leases
                    .standing(&g.spec.project, g.spec.name.as_str())
                    .standby()
                    .is_some()
            {
                continue;
            }
            let project = &g.spec.project;
            let memory = &self.memory;
            // What the files tell: each instance's usage (one file) against the limit the last
            // pass read; the whole reading of one whose limit is not known yet (`true`). A
            // group at its limit at the last pass only has those to read: only a new one at
            // its limit wakes it.
            let at_limit_then = g.strain >= Strain::AtLimit;
            let told: Vec<(&str, Option<Memory>, bool)> = g
                .watched
                .iter()
                .filter(|(_, limit)| limit.is_none() || !at_limit_then)
                .map(|(name, limit)| match limit {
                    Some(limit) => {
                        let m = memory.usage(project, name).map(|usage| Memory {
                            usage,
                            limit: *limit,
                            ..Default::default()
                        });
                        (name.as_str(), m, false)
                    }
                    None => (name.as_str(), memory.peek(project, name), true),
                })
                .collect();
            // Page cache counts in a file's usage: the whole reading (the working set) says
            // whether an instance is full, or the group above its tolerance.
            let whole = |(name, told, is_whole): &(&str, Option<Memory>, bool)| {
                if *is_whole {
                    *told
                } else {
                    memory.peek(project, name)
                }
            };
            let full = |t: &&(&str, Option<Memory>, bool)| {
                t.1.is_some_and(|m| at_limit(&m)) && whole(t).is_some_and(|m| at_limit(&m))
            };
            // One the last pass did not measure (it created it, or it had no reading then) is
            // read whole: at its limit too, the pass added too few.
            let new = told.iter().filter(|t| t.2).find(full);
            let (now_strain, why) = if let Some((name, _, _)) = new {
                (
                    Strain::NewAtLimit,
                    format!("{name}, new since the last pass, reached its memory limit"),
                )
            } else if let Some((name, _, _)) = told.iter().find(full) {
                (Strain::AtLimit, format!("{name} reached its memory limit"))
            } else if g.strain < Strain::AboveTolerance
                && strain(&g.spec, told.iter().filter_map(|t| t.1)) >= Strain::AboveTolerance
            {
                // The files put the group above its tolerance: the whole readings, every one
                // of them, say whether it is.
                let readings: Option<Vec<Memory>> = told.iter().map(whole).collect();
                let s = readings.map_or(Strain::Within, |r| strain(&g.spec, r));
                (s, "its memory went above its tolerance".to_owned())
            } else {
                (Strain::Within, String::new())
            };
            if wakes(&g.spec, g.strain, now_strain, since) {
                tracing::debug!(group = %g.spec.name, "{why}: reconciling {} now", g.spec.name);
                g.next = now;
            }
        }
    }
}
