//! Traces for `incus-hpa simulate`: CSV whose header names its columns, `t` and then any of
//! `demand_mib`, `cpu_percent`, `pressure` and `external` (at least one, each once, in any
//! order), one row per change. Every value is piecewise constant from a row's `t` (seconds) to
//! the next row's; the run lasts until the last row's `t`. Every bad row, and a bad header, is
//! reported with its line. What each column means to the simulated instances is in
//! [`crate::simulate`].
//!
//! A run keeps one entry per simulated second, so a trace is held to [`MAX_TRACE_SECONDS`] and
//! [`MAX_TRACE_ROWS`]: a row such as `1e10,0` is refused rather than run until memory runs out.

use std::path::{Path, PathBuf};

/// Latest `t` a trace may have: 30 days, in seconds. A run keeps one entry of 32 bytes per
/// simulated second for each policy it replays: 30 days is 83 MB a policy.
pub const MAX_TRACE_SECONDS: u64 = 30 * 24 * 3600;

/// Most rows a trace may have (a row is a change): each is kept (8 bytes for `t` and 8 for
/// each column), and reading stops at the first row past the limit.
pub const MAX_TRACE_ROWS: usize = 1_000_000;

/// A column of a trace besides `t`: one signal's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    /// The group's memory demand, MiB (≥ 0).
    DemandMib,
    /// The group's CPU demand, percent of one instance's CPU limit (≥ 0).
    CpuPercent,
    /// The pressure every ready instance shows, percent (0 to 100).
    Pressure,
    /// The value the group's external programs print (any number).
    External,
}

impl Column {
    /// Every column, in the order the documentation lists them.
    pub const ALL: [Column; 4] = [
        Column::DemandMib,
        Column::CpuPercent,
        Column::Pressure,
        Column::External,
    ];

    /// The column's name in a header.
    pub fn name(self) -> &'static str {
        match self {
            Column::DemandMib => "demand_mib",
            Column::CpuPercent => "cpu_percent",
            Column::Pressure => "pressure",
            Column::External => "external",
        }
    }

    fn named(name: &str) -> Option<Column> {
        Column::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Parses one of the column's values, or says what it accepts.
    fn value(self, text: &str) -> Result<f64, String> {
        let v = text.parse::<f64>().ok().filter(|v| v.is_finite());
        let (ok, wants) = match self {
            Column::DemandMib | Column::CpuPercent => (v.is_some_and(|v| v >= 0.0), "a number ≥ 0"),
            Column::Pressure => (
                v.is_some_and(|v| (0.0..=100.0).contains(&v)),
                "a percentage from 0 to 100",
            ),
            Column::External => (v.is_some(), "a number"),
        };
        match v {
            Some(v) if ok => Ok(v),
            _ => Err(format!("{}: {text:?} is not {wants}", self.name())),
        }
    }
}

