//! The SVG of simulated runs (`--plot`), drawn with plotters in two panels on one time axis.
//! Above: the demand in MiB (grey, left axis) and each policy's mean utilization of its ready
//! instances (%, right axis) with the group's threshold. Below: each policy's instances, the
//! ideal count and the group's `min` and `max`. A policy has one colour in both panels and in
//! the legend; lines of equal value are set a pixel or two apart so that each stays visible. A
//! pure function of the runs: the caller writes the file.

use std::array::IntoIter;

use plotters::chart::MeshStyle;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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
const COLOURS: [u32; 6] = [0x0072B2, 0xD55E00, 0x009E73, 0xCC79A7, 0xE69F00, 0x56B4E9];
const DEMAND: RGBColor = RGBColor(0x8C, 0x8C, 0x8C);
const GRID: RGBColor = RGBColor(0xE8, 0xE8, 0xE8);
const INK: RGBColor = RGBColor(0x22, 0x22, 0x22);
const BOUND: RGBColor = RGBColor(0x66, 0x66, 0x66);
/// Sizes in pixels: the picture's width, a legend row, the panels (with their axes), the side
/// axes. plotters writes a font of size s as s / 1.24 pixels.
const WIDTH: u32 = 1000;
const ROW: u32 = 19;
const UPPER: u32 = 250;
const LOWER: u32 = 250;
const SIDE: u32 = 76;
const FONT: (&str, u32) = ("sans-serif", 15);
/// About one point of a line per pixel of the panels' width.
const COLUMNS: usize = 850;

/// The error of drawing into a `String`, which has none of its own.
type Failed = DrawingAreaErrorKind<std::io::Error>;

/// `runs` (one or several policies over the same trace) as SVG text.
pub fn svg(plot: &Plot, runs: &[Run]) -> String {
    let rows = ROW * (runs.len() as u32).max(2) + 16;
    let mut out = String::new();
    {
        let size = (WIDTH, 40 + rows + UPPER + LOWER);
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        // Into a String, with plotters' own estimate of text sizes, nothing can fail; and what
        // was drawn is closed into a whole document when the backend is dropped.
        let drawn = draw(&root, plot, runs, rows);
        debug_assert!(drawn.is_ok(), "{drawn:?}");
    }
    out
}

fn draw(
    root: &DrawingArea<SVGBackend, Shift>,
    plot: &Plot,
    runs: &[Run],
    rows: u32,
) -> Result<(), Failed> {
    root.fill(&WHITE)?;
    let root = root.titled(plot.title, ("sans-serif", 22).into_font().color(&INK))?;
    let (head, panels) = root.split_vertically(rows);
    let (upper, lower) = panels.split_vertically(UPPER);
    let first = runs.first().map_or(&[][..], |r| &r.timeline[..]);
    let seconds = first.len().max(1);
    // In seconds up to 3 hours, then hours up to 3 days, then days.
    let (unit, per) = match seconds {
        s if s <= 3 * 3600 => ("s", 1.0),
        s if s <= 3 * 86400 => ("h", 3600.0),
        _ => ("days", 86400.0),
    };
    let end = seconds as f64 / per;
    let font = FONT.into_font().color(&INK);

    // The legend, above the panels: the policies, and beside them the lines that are not one's.
    let (left, right) = head.split_horizontally(WIDTH * 3 / 5);
    let policies = runs.iter().enumerate().map(|(i, run)| {
        let s = &run.scores;
        let label = format!("{}: cost {:.0}, {} s OOM", name(plot, run), s.cost, s.oom_s);
        (label, colour(i))
    });
    legend(&left, SIDE, policies, &font)?;
    let others = [
        ("demand (MiB)".to_string(), DEMAND.mix(0.5).stroke_width(10)),
        ("ideal instances".to_string(), INK.stroke_width(1)),
    ];
    legend(&right, 0, others, &font)?;

    // Above: the demand (left axis), the utilization and the threshold (right axis).
    let demand_max = first.iter().map(|s| s.demand_mib).fold(1.0, f64::max) * 1.08;
    let mut chart = ChartBuilder::on(&upper)
        .margin(8)
        .y_label_area_size(SIDE)
        .right_y_label_area_size(SIDE)
        .build_cartesian_2d(0.0..end, 0.0..demand_max)?
        .set_secondary_coord(0.0..end, 0.0..110.0);
    mesh(&mut chart.configure_mesh(), &font)
        .y_labels(8)
        .y_desc("demand (MiB)")
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_labels(6)
        .y_label_formatter(&number)
        .label_style(font.clone())
        .axis_desc_style(font.clone())
        .y_desc("utilization of ready instances (%)")
        .draw()?;
    let demand = steps(first.iter().map(|s| s.demand_mib), per);
    if let (Some(&(x0, _)), Some(&(x1, _))) = (demand.first(), demand.last()) {
        let area = demand.iter().copied().chain([(x1, 0.0), (x0, 0.0)]);
        chart.draw_series([Polygon::new(area.collect::<Vec<_>>(), DEMAND.mix(0.28))])?;
    }
    chart.draw_series(LineSeries::new(demand, DEMAND.stroke_width(2)))?;
    let t = plot.threshold;
    chart.draw_secondary_series(dashed(end, t, INK))?;
    let per_pixel = 110.0 / f64::from(chart.plotting_area().dim_in_pixel().1.max(1));
    for (i, run) in runs.iter().enumerate() {
        let dy = nudge(i, runs.len()) * per_pixel;
        let line = steps(run.timeline.iter().map(|s| s.utilization - dy), per);
        chart.draw_secondary_series(LineSeries::new(line, colour(i)))?;
    }
    let label = font.pos(Pos::new(HPos::Right, VPos::Bottom));
    let label = Text::new(format!("threshold {t} %"), (-4, -3), label);
    chart.draw_secondary_series([EmptyElement::at((end, t)) + label])?;

    // Below: the instances, the ideal count, min and max, and the time axis.
    let peak = runs
        .iter()
        .flat_map(|r| r.timeline.iter().map(|s| s.instances.max(s.ideal)))
        .chain([plot.max, plot.min, 1])
        .max()
        .unwrap_or(1);
    let ceiling = f64::from(peak) + 1.0;
    let mut chart = ChartBuilder::on(&lower)
        .margin(8)
        .margin_right(SIDE + 8)
        .y_label_area_size(SIDE)
        .x_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..ceiling)?;
    // As many labels as whole numbers at most: their step is then a whole number.
    mesh(&mut chart.configure_mesh(), &font)
        .y_labels((peak as usize + 1).min(7))
        .y_desc("instances")
        .x_desc(format!("time ({unit})"))
        .draw()?;
    let mut bounds = vec![(plot.min, "min"), (plot.max, "max")];
    if plot.min == plot.max {
        bounds = vec![(plot.min, "min, max")];
    }
    for (value, name) in bounds {
        let (y, label) = (f64::from(value), format!("{name} {value}"));
        chart.draw_series(dashed(end, y, BOUND))?;
        // In the right margin, which this panel leaves free.
        let style = font.pos(Pos::new(HPos::Left, VPos::Center));
        chart.draw_series([EmptyElement::at((end, y)) + Text::new(label, (6, 0), style)])?;
    }
    let per_pixel = ceiling / f64::from(chart.plotting_area().dim_in_pixel().1.max(1));
    for (i, run) in runs.iter().enumerate() {
        let dy = nudge(i, runs.len()) * per_pixel;
        let counts = run.timeline.iter().map(|s| f64::from(s.instances) - dy);
        chart.draw_series(LineSeries::new(steps(counts, per), colour(i)))?;
    }
    // The ideal count depends on the demand and the bounds only: the first run's serves all.
    let ideal = steps(first.iter().map(|s| f64::from(s.ideal)), per);
    chart.draw_series(LineSeries::new(ideal, INK))?;
    root.present()
}

