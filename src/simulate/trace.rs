//! Demand traces for `incus-hpa simulate`: CSV with the header `t,demand_mib`, one row per
//! change of demand. Demand is piecewise constant from a row's `t` (seconds) to the next row's;
//! the run lasts until the last row's `t`. Every bad row is reported with its line.

use std::path::{Path, PathBuf};

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
        for (n, line) in lines {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [t, d] = fields[..] else {
                problems.push((
                    n,
                    format!("expected 2 fields `t,demand_mib`, found {}", fields.len()),
                ));
                continue;
            };
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
}
