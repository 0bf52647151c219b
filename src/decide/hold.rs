//! How long the `adaptive` policy holds instances after its recommendation drops: a rent-or-buy
//! choice, learned from the group's own history. Pure, like the rest of `decide`.
//!
//! When the recommendation drops from a to b, each level b+1..=a is "away" until a later
//! recommendation reaches it again. Holding a level costs its instance for as long as it is
//! held; letting it go and taking it back costs a removal, a creation, and whatever the group
//! went through while the load was back and the instance was not (overloaded or at the limit
//! until a new one was ready). For every level that dropped in the last hour, the policy knows
//! how long it stayed away (or that it stayed away longer than the group's full window), and
//! picks the window that would have cost least over all of them: from 0 (let go at once) up
//! to `scale_down_stabilization`, in steps of `interval`. A load that drops and comes back
//! within a minute gets a window that covers the minute; one that drops and ramps back over
//! ten is let go at once, its instances added back as the ramp asks for them.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::GroupSpec;

/// How long a drop is remembered.
pub const MEMORY: Duration = Duration::from_secs(3600);
/// The window before any drop has come back or stayed away a full window.
pub const FIRST_WINDOW: Duration = Duration::from_secs(60);
/// The most drops remembered (the oldest are forgotten first).
const MOST: usize = 1024;
/// What a removal and the creation that takes it back cost, in instance-minutes held (the
/// simulator's `2 × churn` per instance, against its 1/60 per instance-second held).
const CHURN_MINUTES: f64 = 4.0;

/// One level that dropped: when it came back (or was found away for a full window), after how
/// long (`None`: longer than the full window), and what its return cost the group, in the
/// same instance-minutes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Gap {
    pub(super) at: Instant,
    pub(super) away: Option<Duration>,
    pub(super) cost: f64,
}

/// What the hold learns across passes.
#[derive(Debug, Clone, Default)]
pub struct Hold {
    /// The levels the recommendation dropped below and has not reached since: when it was last
    /// at them.
    pub(super) away: BTreeMap<u32, Instant>,
    pub(super) gaps: VecDeque<Gap>,
    /// The last recommendation, and when it was made.
    pub(super) last: Option<(Instant, u32)>,
}

/// The window in force, and what it was learned from (shown by `status` and the journal).
pub type Learned = crate::model::HoldWindow;

