//! The SVG of simulated runs (`--plot`), in two panels on one time axis. Above: the demand in
//! MiB (grey, left axis) and each policy's mean utilization of its ready instances (%, right
//! axis) with the group's threshold. Below: each policy's instances, the ideal count and the
//! group's `min` and `max`. A policy has one colour in both panels; lines that would lie on one
//! another are set a pixel or two apart so that each stays visible. A pure function of the
//! runs: the caller writes the file.

use std::fmt::Write;

use super::draw::{line, px, step_for, step_path, text, text_width, tick_label, ticks, Scale};
use super::Run;

/// What the plot shows besides the runs.
#[derive(Debug, Clone, Copy)]
pub struct Plot<'a> {
    pub title: &'a str,
    /// The group's own policy (`adaptive` or `kubernetes`): the run named `default` replays it.
    pub policy: &'a str,
    /// The group's memory threshold, percent.
    pub threshold: f64,
    pub min: u32,
    pub max: u32,
}

/// One colour per policy, in the order of the runs (Okabe and Ito's palette, which most colour
/// blindness still tells apart).
const COLOURS: [&str; 6] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
];
const DEMAND: &str = "#8c8c8c";
const GRID: &str = "#e8e8e8";
const INK: &str = "#222222";
const WIDTH: f64 = 1000.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 922.0;
const UPPER: f64 = 230.0;
const GAP: f64 = 14.0;
const LOWER: f64 = 190.0;
const FONT: &str = r##"font-size="12" fill="#222222""##;
const TICK: &str = r##"stroke="#222222""##;
/// A white outline under a label that may lie over lines.
const HALO: &str =
    r##"stroke="#ffffff" stroke-width="3" stroke-linejoin="round" paint-order="stroke""##;

/// The legend's swatches.
enum Swatch {
    Area,
    Line(&'static str, f64),
}

/// `runs` (one or several policies over the same trace) as SVG text.
pub fn svg(plot: &Plot, runs: &[Run]) -> String {
    // The legend: the policies, then on a row of their own the lines that are not a policy's.
    let policies: Vec<_> = runs
        .iter()
        .enumerate()
        .map(|(i, run)| {
            let s = &run.scores;
            let label = format!("{}: cost {:.0}, {} s OOM", name(plot, run), s.cost, s.oom_s);
            (Swatch::Line(colour(i), 2.0), label)
        })
        .collect();
    let others = [
        (Swatch::Area, "demand (MiB)".to_string()),
        (Swatch::Line(INK, 1.0), "ideal instances".to_string()),
    ];
    let mut legend = String::from("<g class=\"legend\">\n");
    let mut legend_bottom = 50.0;
    for items in [&policies[..], &others[..]] {
        legend_bottom = draw_legend(&mut legend, items, legend_bottom) + 20.0;
    }
    legend.push_str("</g>\n");
    let upper_top = legend_bottom + 4.0;
    let lower_top = upper_top + UPPER + GAP;
    let height = lower_top + LOWER + 52.0;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">"#,
        w = px(WIDTH),
        h = px(height)
    );
    out.push_str("<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
    text(
        &mut out,
        (WIDTH / 2.0, 26.0),
        "middle",
        r##"font-size="17" fill="#222222""##,
        plot.title,
    );
    out.push_str(&legend);
    let time = Time::new(runs.first().map_or(0, |r| r.timeline.len()));
    demand_panel(&mut out, plot, runs, &time, upper_top);
    instances_panel(&mut out, plot, runs, &time, lower_top);
    out.push_str("</svg>\n");
    out
}

/// The time axis both panels share.
struct Time {
    x: Scale,
    /// The unit's name and its length in seconds.
    unit: &'static str,
    per: f64,
    step: f64,
    /// In the unit.
    ticks: Vec<f64>,
}

impl Time {
    /// The axis of a run of `seconds`: in seconds up to 3 hours, then hours up to 3 days, then
    /// days.
    fn new(seconds: usize) -> Time {
        let seconds = seconds.max(1) as f64;
        let (unit, per) = if seconds <= 3.0 * 3600.0 {
            ("s", 1.0)
        } else if seconds <= 3.0 * 86400.0 {
            ("h", 3600.0)
        } else {
            ("days", 86400.0)
        };
        let step = step_for(seconds / per, 10, false);
        Time {
            x: Scale {
                lo: 0.0,
                hi: seconds,
                from: LEFT,
                to: RIGHT,
            },
            unit,
            per,
            step,
            ticks: ticks(seconds / per, step),
        }
    }

