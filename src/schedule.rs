//! Schedule windows (`[[groups.NAME.schedule]]`): a cron expression opens a window for a
//! `duration`, and while it is open the group's `min` (and `max`, if given) are replaced.
//!
//! [`check`] tells the config parser what is wrong with an expression or a zone; [`Windows`]
//! is a group's windows compiled once, and [`Windows::at`] says, purely, which are open at a
//! given instant, what bounds they set and when that next changes. Expressions are parsed and
//! searched by `croner`, zones come from `jiff` and the IANA database it bundles (no zoneinfo
//! file is read). The only IO is [`Zone::host`], which reads the host's zone once, outside the
//! evaluation.
//!
//! # Semantics
//!
//! A window is open at `now` iff the latest time its expression matched at or before `now`
//! (on the wall clock of its zone) is within `duration` before `now`:
//! `match <= now < match + duration`. The start instant is open, the end instant is closed.
//! Durations are real elapsed time: a 10h window opened at 00:00 local on the night clocks go
//! forward ends at 11:00 local. A match that comes while the window is still open keeps it
//! open for another `duration` from that match. A zero duration never opens.
//!
//! Overlapping windows: the open windows' highest `min` and highest `max` apply (a busier
//! window wins on both ends); a bound no open window gives stays the group's own.
//!
//! Expressions have five fields (minute hour day-of-month month day-of-week); a sixth for
//! seconds or a seventh for years is refused. Names (`JAN`, `MON-FRI`) and the nicknames
//! `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly` are accepted, and so are croner's
//! `L`, `W` and `#`. When both day fields are restricted, either one matching is enough, as
//! in Vixie cron. An expression that never matches (`0 0 30 2 *`) is refused.
//!
//! # Daylight saving time (as `croner` does, like Vixie cron)
//!
//! - A start in a skipped hour (spring forward, e.g. `30 2 * * *` in Europe/Paris on the last
//!   Sunday of March): an expression with a single minute and a single hour opens its window
//!   once, at the first instant after the jump (03:00 local). An expression with several or
//!   stepped minutes or hours (`*/30 2 * * *`, `0 2,14 * * *`) skips the times that do not
//!   exist, as it skips any time it does not name.
//! - A start on a repeated time (fall back, e.g. `30 2 * * *` on the last Sunday of October):
//!   a single minute and hour opens the window once, at the first of the two instants; an
//!   expression with several or stepped minutes or hours matches on both passes.

use std::time::SystemTime;

use croner::errors::CronError;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, Zoned};

use crate::model::ScheduleSpec;

/// The five fields, in order, with what each accepts beyond the common syntax.
const FIELDS: [(&str, &str); 5] = [
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day-of-month", "1-31, L (the last day) or nW (the weekday nearest day n)"),
    ("month", "1-12 or JAN-DEC"),
    (
        "day-of-week",
        "0-7 or SUN-SAT (0 and 7 are Sunday), n#k (the k-th weekday n of the month) or nL (the last)",
    ),
];

/// What every field accepts.
const SYNTAX: &str = "each field is *, a value, a range a-b, a step */n or a-b/n, \
                      or a comma-separated list of these";

/// The shorthands accepted instead of five fields.
const NICKNAMES: [&str; 6] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

/// How many later matches [`Windows::at`] follows to find when an open window closes (a
/// window longer than its period never does; `next_change` is then where the search stopped).
const MAX_EXTENSIONS: usize = 1024;

/// Checks a window's cron expression and time zone (`None`: the host's), for the config
/// parser: the message says which field is wrong and what it accepts, or what a zone name
/// looks like.
pub fn check(cron: &str, timezone: Option<&str>) -> Result<(), String> {
    parse_cron(cron)?;
    if let Some(name) = timezone {
        Zone::named(name)?;
    }
    Ok(())
}

/// A time zone: one of the IANA database, such as "Europe/Paris" or "UTC", or the host's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone(TimeZone);

impl Zone {
    /// UTC.
    pub const UTC: Zone = Zone(TimeZone::UTC);

    /// The zone of this IANA name (in any case), or what is wrong with the name.
    pub fn named(name: &str) -> Result<Zone, String> {
        if let Ok(tz) = TimeZone::get(name) {
            return Ok(Zone(tz));
        }
        let suffix = format!("/{name}").to_ascii_lowercase();
        let near = jiff::tz::db()
            .available()
            .find(|known| known.as_str().to_ascii_lowercase().ends_with(&suffix));
        Err(match near {
            Some(known) => format!(
                "unknown time zone {name:?}: did you mean {:?}?",
                known.as_str()
            ),
            None => format!(
                "unknown time zone {name:?}: expected an IANA zone name such as \
                 \"Europe/Paris\", \"America/New_York\" or \"UTC\""
            ),
        })
    }

