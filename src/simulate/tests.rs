//! The load model and the scores on small traces whose answers can be worked out by hand.

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::decide::tests::spec;

fn trace(text: &str) -> Trace {
    Trace::parse(Path::new("t.csv"), text).unwrap()
}

const MODEL: LoadModel = LoadModel {
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
    use super::command::mib;
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

/// The content of the panel `id`.
fn panel<'a>(picture: &'a str, id: &str) -> &'a str {
    let start = picture
        .find(&format!(r#"<g class="panel" id="{id}">"#))
        .unwrap_or_else(|| panic!("no panel {id}"));
    let end = start + picture[start..].find("</g>").unwrap();
    &picture[start..end]
}

/// The value of `name` in the first element of `line` that has it.
fn attr<'a>(line: &'a str, name: &str) -> &'a str {
    let key = format!(" {name}=\"");
    let start = line
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        + key.len();
    &line[start..start + line[start..].find('"').unwrap()]
}

/// (policy, stroke) of each policy's line in `panel`.
fn policy_lines(panel: &str) -> Vec<(&str, &str)> {
    panel
        .lines()
        .filter(|l| l.contains(r#"class="policy""#))
        .map(|l| (attr(l, "data-policy"), attr(l, "stroke")))
        .collect()
}

#[test]
fn the_plot_is_well_formed_svg_in_two_panels_on_one_time_axis() {
    let picture = compared_plot("web on spike.csv");
    well_formed(&picture).unwrap();
    assert!(picture.starts_with("<svg"), "{picture:.100}");
    assert_eq!(picture.matches(r#"<g class="panel""#).count(), 2);
    let (upper, lower) = (panel(&picture, "demand"), panel(&picture, "instances"));
    assert!(
        picture.find(upper).unwrap() < picture.find(lower).unwrap(),
        "demand above"
    );
    assert!(upper.contains("demand (MiB)") && upper.contains(r#"class="demand""#));
    assert!(upper.contains("utilization of ready instances (%)"));
    assert!(upper.contains("threshold 60 %"));
    assert!(lower.contains(">instances<") && lower.contains(r#"class="ideal""#));
    // The time axis is named once, under the lower panel.
    assert_eq!(picture.matches("time (s)").count(), 1);
    assert!(lower.contains("time (s)"));
}

#[test]
fn each_policy_has_one_colour_in_both_panels_and_in_the_legend() {
    let picture = compared_plot("web on spike.csv");
    let upper = policy_lines(panel(&picture, "demand"));
    let lower = policy_lines(panel(&picture, "instances"));
    let names: Vec<&str> = upper.iter().map(|(p, _)| *p).collect();
    assert_eq!(names, ["default", "kubernetes", "step"]);
    assert_eq!(upper, lower);
    let mut colours: Vec<&str> = upper.iter().map(|(_, c)| *c).collect();
    colours.dedup();
    assert_eq!(colours.len(), 3, "{colours:?}");
    let legend = &picture[picture.find(r#"<g class="legend">"#).unwrap()..];
    for ((policy, colour), label) in upper
        .iter()
        .zip(["default (adaptive)", "kubernetes", "step"])
    {
        let entry = legend
            .lines()
            .position(|l| l.contains(&format!(">{label}: cost ")))
            .unwrap_or_else(|| panic!("{policy} is not in the legend"));
        let swatch = legend.lines().nth(entry - 1).unwrap();
        assert_eq!(attr(swatch, "stroke"), *colour, "{policy}");
    }
}

#[test]
fn the_instances_panel_draws_min_and_max() {
    let picture = compared_plot("web on spike.csv");
    let lower = panel(&picture, "instances");
    for (bound, label) in [("min", ">min 1<"), ("max", ">max 10<")] {
        assert!(
            lower.contains(&format!(r#"data-bound="{bound}""#)),
            "{bound}"
        );
        assert!(lower.contains(label), "{label}");
    }
    assert!(!panel(&picture, "demand").contains("data-bound"));
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
    assert_eq!(empty.matches(r#"<g class="panel""#).count(), 2);
    assert!(empty.contains(">min, max 2<"));
    assert!(well_formed("<svg><g></svg>").is_err());
    assert!(well_formed(r#"<svg a="1" a="2"/>"#).is_err());
    assert!(well_formed("<svg>a & b</svg>").is_err());
}

#[test]
fn a_long_run_is_thinned_to_what_the_panel_can_show() {
    use super::draw::{step_path, Scale};
    // A count that changes every second for 30 days, on 850 pixels.
    let n = 30 * 24 * 3600;
    let x = Scale {
        lo: 0.0,
        hi: n as f64,
        from: 0.0,
        to: 850.0,
    };
    let y = Scale {
        lo: 0.0,
        hi: 10.0,
        from: 100.0,
        to: 0.0,
    };
    let d = step_path((0..n).map(|t| (t % 7) as f64), &x, &y, 0.0);
    assert!(d.len() < 40_000, "{} characters", d.len());
    // Each column still spans the full range: 0 and 6 are both drawn.
    assert!(d.contains("V100") && d.contains("V40"), "{d:.200}");
    // Held values are one horizontal stroke each.
    assert_eq!(
        step_path([1.0, 1.0, 2.0, 2.0], &x_of(4.0), &y, 0.0),
        "M0 90H2V80H4"
    );
}

fn x_of(seconds: f64) -> super::draw::Scale {
    super::draw::Scale {
        lo: 0.0,
        hi: seconds,
        from: 0.0,
        to: seconds,
    }
}
