//! The simulated clock's calendar, for schedule windows: second `t` of a trace is the instant
//! `start + t`, by default [`START`] (2026-01-05T00:00:00Z, a Monday, so that a trace's first
//! day is a Monday at midnight; `--start` moves it). A group's windows are compiled as the
//! daemon compiles them ([`crate::schedule::Windows`]); a window without a `timezone` uses UTC
//! rather than the host's zone, so that a run gives the same answer on every machine.

use std::time::{Duration, SystemTime};

use crate::model::{ScheduleSpec, Window};
use crate::schedule::{Windows, Zone};

/// Where a trace's `t = 0` falls unless `--start` says otherwise, as RFC 3339.
pub const START: &str = "2026-01-05T00:00:00Z";

/// [`START`] as an instant.
pub fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_571_200)
}

/// Reads `--start`: an RFC 3339 instant with its offset, such as `2026-01-05T08:00:00+01:00`.
pub fn parse_start(text: &str) -> Result<SystemTime, String> {
    text.parse::<jiff::Timestamp>()
        .map(SystemTime::from)
        .map_err(|e| format!("{text:?} is not an RFC 3339 instant such as {START}: {e}"))
}

/// A group's schedule windows on a trace's clock.
#[derive(Debug, Clone)]
pub struct Clock {
    start: SystemTime,
    /// `None`: no window.
    windows: Option<Windows>,
}

impl Clock {
    /// `schedule`'s windows with `t = 0` at `start`; the error is the one the config parser
    /// would give.
    pub fn new(schedule: &[ScheduleSpec], start: SystemTime) -> Result<Clock, String> {
        Ok(Clock {
            start,
            windows: Some(Windows::new(schedule, &Zone::UTC)?).filter(|w| !w.is_empty()),
        })
    }

    /// A clock without windows.
    pub fn without_windows(start: SystemTime) -> Clock {
        Clock {
            start,
            windows: None,
        }
    }

    /// The bounds of the windows open at second `t` (`None`: none is open, as the daemon puts
    /// it in an observation) and the second, after `t`, when that next changes (`None`: never).
    pub fn at(&self, t: u64) -> (Option<Window>, Option<u64>) {
        let Some(windows) = &self.windows else {
            return (None, None);
        };
        let bounds = windows.at(self.start + Duration::from_secs(t));
        let window = (!bounds.open.is_empty()).then_some(Window {
            min: bounds.min,
            max: bounds.max,
        });
        let next = bounds.next_change.map(|change| {
            let after = change
                .duration_since(self.start)
                .map_or(0, |d| d.as_secs_f64().ceil() as u64);
            after.max(t + 1)
        });
        (window, next)
    }
}