    /// The vertical grid lines between `top` and `bottom`.
    fn grid(&self, out: &mut String, top: f64, bottom: f64) {
        let attrs = format!(r#"stroke="{GRID}" stroke-width="1""#);
        for t in &self.ticks {
            let x = self.x.at(t * self.per);
            line(out, (x, top), (x, bottom), &attrs);
        }
    }
}

/// The upper panel, from y = `top`: the demand (MiB, left axis), each policy's utilization (%,
/// right axis) and the threshold.
fn demand_panel(out: &mut String, plot: &Plot, runs: &[Run], time: &Time, top: f64) {
    let first = runs.first().map_or(&[][..], |r| &r.timeline[..]);
    let demand_max = first.iter().map(|s| s.demand_mib).fold(1.0, f64::max);
    let step = step_for(demand_max, 7, false);
    let mib = Scale {
        lo: 0.0,
        hi: (demand_max * 1.08 / step).ceil() * step,
        from: top + UPPER,
        to: top,
    };
    let pct = Scale { hi: 110.0, ..mib };
    out.push_str("<g class=\"panel\" id=\"demand\">\n");
    time.grid(out, top, top + UPPER);
    y_axis(out, &mib, step, "demand (MiB)");
    let area = step_path(first.iter().map(|s| s.demand_mib), &time.x, &mib, 0.0);
    if !area.is_empty() {
        let _ = writeln!(
            out,
            r#"<path class="demand" d="{area}V{}H{}Z" fill="{DEMAND}" fill-opacity="0.28" stroke="{DEMAND}" stroke-width="1.5"/>"#,
            px(mib.from),
            px(LEFT)
        );
    }
    let y = pct.at(plot.threshold);
    line(
        out,
        (LEFT, y),
        (RIGHT, y),
        r##"class="threshold" stroke="#222222" stroke-width="1" stroke-dasharray="7 4""##,
    );
    let label = format!("threshold {} %", plot.threshold);
    text(
        out,
        (RIGHT - 4.0, y - 4.0),
        "end",
        &format!("{FONT} {HALO}"),
        &label,
    );
    for (i, run) in runs.iter().enumerate() {
        let values = run.timeline.iter().map(|s| s.utilization);
        let d = step_path(values, &time.x, &pct, nudge(i, runs.len()));
        policy_path(out, run, colour(i), 1.5, &d);
    }
    frame(out, top, UPPER);
    for v in ticks(100.0, 20.0) {
        let y = pct.at(v);
        line(out, (RIGHT, y), (RIGHT + 5.0, y), TICK);
        text(
            out,
            (RIGHT + 8.0, y + 4.0),
            "start",
            FONT,
            &tick_label(v, 20.0),
        );
    }
    let middle = (WIDTH - 26.0, top + UPPER / 2.0);
    rotated(out, middle, 90.0, "utilization of ready instances (%)");
    out.push_str("</g>\n");
}

/// The lower panel, from y = `top`: each policy's instances, the ideal count, the group's min
/// and max, and under it the time axis.
fn instances_panel(out: &mut String, plot: &Plot, runs: &[Run], time: &Time, top: f64) {
    let bottom = top + LOWER;
    let peak = runs
        .iter()
        .flat_map(|r| r.timeline.iter().map(|s| s.instances.max(s.ideal)))
        .chain([plot.max, plot.min, 1])
        .max()
        .unwrap_or(1);
    let count = Scale {
        lo: 0.0,
        hi: f64::from(peak) + 1.0,
        from: bottom,
        to: top,
    };
    out.push_str("<g class=\"panel\" id=\"instances\">\n");
    time.grid(out, top, bottom);
    y_axis(out, &count, step_for(f64::from(peak), 6, true), "instances");
    // Labelled in the right margin, which this panel leaves free.
    let bounds = if plot.min == plot.max {
        vec![("min", plot.min, format!("min, max {}", plot.min))]
    } else {
        vec![
            ("min", plot.min, format!("min {}", plot.min)),
            ("max", plot.max, format!("max {}", plot.max)),
        ]
    };
    for (bound, value, label) in bounds {
        let y = count.at(f64::from(value));
        let attrs = format!(
            r##"class="bound" data-bound="{bound}" stroke="#666666" stroke-width="1.2" stroke-dasharray="4 3""##
        );
        line(out, (LEFT, y), (RIGHT, y), &attrs);
        text(out, (RIGHT + 6.0, y + 4.0), "start", FONT, &label);
    }
    for (i, run) in runs.iter().enumerate() {
        let values = run.timeline.iter().map(|s| f64::from(s.instances));
        let d = step_path(values, &time.x, &count, nudge(i, runs.len()));
        policy_path(out, run, colour(i), 2.0, &d);
    }
    // The ideal count depends on the demand and the bounds only: the first run's serves all.
    let first = runs.first().map_or(&[][..], |r| &r.timeline[..]);
    let ideal = step_path(
        first.iter().map(|s| f64::from(s.ideal)),
        &time.x,
        &count,
        0.0,
    );
    if !ideal.is_empty() {
        let _ = writeln!(
            out,
            r#"<path class="ideal" d="{ideal}" fill="none" stroke="{INK}" stroke-width="1"/>"#
        );
    }
    frame(out, top, LOWER);
    for t in &time.ticks {
        let x = time.x.at(t * time.per);
        line(out, (x, bottom), (x, bottom + 5.0), TICK);
        let label = tick_label(*t, time.step);
        text(out, (x, bottom + 18.0), "middle", FONT, &label);
    }
    text(
        out,
        ((LEFT + RIGHT) / 2.0, bottom + 40.0),
        "middle",
        r##"font-size="13" fill="#222222""##,
        &format!("time ({})", time.unit),
    );
    out.push_str("</g>\n");
}

/// The colour of the `i`-th run.
fn colour(i: usize) -> &'static str {
    COLOURS[i % COLOURS.len()]
}

/// How far down the `i`-th of `n` runs' lines are moved: lines of equal value are spread over
/// a few pixels, in the order of the runs, so that each stays visible.
fn nudge(i: usize, n: usize) -> f64 {
    (i as f64 - (n as f64 - 1.0) / 2.0) * 2.0
}

/// How a run is named: `default` with the policy it replays.
fn name(plot: &Plot, run: &Run) -> String {
    match run.scores.policy.as_str() {
        "default" => format!("default ({})", plot.policy),
        other => other.to_string(),
    }
}

/// Legend items from y = `top`, in rows that wrap at the plot's width; the last row's y.
fn draw_legend(out: &mut String, items: &[(Swatch, String)], top: f64) -> f64 {
    let (mut cx, mut cy) = (LEFT, top);
    for (swatch, label) in items {
        let w = 26.0 + text_width(label, 12.0);
        if cx > LEFT && cx + w > RIGHT {
            (cx, cy) = (LEFT, cy + 20.0);
        }
        match swatch {
            Swatch::Area => {
                let _ = writeln!(
                    out,
                    r#"<rect x="{}" y="{}" width="20" height="10" fill="{DEMAND}" fill-opacity="0.28" stroke="{DEMAND}" stroke-width="1.5"/>"#,
                    px(cx),
                    px(cy - 5.0)
                );
            }
            Swatch::Line(colour, width) => line(
                out,
                (cx, cy),
                (cx + 20.0, cy),
                &format!(r#"stroke="{colour}" stroke-width="{width}""#),
            ),
        }
        text(out, (cx + 26.0, cy + 4.0), "start", FONT, label);
        cx += w + 22.0;
    }
    cy
}

/// A policy's line in a panel.
fn policy_path(out: &mut String, run: &Run, colour: &str, width: f64, d: &str) {
    if d.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        r#"<path class="policy" data-policy="{}" d="{d}" fill="none" stroke="{colour}" stroke-width="{width}" stroke-linejoin="round"/>"#,
        super::draw::esc(&run.scores.policy)
    );
}

/// A left axis: horizontal grid lines, ticks, their labels and the axis' name.
fn y_axis(out: &mut String, y: &Scale, step: f64, label: &str) {
    let attrs = format!(r#"stroke="{GRID}" stroke-width="1""#);
    for v in ticks(y.hi, step) {
        let py = y.at(v);
        line(out, (LEFT, py), (RIGHT, py), &attrs);
        line(out, (LEFT - 5.0, py), (LEFT, py), TICK);
        text(
            out,
            (LEFT - 8.0, py + 4.0),
            "end",
            FONT,
            &tick_label(v, step),
        );
    }
    rotated(out, (22.0, (y.from + y.to) / 2.0), -90.0, label);
}

/// A panel's border.
fn frame(out: &mut String, top: f64, height: f64) {
    let _ = writeln!(
        out,
        r#"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="{INK}" stroke-width="1"/>"#,
        px(LEFT),
        px(top),
        px(RIGHT - LEFT),
        px(height)
    );
}

/// An axis' name, turned `degrees` about (x, y).
fn rotated(out: &mut String, (x, y): (f64, f64), degrees: f64, label: &str) {
    let attrs = format!(
        r#"font-size="13" fill="{INK}" transform="rotate({degrees} {} {})""#,
        px(x),
        px(y)
    );
    text(out, (x, y), "middle", &attrs, label);
}
