//! The load model and the scores on small traces whose answers can be worked out by hand.

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::decide::tests::spec;

pub(super) fn trace(text: &str) -> Trace {
    Trace::parse(Path::new("t.csv"), text).unwrap()
}

pub(super) const MODEL: LoadModel = LoadModel {
    limit_mib: 64.0,
    base_mib: 4.0,
    warmup: Duration::from_secs(2),
};

#[test]
fn a_steady_demand_the_minimum_holds_costs_nothing() {
    // 1 instance: 4 + 20 = 24 MiB of 64 (37.5 %), under 60 %: nothing to do, nothing lost.
    let run = simulate(
        &spec(1, 10, 60.0),
        &trace("t,demand_mib\n0,20\n600,20\n"),
        &MODEL,
        SimPolicy::Kubernetes,
    );
    let s = &run.scores;
    assert_eq!(
        (
            s.overload_s,
            s.oom_s,
            s.waste_instance_s,
            s.churn,
            s.flips,
            s.peak
        ),
        (0, 0, 0, 0, 0, 1)
    );
    assert_eq!(run.timeline.len(), 600);
    assert!((run.timeline[0].utilization - 37.5).abs() < 1e-9);
}

#[test]
fn a_step_is_scored_second_by_second() {
    // 250 MiB from t = 10 on one instance: at its limit (OOM and overload) until the step rule
    // adds instances, one per 10 s, each ready 2 s after its creation.
    let t = trace("t,demand_mib\n0,0\n10,250\n100,250\n");
    let run = simulate(&spec(1, 10, 60.0), &t, &MODEL, SimPolicy::Step);
    let s = &run.scores;
    // Ideal: ceil(250 / (0.6 × 64 − 4)) = 8. The step rule reaches it at t = 80 (+1 per 10 s
    // from t = 10).
    assert_eq!(run.timeline[50].ideal, 8);
    assert_eq!(s.peak, 8);
    assert_eq!(s.churn, 7);
    assert_eq!(s.flips, 0);
    assert!(s.oom_s >= 20 && s.overload_s >= s.oom_s, "{s:?}");
    assert_eq!(
        s.cost,
        10.0 * s.oom_s as f64
            + s.overload_s as f64
            + s.waste_instance_s as f64 / 60.0
            + 2.0 * s.churn as f64
    );
}

#[test]
fn without_a_ready_instance_utilization_counts_as_full() {
    let run = simulate(
        &spec(0, 3, 60.0),
        &trace("t,demand_mib\n0,10\n5,10\n"),
        &MODEL,
        SimPolicy::Kubernetes,
    );
    assert_eq!(run.timeline[0].utilization, 100.0);
    assert_eq!(run.scores.oom_s, 5);
    assert_eq!(run.scores.overload_s, 5);
}

#[test]
fn flips_count_changes_of_direction() {
    // Up and down twice with the step rule: 0 → 70 MiB → 0 → 70 MiB → 0.
    let t = trace("t,demand_mib\n0,70\n60,0\n200,70\n260,0\n400,0\n");
    let run = simulate(&spec(1, 10, 60.0), &t, &MODEL, SimPolicy::Step);
    assert_eq!(run.scores.flips, 3, "{:?}", run.scores);
}

#[test]
fn the_scores_print_as_a_table_and_as_json_with_the_contract_names() {
    let run = simulate(
        &spec(1, 10, 60.0),
        &trace("t,demand_mib\n0,20\n60,20\n"),
        &MODEL,
        SimPolicy::Kubernetes,
    );
    let json = serde_json::to_value(&run.scores).unwrap();
    for key in [
        "policy",
        "overload_s",
        "oom_s",
        "waste_instance_s",
        "churn",
        "flips",
        "peak",
    ] {
        assert!(json.get(key).is_some(), "{key} in {json}");
    }
    assert!(table(&[run.scores]).contains("| kubernetes "));
}

#[test]
fn limits_memory_sizes_read_as_incus_writes_them() {
    use crate::model::size::mib;
    assert_eq!(mib("64MiB"), Some(64.0));
    assert_eq!(mib("1GiB"), Some(1024.0));
    assert_eq!(mib("512MB"), Some(512e6 / 1048576.0));
    assert_eq!(mib("50%"), None);
    assert_eq!(mib("lots"), None);
}