/// The grid and labels both panels share: the same time ticks, light grey lines.
fn mesh<'m, 'a, 'b, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    mesh: &'m mut MeshStyle<'a, 'b, X, Y, SVGBackend<'a>>,
    font: &TextStyle<'b>,
) -> &'m mut MeshStyle<'a, 'b, X, Y, SVGBackend<'a>> {
    mesh.x_labels(10)
        .x_label_formatter(&number)
        .y_label_formatter(&number)
        .light_line_style(TRANSPARENT)
        .bold_line_style(GRID)
        .label_style(font.clone())
        .axis_desc_style(font.clone())
}

/// A legend on `area`, from `left` pixels in: a row per entry, with its line.
fn legend(
    area: &DrawingArea<SVGBackend, Shift>,
    left: u32,
    entries: impl IntoIterator<Item = (String, ShapeStyle)>,
    font: &TextStyle,
) -> Result<(), Failed> {
    // A chart of its own with only the legend: plotters keeps a chart's legend in its plot.
    let mut chart = ChartBuilder::on(area)
        .margin_left(left)
        .build_cartesian_2d(0..1, 0..1)?;
    for (label, style) in entries {
        let swatch = move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style);
        let none = [(0, 0); 0];
        chart
            .draw_series(LineSeries::new(none, style))?
            .label(label)
            .legend(swatch);
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .legend_area_size(26)
        .margin(4)
        .label_font(font.clone())
        .draw()
}

/// A tick's label: at most three decimals, none when whole.
fn number(v: &f64) -> String {
    format!("{}", (v * 1000.0).round() / 1000.0)
}

/// A dashed line across a panel `end` long, at `y`.
fn dashed(end: f64, y: f64, colour: RGBColor) -> DashedLineSeries<IntoIter<(f64, f64), 2>, u32> {
    DashedLineSeries::new([(0.0, y), (end, y)], 7, 4, colour.stroke_width(1))
}

/// The corners of a step line through `values`, each held for one second from t = 0, in units
/// of `per` seconds. The seconds are taken in buckets of about a pixel: a bucket whose values
/// differ is drawn as one vertical stroke over their range, so that a 30-day run keeps a few
/// thousand points.
fn steps(values: impl Iterator<Item = f64>, per: f64) -> Vec<(f64, f64)> {
    let values: Vec<f64> = values.collect();
    let bucket = values.len().div_ceil(COLUMNS).max(1);
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (i, chunk) in values.chunks(bucket).enumerate() {
        let x = (i * bucket) as f64 / per;
        let lo = chunk.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = chunk.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        for y in [lo, hi, chunk[chunk.len() - 1]] {
            match out.last() {
                Some(&(_, held)) if held == y => {}
                Some(&(at, held)) if at != x => out.extend([(x, held), (x, y)]),
                _ => out.push((x, y)),
            }
        }
    }
    if let Some(&(_, held)) = out.last() {
        out.push((values.len() as f64 / per, held));
    }
    out
}

/// The line of the `i`-th run, in both panels and in the legend.
fn colour(i: usize) -> ShapeStyle {
    let c = COLOURS[i % COLOURS.len()];
    RGBColor((c >> 16) as u8, (c >> 8) as u8, c as u8).stroke_width(2)
}

/// How far down the `i`-th of `n` runs' lines are moved, in pixels: lines of equal value are
/// spread over a few pixels, in the order of the runs, so that each stays visible.
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
