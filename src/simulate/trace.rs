//! Demand traces for `incus-hpa simulate`: CSV with the header `t,demand_mib`, one row per
//! change of demand. Demand is piecewise constant from a row's `t` (seconds) to the next row's;
//! the run lasts until the last row's `t`. Every bad row is reported with its line.
//!
//! A run keeps one entry per simulated second, so a trace is held to [`MAX_TRACE_SECONDS`] and
//! [`MAX_TRACE_ROWS`]: a row such as `1e10,0` is refused rather than run until memory runs out.

use std::path::{Path, PathBuf};

/// Latest `t` a trace may have: 30 days, in seconds. A run keeps one entry of 32 bytes per
/// simulated second for each policy it replays: 30 days is 83 MB a policy.
pub const MAX_TRACE_SECONDS: u64 = 30 * 24 * 3600;

/// Most rows a trace may have (a row is a change of demand): each is kept (16 bytes), and
/// reading stops at the first row past the limit.
pub const MAX_TRACE_ROWS: usize = 1_000_000;

/// A parsed trace: (second, demand in MiB), starting at 0, strictly increasing in time.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    points: Vec<(f64, f64)>,
}

/// What is wrong with a trace file, with every problem located.
#[derive(Debug, thiserror::Error)]
#[error("{}", .problems.iter().map(|(line, m)| format!("{}:{line}: {m}", .file.display())).collect::<Vec<_>>().join("\n"))]
pub struct TraceError {
    pub file: PathBuf,
    /// (line, message), in file order.
    pub problems: Vec<(usize, String)>,
}

impl Trace {
    /// Parses trace text; `file` only names places in messages.
    pub fn parse(file: &Path, text: &str) -> Result<Trace, TraceError> {
        let mut problems = Vec::new();
        let mut points: Vec<(f64, f64)> = Vec::new();
        let mut beyond = false;
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        match lines.next() {
            Some((_, "t,demand_mib")) => {}
            Some((n, other)) => problems.push((
                n,
                format!("the header must be `t,demand_mib`, not `{other}`"),
            )),
            None => problems.push((
                1,
                "empty: the header `t,demand_mib` and rows expected".into(),
            )),
        }
        for (rows, (n, line)) in lines.enumerate() {
            if rows == MAX_TRACE_ROWS {
                problems.push((
                    n,
                    format!(
                        "a trace has at most {MAX_TRACE_ROWS} rows: this is row {}, and the rest \
                         is not read",
                        MAX_TRACE_ROWS + 1
                    ),
                ));
                break;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [t, d] = fields[..] else {
                problems.push((
                    n,
                    format!("expected 2 fields `t,demand_mib`, found {}", fields.len()),
                ));
                continue;
            };
            let t_text = t;
            let t = match t.parse::<f64>() {
                Ok(t) if t.is_finite() && t >= 0.0 => t,
                _ => {
                    problems.push((n, format!("t: {t:?} is not a number of seconds ≥ 0")));
                    continue;
                }
            };
            let d = match d.parse::<f64>() {
                Ok(d) if d.is_finite() && d >= 0.0 => d,
                _ => {
                    problems.push((n, format!("demand_mib: {d:?} is not a number ≥ 0")));
                    continue;
                }
            };
            match points.last() {
                None if t != 0.0 => {
                    problems.push((n, format!("the first row must be at t = 0, not {t}")));
                }
                Some((prev, _)) if t <= *prev => problems.push((
                    n,
                    format!("t = {t} does not come after the previous row's t = {prev}"),
                )),
                _ => {}
            }
            if t > MAX_TRACE_SECONDS as f64 && !beyond {
                // Rows only go forward: the first one past the limit is enough to name.
                beyond = true;
                problems.push((
                    n,
                    format!(
                        "t: {t_text} is beyond the longest trace, 30 days ({MAX_TRACE_SECONDS} s)"
                    ),
                ));
            }
            points.push((t, d));
        }
        if problems.is_empty() && points.len() < 2 {
            problems.push((
                text.lines().count().max(1),
                "at least two rows: the last one's t is when the run ends".into(),
            ));
        }
        if problems.is_empty() {
            Ok(Trace { points })
        } else {
            Err(TraceError {
                file: file.to_owned(),
                problems,
            })
        }
    }

    /// Demand at second `t`, MiB.
    pub fn demand(&self, t: f64) -> f64 {
        let i = self.points.partition_point(|(pt, _)| *pt <= t);
        self.points[i.saturating_sub(1)].1
    }

    /// Seconds the run lasts (the last row's `t`, rounded up).
    pub fn seconds(&self) -> u64 {
        self.points.last().map_or(0, |(t, _)| t.ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, TraceError> {
        Trace::parse(Path::new("t.csv"), text)
    }

    #[test]
    fn demand_is_piecewise_constant_until_the_last_row() {
        let t = parse("t,demand_mib\n0,10\n# a comment\n30,50.5\n60,0\n").unwrap();
        assert_eq!(t.seconds(), 60);
        assert_eq!(
            (t.demand(0.0), t.demand(29.0), t.demand(30.0)),
            (10.0, 10.0, 50.5)
        );
        assert_eq!(t.demand(59.0), 50.5);
    }

    #[test]
    fn every_bad_row_is_located() {
        let e = parse("t,demand_mib\n5,1\n3,x\n2\n1,2\n0,-1\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv:2: the first row must be at t = 0, not 5\n\
             t.csv:3: demand_mib: \"x\" is not a number ≥ 0\n\
             t.csv:4: expected 2 fields `t,demand_mib`, found 1\n\
             t.csv:5: t = 1 does not come after the previous row's t = 5\n\
             t.csv:6: demand_mib: \"-1\" is not a number ≥ 0"
        );
        assert!(parse("time,mib\n0,1\n1,1\n")
            .unwrap_err()
            .to_string()
            .contains("t.csv:1: the header must be `t,demand_mib`"));
        assert!(parse("t,demand_mib\n0,1\n").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn a_trace_longer_than_30_days_is_refused_on_its_row() {
        let e = parse("t,demand_mib\n0,1\n# far away\n1e10,0\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv:4: t: 1e10 is beyond the longest trace, 30 days (2592000 s)"
        );
        // Named once, on the first row past it.
        let e = parse("t,demand_mib\n0,1\n2592000.5,2\n2592001,3\n").unwrap_err();
        assert_eq!(e.problems.len(), 1, "{e}");
        assert_eq!(e.problems[0].0, 3);
        let t = parse("t,demand_mib\n0,1\n2592000,0\n").unwrap();
        assert_eq!(t.seconds(), MAX_TRACE_SECONDS);
    }

    #[test]
    fn a_trace_of_more_than_a_million_rows_is_refused_where_it_goes_past() {
        use std::fmt::Write as _;
        // Header and comment on lines 1-2, row k (from 1) on line k + 2: the million rows
        // pass (the one error is the next row's), the extra row is on line 1,000,003, and the
        // bad row after it is not read.
        let mut text = String::from("t,demand_mib\n# one row a second\n");
        for t in 0..=MAX_TRACE_ROWS {
            writeln!(text, "{t},1").unwrap();
        }
        text.push_str("not,a,row\n");
        let e = parse(&text).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv:1000003: a trace has at most 1000000 rows: this is row 1000001, and the \
             rest is not read"
        );
    }
}