/// The three policies of `--compare` on a one-minute spike, drawn with min 1 and max 10.
fn compared_plot(title: &str) -> String {
    let t = trace("t,demand_mib\n0,20\n60,250\n120,20\n400,20\n");
    let group = spec(1, 10, 60.0);
    let runs: Vec<Run> = [SimPolicy::Default, SimPolicy::Kubernetes, SimPolicy::Step]
        .into_iter()
        .map(|p| simulate(&group, &t, &MODEL, p))
        .collect();
    let plot = Plot {
        title,
        policy: "adaptive",
        threshold: 60.0,
        min: 1,
        max: 10,
    };
    svg(&plot, &runs)
}

/// Checks that `xml` is one well-formed element: tags nested and closed, attributes quoted and
/// not repeated, `&` only in the five named references and numeric ones, no stray `<` or `>`.
fn well_formed(xml: &str) -> Result<(), String> {
    fn references(text: &str) -> Result<(), String> {
        if text.contains('>') {
            return Err(format!("stray character in {text:?}"));
        }
        for (i, _) in text.match_indices('&') {
            let entity = &text[i + 1..text[i..].find(';').map_or(i + 1, |e| i + e)];
            let named = ["amp", "lt", "gt", "quot", "apos"].contains(&entity);
            let numeric = entity
                .strip_prefix('#')
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
            if !(named || numeric) {
                return Err(format!("bad reference &{entity} in {text:?}"));
            }
        }
        Ok(())
    }
    let (mut stack, mut closed_root, mut rest) = (Vec::<&str>::new(), false, xml);
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        if (stack.is_empty() && !text.trim().is_empty()) || closed_root && !text.trim().is_empty() {
            return Err(format!("text outside the root: {text:?}"));
        }
        references(text)?;
        let close = open + rest[open..].find('>').ok_or("a tag is not closed")?;
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if closed_root {
            return Err(format!("a second root: <{tag}>"));
        }
        if let Some(name) = tag.strip_prefix('/') {
            if stack.pop() != Some(name.trim()) {
                return Err(format!("</{name}> closes nothing open"));
            }
            closed_root = stack.is_empty();
            continue;
        }
        let (body, empty) = match tag.strip_suffix('/') {
            Some(body) => (body, true),
            None => (tag, false),
        };
        let name_end = body.find(char::is_whitespace).unwrap_or(body.len());
        let (name, mut attrs) = body.split_at(name_end);
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(format!("bad tag name in <{tag}>"));
        }
        let mut seen = Vec::new();
        loop {
            attrs = attrs.trim_start();
            if attrs.is_empty() {
                break;
            }
            let eq = attrs
                .find("=\"")
                .ok_or(format!("bad attribute in <{tag}>"))?;
            let key = &attrs[..eq];
            let end = attrs[eq + 2..].find('"').ok_or("an unclosed value")? + eq + 2;
            let value = &attrs[eq + 2..end];
            if key.contains(char::is_whitespace) || seen.contains(&key) || value.contains('<') {
                return Err(format!("bad or repeated attribute {key} in <{tag}>"));
            }
            references(value)?;
            seen.push(key);
            attrs = &attrs[end + 1..];
        }
        if empty {
            closed_root = stack.is_empty();
        } else {
            stack.push(name);
        }
    }
    match (stack.is_empty() && closed_root, rest.trim().is_empty()) {
        (true, true) => Ok(()),
        _ => Err(format!("unclosed elements {stack:?} or trailing text")),
    }
}

/// The grey of the demand and the ink of the ideal count; every other line of three points or
/// more is a policy's.
const DEMAND_GREY: &str = "#8C8C8C";
const INK: &str = "#222222";

/// The attributes (from a leading space) of each `<tag …>` in `svg`, in order.
fn elements<'a>(svg: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag} ");
    svg.match_indices(&open)
        .map(|(i, _)| {
            let rest = &svg[i + open.len() - 1..];
            &rest[..rest.find('>').unwrap()]
        })
        .collect()
}