    /// The host's zone, as the C library finds it: `TZ` if set (an IANA name, a TZif file or
    /// a POSIX rule), else `/etc/localtime` (the zone it links to, or its content). Reads the
    /// environment and the filesystem. When it cannot tell (no `/etc/localtime`, a bad `TZ`),
    /// the C library uses UTC; a caller may do the same, and say so.
    pub fn host() -> Result<Zone, String> {
        TimeZone::try_system().map(Zone).map_err(|e| {
            format!(
                "cannot tell the host's time zone ({e}); give the schedule windows a \
                 timezone, e.g. timezone = \"Europe/Paris\""
            )
        })
    }

    /// The zone's IANA name; `None` for a host zone known only by its rules.
    pub fn name(&self) -> Option<&str> {
        self.0.iana_name()
    }
}

impl std::fmt::Display for Zone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name().unwrap_or("the host's zone (unnamed)"))
    }
}

/// What a group's open windows say at an instant. `min` may exceed `max` (set by different
/// windows, or one against the group's own bound): the caller says which wins.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bounds {
    /// The highest `min` of the open windows; `None`: no open window sets one.
    pub min: Option<u32>,
    /// The highest `max` of the open windows; `None`: no open window sets one.
    pub max: Option<u32>,
    /// The open windows, as indices into the specs [`Windows::new`] was given, ascending.
    pub open: Vec<usize>,
    /// When a window next opens or closes (after the instant asked about), to wake up then;
    /// `None`: never. Never later than the change: for a window that matches again before it
    /// closes, over and over (one longer than its period), it is where the search stopped, a
    /// time to look again.
    pub next_change: Option<SystemTime>,
}

impl Bounds {
    /// The bounds the open windows set, for a pass's observation; `None` when none is open.
    pub fn window(&self) -> Option<crate::model::Window> {
        (!self.open.is_empty()).then_some(crate::model::Window {
            min: self.min,
            max: self.max,
        })
    }
}

/// A group's schedule windows, compiled once from their specs.
#[derive(Debug, Clone)]
pub struct Windows {
    windows: Vec<Window>,
}

/// One compiled window.
#[derive(Debug, Clone)]
struct Window {
    cron: Cron,
    zone: TimeZone,
    duration: SignedDuration,
    min: Option<u32>,
    max: Option<u32>,
}

/// Where one window is at an instant.
struct State {
    open: bool,
    /// When it next opens or closes; `None`: never.
    change: Option<Timestamp>,
}

