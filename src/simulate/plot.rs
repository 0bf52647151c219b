//! The SVG of a simulated run (`--plot`, drawn with plotters): demand, utilization and the
//! threshold on the left axis, instances and the ideal count on the right one.

use std::path::Path;

use plotters::prelude::*;

use super::Run;

/// Writes `runs` (one or several policies over the same trace) as an SVG to `path`.
pub fn plot(path: &Path, title: &str, threshold: f64, runs: &[Run]) -> Result<(), String> {
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let Some(first) = runs.first() else {
            return Ok(());
        };
        let end = first.timeline.last().map_or(1, |s| s.t + 1);
        let demand_max = first
            .timeline
            .iter()
            .map(|s| s.demand_mib)
            .fold(0.0, f64::max)
            .max(1.0);
        let instances_max = runs
            .iter()
            .flat_map(|r| r.timeline.iter().map(|s| s.instances.max(s.ideal)))
            .max()
            .unwrap_or(1)
            .max(1);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .right_y_label_area_size(52)
            .build_cartesian_2d(0u64..end, 0f64..110f64)?
            .set_secondary_coord(0u64..end, 0u32..instances_max + 1);
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("percent (demand: % of its peak)")
            .draw()?;
        chart
            .configure_secondary_axes()
            .y_desc("instances")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                first
                    .timeline
                    .iter()
                    .map(|s| (s.t, s.demand_mib / demand_max * 100.0)),
                BLACK.mix(0.35),
            ))?
            .label(format!("demand (peak {demand_max:.0} MiB)"))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.35)));
        chart
            .draw_series(LineSeries::new(
                [(0, threshold), (end, threshold)],
                RED.mix(0.5),
            ))?
            .label("threshold")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED.mix(0.5)));
        chart
            .draw_secondary_series(LineSeries::new(
                first.timeline.iter().map(|s| (s.t, s.ideal)),
                GREEN.mix(0.8),
            ))?
            .label("ideal instances")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], GREEN.mix(0.8)));
        let colours = [BLUE, MAGENTA, CYAN];
        for (run, colour) in runs.iter().zip(colours.into_iter().cycle()) {
            let name = run.scores.policy.clone();
            chart
                .draw_secondary_series(LineSeries::new(
                    run.timeline.iter().map(|s| (s.t, s.instances)),
                    colour.stroke_width(2),
                ))?
                .label(format!("{name}: instances"))
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(2))
                });
            chart
                .draw_series(LineSeries::new(
                    run.timeline.iter().map(|s| (s.t, s.utilization)),
                    colour.mix(0.4),
                ))?
                .label(format!("{name}: utilization %"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour.mix(0.4)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("cannot write {}: {e}", path.display()))
}
