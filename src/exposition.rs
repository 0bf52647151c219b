//! The two Prometheus text formats. prometheus-client writes OpenMetrics, which Prometheus asks
//! for when it scrapes; people, `curl` and `promtool check metrics` read the classic text
//! format (0.0.4), where a counter's `# HELP`/`# TYPE` lines carry its `_total` name and
//! there is no `# EOF`. [`negotiate`] picks one from the request's `Accept` header.

/// The content types of the two formats.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The body and content type for a client that sent `accept`: OpenMetrics to a client that
/// names it (Prometheus does), the classic format to every other.
pub fn negotiate(openmetrics: String, accept: Option<&str>) -> (String, &'static str) {
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (openmetrics, OPENMETRICS)
    } else {
        (classic(&openmetrics), CLASSIC)
    }
}

/// The classic text format of an OpenMetrics exposition: counters' metadata under their
/// `_total` name, `# UNIT` and `# EOF` lines dropped, samples unchanged.
pub fn classic(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                if !tail.is_empty() {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "# HELP x_actions Actions.\n# TYPE x_actions counter\n\
        x_actions_total{kind=\"create\"} 2\n# HELP x_up Up.\n# TYPE x_up gauge\n# UNIT x_up seconds\n\
        x_up 1\n# EOF\n";

    #[test]
    fn counters_carry_their_total_name_and_nothing_else_changes() {
        assert_eq!(
            classic(OM),
            "# HELP x_actions_total Actions.\n# TYPE x_actions_total counter\n\
             x_actions_total{kind=\"create\"} 2\n# HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n"
        );
    }

    #[test]
    fn prometheus_gets_openmetrics_and_everyone_else_the_classic_format() {
        let prometheus =
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        assert_eq!(
            negotiate(OM.into(), Some(prometheus)),
            (OM.into(), OPENMETRICS)
        );
        for accept in [None, Some("*/*"), Some("text/plain")] {
            assert_eq!(negotiate(OM.into(), accept).1, CLASSIC);
        }
    }
}