impl Hold {
    /// Takes in the recommendation of a pass; `return_cost` is what the group went through at
    /// this pass for want of instances (instance-minutes: a second overloaded is a minute of
    /// an instance, a second at the limit eleven).
    pub fn observe(
        &mut self,
        spec: &GroupSpec,
        now: Instant,
        recommendation: u32,
        return_cost: f64,
    ) {
        let full = spec.scale_down_stabilization;
        // Levels the recommendation reaches again came back.
        let back: Vec<u32> = self
            .away
            .range(..=recommendation)
            .map(|(l, _)| *l)
            .collect();
        // What the group went through is shared by the levels that came back together.
        let share = return_cost / back.len().max(1) as f64;
        for level in back {
            if let Some(since) = self.away.remove(&level) {
                self.remember(Gap {
                    at: now,
                    away: Some(now.saturating_duration_since(since)),
                    cost: CHURN_MINUTES + share,
                });
            }
        }
        // Levels away longer than the full window are settled: no window would have held them.
        let stale: Vec<u32> = self
            .away
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) > full)
            .map(|(l, _)| *l)
            .collect();
        for level in stale {
            self.away.remove(&level);
            self.remember(Gap {
                at: now,
                away: None,
                cost: 0.0,
            });
        }
        // A drop: the levels it left were last reached by the previous recommendation.
        if let Some((then, before)) = self.last {
            for level in recommendation + 1..=before {
                self.away.entry(level).or_insert(then);
            }
        }
        self.last = Some((now, recommendation));
        while self
            .gaps
            .front()
            .is_some_and(|g| now.saturating_duration_since(g.at) > MEMORY)
        {
            self.gaps.pop_front();
        }
    }

    fn remember(&mut self, gap: Gap) {
        self.gaps.push_back(gap);
        if self.gaps.len() > MOST {
            self.gaps.pop_front();
        }
    }

    /// The window that would have cost least over the drops remembered (the shortest of
    /// equals), within the group's `scale_down_stabilization`; [`FIRST_WINDOW`] (or the full
    /// window, if shorter) before anything is learned.
    pub fn learned(&self, spec: &GroupSpec) -> Learned {
        let full = spec.scale_down_stabilization;
        if self.gaps.is_empty() {
            return Learned {
                window: full.min(FIRST_WINDOW),
                drops: 0,
                back_within: 0,
                level: None,
                forecast: None,
            };
        }
        let step = spec.interval.max(Duration::from_secs(1));
        let steps = (full.as_secs_f64() / step.as_secs_f64()).floor() as u32;
        let candidates = (0..=steps).map(|k| step * k).chain([full]);
        let cost = |w: Duration| -> f64 {
            let minutes = |d: Duration| d.as_secs_f64() / 60.0;
            self.gaps
                .iter()
                .map(|g| match g.away {
                    Some(a) if a <= w => minutes(a),
                    _ => minutes(w) + g.cost,
                })
                .sum()
        };
        let mut best = (Duration::ZERO, f64::INFINITY);
        for w in candidates.filter(|w| *w <= full) {
            let c = cost(w);
            if c < best.1 - 1e-9 {
                best = (w, c);
            }
        }
        let window = best.0;
        Learned {
            window,
            drops: self.gaps.len(),
            back_within: self
                .gaps
                .iter()
                .filter(|g| g.away.is_some_and(|a| a <= window))
                .count(),
            level: None,
            forecast: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> GroupSpec {
        crate::decide::tests::spec(1, 20, 50.0)
    }

    /// Feeds `recs` every 15 s from `t0` on, each with no cost to its return but `cost`.
    fn feed(hold: &mut Hold, t0: Instant, recs: &[u32], cost: f64) {
        for (k, r) in recs.iter().enumerate() {
            hold.observe(&spec(), t0 + Duration::from_secs(15 * k as u64), *r, cost);
        }
    }

    #[test]
    fn drops_that_come_back_soon_are_held_and_slow_ones_let_go() {
        let t0 = Instant::now();
        // 4, then 1 for a minute, then 4 again (at the limit: 11 × 7.5 instance-minutes).
        let mut hold = Hold::default();
        assert_eq!(hold.learned(&spec()).window, FIRST_WINDOW);
        feed(&mut hold, t0, &[4, 1, 1, 1, 1, 4], 82.5);
        let learned = hold.learned(&spec());
        // Away 75 s from the last pass at 4: held 75 s costs 1.25 instance-minutes each.
        assert_eq!(
            (learned.window, learned.drops, learned.back_within),
            (Duration::from_secs(75), 3, 3)
        );

        // 4, then 1 for ten minutes, again and again: each level stays away longer than the
        // full window (300 s), and no window would have saved anything.
        let mut hold = Hold::default();
        let cycle: Vec<u32> = std::iter::once(4).chain([1; 40]).collect();
        feed(&mut hold, t0, &cycle.repeat(3), 0.0);
        let learned = hold.learned(&spec());
        assert_eq!((learned.window, learned.back_within), (Duration::ZERO, 0));
        assert!(learned.drops >= 6, "{learned:?}");

        // Back after 4 minutes without harm: the removal and creation (4 instance-minutes)
        // cost as much as holding; the shorter wins.
        let mut hold = Hold::default();
        let slow: Vec<u32> = std::iter::once(2).chain([1; 15]).chain([2]).collect();
        feed(&mut hold, t0, &slow, 0.0);
        assert_eq!(hold.learned(&spec()).window, Duration::ZERO);
    }
}