/// The columns a header may name after `t`, as the messages list them.
fn known() -> String {
    Column::ALL
        .iter()
        .map(|c| format!("`{}`", c.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A parsed trace: its columns, and its rows from `t` = 0, strictly increasing in time.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The header's line in the file.
    header_line: usize,
    columns: Vec<Column>,
    times: Vec<f64>,
    /// Row after row, `columns.len()` values each.
    values: Vec<f64>,
}

/// The values of every column at one instant; `None` for a column the trace does not have.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Reading {
    pub demand_mib: Option<f64>,
    pub cpu_percent: Option<f64>,
    pub pressure: Option<f64>,
    pub external: Option<f64>,
}

/// What is wrong with a trace file, with every problem located.
#[derive(Debug, thiserror::Error)]
#[error("{}", .problems.iter().map(|(line, m)| format!("{}:{line}: {m}", .file.display())).collect::<Vec<_>>().join("\n"))]
pub struct TraceError {
    pub file: PathBuf,
    /// (line, message), in file order.
    pub problems: Vec<(usize, String)>,
}

/// The header's columns after `t` (`None`: a name not known), or nothing when the whole header
/// is wrong; its problems go to `problems`, on line `n`.
fn header(n: usize, fields: &[&str], problems: &mut Vec<(usize, String)>) -> Vec<Option<Column>> {
    if fields.first() != Some(&"t") {
        problems.push((
            n,
            format!(
                "the header must be `t` and then any of {}, not `{}`",
                known(),
                fields.join(",")
            ),
        ));
        return vec![None; fields.len().saturating_sub(1)];
    }
    if fields.len() == 1 {
        problems.push((
            n,
            format!("no column after `t`: name at least one of {}", known()),
        ));
    }
    let mut columns: Vec<Option<Column>> = Vec::new();
    for name in &fields[1..] {
        let column = Column::named(name);
        match column {
            None => problems.push((
                n,
                format!(
                    "unknown column `{name}`: after `t`, the columns are any of {}",
                    known()
                ),
            )),
            Some(c) if columns.contains(&Some(c)) => {
                problems.push((n, format!("column `{name}` is named twice")))
            }
            Some(_) => {}
        }
        columns.push(column);
    }
    columns
}

impl Trace {
    /// Parses trace text; `file` only names places in messages.
    pub fn parse(file: &Path, text: &str) -> Result<Trace, TraceError> {
        let mut problems = Vec::new();
        let (mut times, mut values): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
        let mut beyond = false;
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let (header_line, names, columns) = match lines.next() {
            Some((n, line)) => {
                let names: Vec<&str> = line.split(',').map(str::trim).collect();
                let columns = header(n, &names, &mut problems);
                (n, names.join(","), columns)
            }
            None => {
                problems.push((
                    1,
                    "empty: a header such as `t,demand_mib` and rows expected".into(),
                ));
                (1, String::new(), Vec::new())
            }
        };
        let width = columns.len() + 1;
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
            if fields.len() != width {
                problems.push((
                    n,
                    format!("expected {width} fields `{names}`, found {}", fields.len()),
                ));
                continue;
            }
            let t_text = fields[0];
            let t = match t_text.parse::<f64>() {
                Ok(t) if t.is_finite() && t >= 0.0 => t,
                _ => {
                    problems.push((n, format!("t: {t_text:?} is not a number of seconds ≥ 0")));
                    continue;
                }
            };
            let before = problems.len();
            let row: Vec<f64> = columns
                .iter()
                .zip(&fields[1..])
                .map(|(c, text)| match c.map(|c| c.value(text)) {
                    Some(Ok(v)) => v,
                    Some(Err(e)) => {
                        problems.push((n, e));
                        0.0
                    }
                    // An unknown column is named once, in the header.
                    None => 0.0,
                })
                .collect();
            if problems.len() > before {
                continue;
            }
            match times.last() {
                None if t != 0.0 => {
                    problems.push((n, format!("the first row must be at t = 0, not {t}")));
                }
                Some(prev) if t <= *prev => problems.push((
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
            times.push(t);
            values.extend(row);
        }
        if problems.is_empty() && times.len() < 2 {
            problems.push((
                text.lines().count().max(1),
                "at least two rows: the last one's t is when the run ends".into(),
            ));
        }
        if problems.is_empty() {
            Ok(Trace {
                header_line,
                columns: columns.into_iter().flatten().collect(),
                times,
                values,
            })
        } else {
            Err(TraceError {
                file: file.to_owned(),
                problems,
            })
        }
    }

    /// A `t,demand_mib` trace of one value per second (MiB), one row per change and one at
    /// the end, as [`super::generate::csv`] writes it.
    pub fn from_demand(demand: &[f64]) -> Trace {
        let (mut times, mut values) = (Vec::new(), Vec::new());
        for (t, d) in demand.iter().enumerate() {
            if values.last() != Some(d) {
                times.push(t as f64);
                values.push(*d);
            }
        }
        if let Some(d) = demand.last() {
            times.push(demand.len() as f64);
            values.push(*d);
        }
        Trace {
            header_line: 1,
            columns: vec![Column::DemandMib],
            times,
            values,
        }
    }

    /// The seconds from which the values may change: each row's `t`, rounded up (the run's
    /// seconds take the value of the last row at or before them), in order.
    pub fn changes(&self) -> impl Iterator<Item = u64> + '_ {
        self.times.iter().map(|t| t.ceil() as u64)
    }

    /// The header's line in the file.
    pub fn header_line(&self) -> usize {
        self.header_line
    }

    /// The trace's columns after `t`, in the header's order.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Whether the trace has `column`.
    pub fn has(&self, column: Column) -> bool {
        self.columns.contains(&column)
    }

    /// Every column's value at second `t`.
    pub fn at(&self, t: f64) -> Reading {
        let row = self.times.partition_point(|pt| *pt <= t).saturating_sub(1);
        let width = self.columns.len();
        let mut reading = Reading::default();
        for (k, column) in self.columns.iter().enumerate() {
            let v = self.values.get(row * width + k).copied();
            match column {
                Column::DemandMib => reading.demand_mib = v,
                Column::CpuPercent => reading.cpu_percent = v,
                Column::Pressure => reading.pressure = v,
                Column::External => reading.external = v,
            }
        }
        reading
    }

    /// Memory demand at second `t`, MiB (0 without a `demand_mib` column).
    pub fn demand(&self, t: f64) -> f64 {
        self.at(t).demand_mib.unwrap_or(0.0)
    }

    /// Seconds the run lasts (the last row's `t`, rounded up).
    pub fn seconds(&self) -> u64 {
        self.times.last().map_or(0, |t| t.ceil() as u64)
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
            .contains("t.csv:1: the header must be `t` and then any of `demand_mib`, "));
        assert!(parse("t,demand_mib\n0,1\n").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn the_header_names_any_columns_in_any_order() {
        let t = parse("# load\nt,external,cpu_percent\n0,3,150\n10,1.5,20\n20,0,0\n").unwrap();
        assert_eq!(t.columns(), [Column::External, Column::CpuPercent]);
        assert_eq!(t.header_line(), 2);
        assert!(t.has(Column::CpuPercent) && !t.has(Column::DemandMib));
        let r = t.at(12.0);
        assert_eq!(
            (r.external, r.cpu_percent, r.demand_mib),
            (Some(1.5), Some(20.0), None)
        );
        assert_eq!(t.demand(12.0), 0.0);
        let all = parse("t,pressure,demand_mib,cpu_percent,external\n0,5,1,2,-3\n9,0,0,0,0\n");
        assert_eq!(all.unwrap().at(0.0).external, Some(-3.0));
        // Each value is checked against its column, and every bad one is named.
        let e = parse("t,cpu_percent,pressure\n0,1,2\n5,-1,101\n7,1\n9,1,2\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv:3: cpu_percent: \"-1\" is not a number ≥ 0\n\
             t.csv:3: pressure: \"101\" is not a percentage from 0 to 100\n\
             t.csv:4: expected 3 fields `t,cpu_percent,pressure`, found 2"
        );
    }

    #[test]
    fn a_header_with_an_unknown_repeated_or_no_column_is_refused_on_its_line() {
        let e =
            parse("# a comment\nt,demand_mib,memory,demand_mib\n0,1,2,3\n5,1,x,3\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv:2: unknown column `memory`: after `t`, the columns are any of `demand_mib`, \
             `cpu_percent`, `pressure`, `external`\n\
             t.csv:2: column `demand_mib` is named twice"
        );
        let e = parse("t\n0\n5\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv:1: no column after `t`: name at least one of `demand_mib`, `cpu_percent`, \
             `pressure`, `external`"
        );
        let e = parse("demand_mib,t\n0,1\n5,1\n").unwrap_err();
        assert_eq!(e.problems.len(), 1, "{e}");
        assert!(e.problems[0].1.ends_with("not `demand_mib,t`"), "{e}");
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
