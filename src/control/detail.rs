//! `incus-hpa status GROUP`: one group in detail, as `kubectl describe` shows an object: its
//! count and bounds, every signal, the scale-down window in force and why, who acts on it, the
//! right-sizing advice, the last action and error, its instances, and the last hour from its history as a chart in
//! the terminal (the count and the demand, a column a minute). Pure: the status and the rows
//! come in, the text goes out.

use std::fmt::Write;

use super::GroupStatus;
use crate::history::Record;

/// How far back the chart goes, in minutes (one column each).
pub const CHART_MINUTES: usize = 60;
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// The detail of `g`; `rows` are its recorded passes of the last hour (oldest first), or why
/// there are none, and `now_ms` the time the chart ends at.
pub fn detail(g: &GroupStatus, rows: Result<&[Record], &str>, now_ms: i64) -> String {
    let mut head = format!("{} (project {})", g.name, g.project);
    if g.paused {
        head.push_str(", paused");
    }
    let mut text = format!("{head}\n");
    let mut field = |k: &str, v: String| {
        let _ = writeln!(text, "  {k:<13}{v}");
    };
    let mut count = format!(
        "{} in service, {} desired (min {}, max {})",
        g.current, g.desired, g.min, g.max
    );
    for (n, what) in [
        (g.starting, "starting"),
        (g.not_ready, "not ready"),
        (g.unhealthy, "unhealthy"),
        (g.warm, "warm"),
    ] {
        if n > 0 {
            let _ = write!(count, "; {n} {what}");
        }
    }
    field("count", count);
    field("reason", g.reason.clone());
    let signals: Vec<String> = g
        .signals
        .iter()
        .map(|s| {
            let wants = s
                .wants
                .map_or_else(|| "holds the count".into(), |w| format!("wants {w}"));
            format!(
                "{} {} for {}{}: {wants}",
                s.name,
                s.shown("no reading"),
                s.target,
                s.unit()
            )
        })
        .collect();
    field("signals", lines(&signals));
    field(
        "window",
        g.scale_down_window
            .clone()
            .unwrap_or_else(|| "scale_down_stabilization (kubernetes)".into()),
    );
    field(
        "acting",
        g.standby.as_ref().map_or_else(
            || "this daemon".into(),
            |h| format!("standby: {h} holds the lease"),
        ),
    );
    if let Some(a) = &g.advice {
        let (c, d) = (&a.current, &a.advised);
        let said = if c.limit_mib == d.limit_mib {
            format!(
                "limits.memory {} MiB: no other size would have reserved less",
                c.limit_mib
            )
        } else {
            format!(
                "limits.memory {} MiB instead of {}: {:.0}% less memory reserved, {}-{} \
                 instances",
                d.limit_mib,
                c.limit_mib,
                a.saving() * 100.0,
                d.fewest,
                d.most
            )
        };
        field(
            "advice",
            format!(
                "{said}\n               (its last {} replayed at {}; incus-hpa advise {})",
                a.span(),
                a.at,
                g.name
            ),
        );
    }
    if !g.failing.is_empty() {
        field("failing", g.failing.join(", "));
    }
    field(
        "last action",
        g.last_action.as_ref().map_or_else(
            || "-".into(),
            |a| format!("{} {} {} ({})", a.at, a.kind, a.instance, a.outcome),
        ),
    );
    field(
        "last error",
        g.last_error.clone().unwrap_or_else(|| "-".into()),
    );
    field(
        "next pass",
        g.next_pass.clone().unwrap_or_else(|| "-".into()),
    );
    let instances: Vec<String> = g
        .instances
        .iter()
        .map(|i| {
            let mut s = format!("{} {}", i.name, i.status);
            if i.readiness != "unchecked" {
                let _ = write!(s, " {}", i.readiness);
            }
            if let Some(a) = &i.address {
                let _ = write!(s, " {a}");
            }
            s
        })
        .collect();
    field("instances", lines(&instances));
    text.push_str(&match rows {
        Ok(rows) => chart(rows, now_ms),
        Err(why) => format!("  {:<13}{why}\n", "last hour"),
    });
    text
}

/// `items` one under the other in a field's column, or `-` for none.
fn lines(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join("\n               ")
    }
}

/// The last hour of `rows` as two lines of bars, a column a minute ending at `now_ms`: the
/// highest count and demand of each minute, each scaled to its own highest.
pub fn chart(rows: &[Record], now_ms: i64) -> String {
    let start = now_ms - CHART_MINUTES as i64 * 60_000;
    let mut count: Vec<Option<f64>> = vec![None; CHART_MINUTES];
    let mut demand: Vec<Option<f64>> = vec![None; CHART_MINUTES];
    for r in rows
        .iter()
        .filter(|r| r.unix_ms >= start && r.unix_ms <= now_ms)
    {
        let i = (((r.unix_ms - start) / 60_000) as usize).min(CHART_MINUTES - 1);
        let high = |a: Option<f64>, b: f64| Some(a.map_or(b, |a| a.max(b)));
        count[i] = high(count[i], f64::from(r.current));
        if let Some(d) = r.demand_mib {
            demand[i] = high(demand[i], d);
        }
    }
    if count.iter().all(Option::is_none) {
        return format!("  {:<13}no pass recorded\n", "last hour");
    }
    let bars = |v: &[Option<f64>]| -> (String, f64, f64) {
        let top = v.iter().flatten().copied().fold(0.0, f64::max);
        let low = v.iter().flatten().copied().fold(f64::INFINITY, f64::min);
        let line = v
            .iter()
            .map(|x| match x {
                None => ' ',
                Some(x) if top <= 0.0 => BARS[0],
                Some(x) => BARS[((x / top) * 7.0).round().clamp(0.0, 7.0) as usize],
            })
            .collect();
        (line, low, top)
    };
    let (c, c_low, c_top) = bars(&count);
    let mut out = format!(
        "  {:<13}a column a minute, the newest on the right\n",
        "last hour"
    );
    let _ = writeln!(out, "  {:<13}{c}  {c_low:.0}-{c_top:.0}", "count");
    if demand.iter().any(Option::is_some) {
        let (d, d_low, d_top) = bars(&demand);
        let _ = writeln!(out, "  {:<13}{d}  {d_low:.0}-{d_top:.0} MiB", "demand");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(unix_ms: i64, current: u32, demand: f64) -> Record {
        Record::sample(unix_ms, current, Some(demand))
    }

    #[test]
    fn the_last_hour_is_a_column_a_minute() {
        let now = 10_000_000_000;
        let rows: Vec<Record> = (0..60)
            .map(|m| {
                row(
                    now - (59 - m) * 60_000 - 1,
                    1 + (m / 20) as u32,
                    m as f64 * 10.0,
                )
            })
            .collect();
        let c = chart(&rows, now);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 3, "{c}");
        assert!(lines[1].starts_with("  count        ▃"), "{c}");
        assert!(lines[1].ends_with("█  1-3"), "{c}");
        assert!(lines[2].ends_with("█  0-590 MiB"), "{c}");
        assert_eq!(chart(&[], now).trim(), "last hour    no pass recorded");
    }
}