impl Windows {
    /// Compiles `specs`; a window without a `timezone` uses `host` (see [`Zone::host`]). The
    /// error names the window by its index (from 0) and says what [`check`] would.
    pub fn new(specs: &[ScheduleSpec], host: &Zone) -> Result<Windows, String> {
        let windows = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                Window::new(spec, host).map_err(|e| format!("schedule window {i}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Windows { windows })
    }

    /// Whether there is no window.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// How many windows there are.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Which windows are open at `now`, the bounds they set and when that next changes. Pure.
    /// An instant outside the years -9999 to 9999 opens nothing.
    pub fn at(&self, now: SystemTime) -> Bounds {
        let mut bounds = Bounds::default();
        let Ok(now) = Timestamp::try_from(now) else {
            return bounds;
        };
        for (i, window) in self.windows.iter().enumerate() {
            let state = window.state(now);
            if state.open {
                bounds.open.push(i);
                bounds.min = bounds.min.max(window.min);
                bounds.max = bounds.max.max(window.max);
            }
            if let Some(change) = state.change.map(SystemTime::from) {
                bounds.next_change = Some(bounds.next_change.map_or(change, |c| c.min(change)));
            }
        }
        bounds
    }
}

impl Window {
    fn new(spec: &ScheduleSpec, host: &Zone) -> Result<Window, String> {
        let cron = parse_cron(&spec.cron)?;
        let zone = match &spec.timezone {
            Some(name) => Zone::named(name)?,
            None => host.clone(),
        };
        let duration = SignedDuration::try_from(spec.duration)
            .map_err(|_| format!("duration {:?} is too long", spec.duration))?;
        Ok(Window {
            cron,
            zone: zone.0,
            duration,
            min: spec.min,
            max: spec.max,
        })
    }

    /// Whether the window is open at `now` and when that next changes. A search the crate
    /// cannot complete (only near the ends of its calendar, years 1 and 5000) counts as no
    /// match.
    fn state(&self, now: Timestamp) -> State {
        if self.duration.is_zero() {
            return State {
                open: false,
                change: None,
            };
        }
        let now = now.to_zoned(self.zone.clone());
        let last = self.cron.find_previous_occurrence(&now, true).ok();
        match last.map(|m| {
            let end = m.timestamp().checked_add(self.duration).ok();
            (m, end)
        }) {
            Some((_, None)) => State {
                open: true,
                change: None,
            },
            Some((last, Some(end))) if now.timestamp() < end => State {
                open: true,
                change: self.close_after(last, end),
            },
            _ => State {
                open: false,
                change: self
                    .cron
                    .find_next_occurrence(&now, false)
                    .ok()
                    .map(|next| next.timestamp()),
            },
        }
    }

    /// When a window opened at `last`, due to close at `end`, closes: later matches that come
    /// before it closes extend it.
    fn close_after(&self, mut last: Zoned, mut end: Timestamp) -> Option<Timestamp> {
        for _ in 0..MAX_EXTENSIONS {
            match self.cron.find_next_occurrence(&last, false) {
                Ok(next) if next.timestamp() <= end => {
                    end = next.timestamp().checked_add(self.duration).ok()?;
                    last = next;
                }
                _ => return Some(end),
            }
        }
        Some(end)
    }
}

/// Parses a five-field expression (or a nickname such as `@daily`) with the crate, seconds
/// and years refused; the error names the field at fault and what it accepts.
fn parse_cron(expr: &str) -> Result<Cron, String> {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let nickname = matches!(fields.as_slice(), [one] if one.starts_with('@'));
    if fields.is_empty() {
        return Err(
            "empty cron expression: expected five fields (minute hour day-of-month \
                    month day-of-week), e.g. \"0 8 * * 1-5\""
                .into(),
        );
    }
    if nickname && !NICKNAMES.iter().any(|n| n.eq_ignore_ascii_case(fields[0])) {
        return Err(format!(
            "unknown cron nickname {:?}: expected one of {} or five fields",
            fields[0],
            NICKNAMES.join(", ")
        ));
    }
    if !nickname && fields.len() != 5 {
        let hint = match fields.len() {
            6 | 7 => "; a field for seconds or years is not supported",
            _ => "",
        };
        return Err(format!(
            "cron expression {expr:?} has {} fields: expected five (minute hour day-of-month \
             month day-of-week), e.g. \"0 8 * * 1-5\"{hint}",
            fields.len()
        ));
    }
    let cron = parser().parse(expr).map_err(|e| explain(&fields, &e))?;
    // Matching is on the wall clock, which UTC has all of: no match from 2000 on means none.
    let since = jiff::civil::date(2000, 1, 1).to_zoned(TimeZone::UTC);
    if !since.is_ok_and(|t| cron.find_next_occurrence(&t, true).is_ok()) {
        return Err(format!(
            "cron expression {expr:?} never matches (a day that its months do not have?)"
        ));
    }
    Ok(cron)
}

/// The crate's parser, for five fields only.
fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
}

/// Which field makes the crate refuse the expression (each is tried alone, the others `*`),
/// with the crate's reason and what the field accepts.
fn explain(fields: &[&str], whole: &CronError) -> String {
    let culprit = fields.iter().zip(FIELDS).find_map(|(&field, known)| {
        let probe: Vec<&str> = FIELDS
            .iter()
            .map(|other| if other.0 == known.0 { field } else { "*" })
            .collect();
        let err = parser().parse(&probe.join(" ")).err()?;
        Some((field, known, err))
    });
    match culprit {
        Some((field, (name, values), err)) => format!(
            "{name} field {field:?}: {}; a {name} is {values} ({SYNTAX})",
            reason(&err)
        ),
        None => format!("cron expression {:?}: {}", fields.join(" "), reason(whole)),
    }
}

/// The crate's reason, as a clause: no category, no capital, no full stop, no part repeated.
fn reason(e: &CronError) -> String {
    let text = match e {
        CronError::ComponentError(m) | CronError::InvalidPattern(m) => m.as_str(),
        CronError::IllegalCharacters(m) => m
            .split(" in part ")
            .next()
            .unwrap_or(m)
            .trim_start_matches("CronPattern contains "),
        other => return other.to_string(),
    };
    let text = text.trim_end_matches('.');
    let mut chars = text.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_lowercase().chain(chars).collect())
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