/// The value of `name` in `element`'s attributes.
fn attr<'a>(element: &'a str, name: &str) -> &'a str {
    let key = format!(" {name}=\"");
    let start = element
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {element}"))
        + key.len();
    &element[start..start + element[start..].find('"').unwrap()]
}

/// The points of an element's `points`.
fn points(element: &str) -> Vec<(i32, i32)> {
    attr(element, "points")
        .split_whitespace()
        .map(|p| {
            let (x, y) = p.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect()
}

/// The lowest and highest y of `points` (y grows downwards).
fn span(points: &[(i32, i32)]) -> (i32, i32) {
    let ys = points.iter().map(|p| p.1);
    (ys.clone().min().unwrap(), ys.max().unwrap())
}

/// The content of each `<text>` of `svg`, in order.
fn texts(svg: &str) -> Vec<&str> {
    svg.split("<text ")
        .skip(1)
        .map(|t| t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()].trim())
        .collect()
}

/// (stroke, points) of each line of `svg`.
fn lines(svg: &str) -> Vec<(&str, Vec<(i32, i32)>)> {
    elements(svg, "polyline")
        .into_iter()
        .map(|l| (attr(l, "stroke"), points(l)))
        .collect()
}

/// Where the upper panel ends: the foot of the demand's grey area.
fn upper_foot(svg: &str) -> i32 {
    let areas: Vec<_> = elements(svg, "polygon")
        .into_iter()
        .filter(|p| attr(p, "fill") == DEMAND_GREY)
        .collect();
    assert_eq!(areas.len(), 1, "one demand area");
    span(&points(areas[0])).1
}

/// The policies' lines (colour, points) in the upper and in the lower panel, in drawing order.
type Lines<'a> = Vec<(&'a str, Vec<(i32, i32)>)>;
fn policy_lines(svg: &str) -> (Lines<'_>, Lines<'_>) {
    let foot = upper_foot(svg);
    lines(svg)
        .into_iter()
        .filter(|(stroke, points)| points.len() >= 3 && ![DEMAND_GREY, INK].contains(stroke))
        .partition(|(_, points)| span(points).1 <= foot)
}

#[test]
fn the_plot_is_well_formed_svg_in_two_panels_on_one_time_axis() {
    let picture = compared_plot("web on spike.csv");
    well_formed(&picture).unwrap();
    assert!(picture.starts_with("<svg"), "{picture:.100}");
    let words = texts(&picture);
    for label in [
        "demand (MiB)",
        "utilization of ready instances (%)",
        "threshold 60 %",
        "instances",
        "ideal instances",
    ] {
        assert!(words.contains(&label), "{label} in {words:?}");
    }
    // Three lines (one per policy) in each panel, the demand's above the instances'.
    let foot = upper_foot(&picture);
    let (upper, lower) = policy_lines(&picture);
    assert_eq!((upper.len(), lower.len()), (3, 3));
    assert!(
        lower.iter().all(|(_, p)| span(p).0 > foot),
        "instances below"
    );
    // The ideal count is drawn in the lower panel.
    let ideal: Vec<_> = lines(&picture)
        .into_iter()
        .filter(|(stroke, p)| *stroke == INK && p.len() >= 3)
        .collect();
    assert_eq!(ideal.len(), 1);
    assert!(span(&ideal[0].1).0 > foot);
    // The time axis is named once, under the lower panel.
    let named: Vec<_> = words.iter().filter(|w| w.starts_with("time (")).collect();
    assert_eq!(named, [&"time (s)"]);
    let time = elements(&picture, "text")
        .into_iter()
        .zip(&words)
        .find(|(_, w)| w.starts_with("time ("))
        .map(|(t, _)| attr(t, "y").parse::<i32>().unwrap())
        .unwrap();
    let bottom = lower.iter().map(|(_, p)| span(p).1).max().unwrap();
    assert!(time > bottom, "the time axis under the instances");
}

