//! The bounds in force, and how a count outside them is brought back. An open schedule window
//! replaces the group's `min` and `max`. Below `min`, the count is raised at once. Above
//! `max`, it depends on where the excess comes from (`History::allowed` remembers it):
//!
//! - a `max` lowered in the file (or a count the daemon found above everything allowed, with
//!   no history to say more): lowered at once (`above-max`);
//! - an open window's `max` below the group's: the operator's calendar, not a reading that may
//!   come back, so no stabilization window, but the step limits (`schedule-max`);
//! - what a window allowed above the group's `max`, once it has closed: like any scale-down,
//!   through the scale-down stabilization window and the step limits (`window-closed`).
//!
//! Pure, like the rest of `decide`.

use crate::model::{GroupSpec, Reason, Window};

/// How a pass moves the desired count to its recommendation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    /// At once: restoring `min`, or a `max` lowered in the file.
    AtOnce,
    /// Within the step limits only: down to the lower `max` of an open schedule window.
    Stepped,
    /// Through the scale-down stabilization window and the step limits: down to `max` after
    /// a schedule window that allowed more closed.
    WindDown,
    /// The signals' recommendation, through the stabilization windows and the step limits.
    Signals,
}

/// The group as an open schedule window makes it: its `min` and `max` replaced by the
/// window's (a `min` above the group's `max` raises the `max` with it); `None` when no window
/// changes them.
pub(super) fn scheduled(spec: &GroupSpec, window: Option<Window>) -> Option<GroupSpec> {
    let w = window?;
    let min = w.min.unwrap_or(spec.min);
    let max = w.max.unwrap_or(spec.max).max(min);
    let min = min.min(max);
    ((min, max) != (spec.min, spec.max)).then(|| GroupSpec {
        min,
        max,
        ..spec.clone()
    })
}

/// For a desired count `base` outside the bounds of `spec` (the bounds in force), the bound
/// it goes to, why, and how; `None` within them. `file_max` is the group's own `max`,
/// `allowed` the count windows allowed above it that goes down gradually
/// (`History::allowed`), `window_min` whether an open window's `min` is in force.
pub(super) fn outside(
    spec: &GroupSpec,
    file_max: u32,
    allowed: u32,
    base: u32,
    window_min: bool,
) -> Option<(u32, Reason, Way)> {
    let max = spec.max;
    if base < spec.min {
        let why = if window_min {
            Reason::ScheduleMin
        } else {
            Reason::BelowMin
        };
        Some((spec.min, why, Way::AtOnce))
    } else if base > max.max(allowed) {
        // Above everything the file and the windows allowed: a max lowered in the file.
        Some((max.max(allowed), Reason::AboveMax, Way::AtOnce))
    } else if base > max && max < file_max {
        Some((max, Reason::ScheduleMax, Way::Stepped))
    } else if base > max {
        Some((max, Reason::WindowClosed, Way::WindDown))
    } else {
        None
    }
}