#[test]
fn each_policy_has_one_colour_in_both_panels_and_in_the_legend() {
    let picture = compared_plot("web on spike.csv");
    let (upper, lower) = policy_lines(&picture);
    let colours: Vec<&str> = upper.iter().map(|(c, _)| *c).collect();
    let below: Vec<&str> = lower.iter().map(|(c, _)| *c).collect();
    assert_eq!(colours, below);
    let mut distinct = colours.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{colours:?}");
    // The legend names the policies in the order of the runs; its swatches follow its labels.
    let words = texts(&picture);
    let entries: Vec<&str> = words
        .iter()
        .filter_map(|w| w.split_once(": cost ").map(|(p, _)| p))
        .collect();
    assert_eq!(entries, ["default (adaptive)", "kubernetes", "step"]);
    let after = &picture[picture.find("step: cost ").unwrap()..];
    let swatches: Vec<&str> = lines(after).iter().take(3).map(|(c, _)| *c).collect();
    assert_eq!(swatches, colours);
    // So do the demand's and the ideal count's, in their own column.
    let after = &picture[picture.find(">\nideal instances").unwrap()..];
    let others: Vec<&str> = lines(after).iter().take(2).map(|(c, _)| *c).collect();
    assert_eq!(others, [DEMAND_GREY, INK]);
}

#[test]
fn the_instances_panel_draws_min_and_max() {
    let picture = compared_plot("web on spike.csv");
    let words = texts(&picture);
    assert!(
        words.contains(&"min 1") && words.contains(&"max 10"),
        "{words:?}"
    );
    // Two dashed lines (drawn as many short strokes), both in the lower panel, max above min.
    let foot = upper_foot(&picture);
    let mut heights: Vec<i32> = lines(&picture)
        .into_iter()
        .filter(|(stroke, _)| *stroke == "#666666")
        .map(|(_, p)| span(&p).0)
        .collect();
    heights.dedup();
    assert_eq!(heights.len(), 2, "{heights:?}");
    assert!(heights.iter().all(|y| *y > foot));
    assert!(heights[1] < heights[0], "max above min");
}

#[test]
fn the_plot_stays_well_formed_with_markup_in_its_title_and_without_runs() {
    let picture = compared_plot(r#"<web> & "spike's".csv"#);
    well_formed(&picture).unwrap();
    assert!(picture.contains("&lt;web&gt; &amp; &quot;spike&apos;s&quot;.csv"));
    let plot = Plot {
        title: "nothing",
        policy: "adaptive",
        threshold: 60.0,
        min: 2,
        max: 2,
    };
    let empty = svg(&plot, &[]);
    well_formed(&empty).unwrap();
    let words = texts(&empty);
    for label in ["demand (MiB)", "instances", "time (s)", "min, max 2"] {
        assert!(words.contains(&label), "{label} in {words:?}");
    }
    assert!(well_formed("<svg><g></svg>").is_err());
    assert!(well_formed(r#"<svg a="1" a="2"/>"#).is_err());
    assert!(well_formed("<svg>a & b</svg>").is_err());
}

#[test]
fn a_long_run_is_thinned_to_what_the_panel_can_show() {
    // A count that changes every second for 30 days, between min 0 and max 6.
    let timeline: Vec<Second> = (0..30 * 24 * 3600)
        .map(|t| Second {
            t,
            demand_mib: (t % 5) as f64,
            instances: (t % 7) as u32,
            ideal: 3,
            utilization: 50.0,
        })
        .collect();
    let run = Run {
        scores: Scores {
            policy: "step".into(),
            overload_s: 0,
            oom_s: 0,
            waste_instance_s: 0,
            churn: 0,
            flips: 0,
            peak: 6,
            cost: 0.0,
        },
        timeline,
    };
    let plot = Plot {
        title: "30 days",
        policy: "adaptive",
        threshold: 60.0,
        min: 0,
        max: 6,
    };
    let picture = svg(&plot, &[run]);
    assert!(picture.len() < 150_000, "{} bytes", picture.len());
    well_formed(&picture).unwrap();
    assert!(texts(&picture).contains(&"time (days)"));
    // Each column of the instances still spans the full range: 0 and 6 are both drawn.
    let (_, lower) = policy_lines(&picture);
    let bounds: Vec<i32> = lines(&picture)
        .into_iter()
        .filter(|(stroke, _)| *stroke == "#666666")
        .map(|(_, p)| span(&p).0)
        .collect();
    let (top, bottom) = (*bounds.iter().min().unwrap(), *bounds.iter().max().unwrap());
    assert_eq!(span(&lower[0].1), (top, bottom));
}
