//! `/metrics` in the format the scraper asks for: the Prometheus text format 0.0.4 (the
//! default, and what `promtool check metrics` reads) or OpenMetrics 1.0.0, chosen by `Accept`.
//!
//! Every family is encoded once, as OpenMetrics; the 0.0.4 form is derived from it. The two
//! differ where a parser would notice: a counter's `# HELP`/`# TYPE` name carries `_total` in
//! 0.0.4 (else promtool sees untyped samples without help), and 0.0.4 has no `# EOF` or
//! `# UNIT` lines.

use std::collections::HashMap;
use std::sync::Arc;

use crate::upstream::Group;

use super::Metrics;

/// An exposition format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Prometheus,
    /// OpenMetrics text format 1.0.0.
    OpenMetrics,
}

impl Format {
    /// Picks the format for an `Accept` header: OpenMetrics when it is asked for at least as
    /// strongly as plain text, else (also without `Accept`) the Prometheus text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Prometheus;
        };
        let (mut om, mut text) = (0.0f32, 0.0f32);
        for range in accept.split(',') {
            let mut params = range.split(';');
            let media = params.next().unwrap_or("").trim().to_ascii_lowercase();
            let (mut q, mut version) = (1.0f32, None);
            for p in params {
                let Some((k, v)) = p.split_once('=') else {
                    continue;
                };
                let v = v.trim().trim_matches('"');
                match k.trim().to_ascii_lowercase().as_str() {
                    "q" => q = v.parse().unwrap_or(0.0),
                    "version" => version = Some(v.to_owned()),
                    _ => {}
                }
            }
            let version_is = |ok: &[&str]| version.as_deref().is_none_or(|v| ok.contains(&v));
            match media.as_str() {
                "application/openmetrics-text" if version_is(&["1.0.0", "0.0.1"]) => om = om.max(q),
                "text/plain" if version_is(&["0.0.4"]) => text = text.max(q),
                "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if om > 0.0 && om >= text {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    /// The `Content-Type` of a body in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Every family: the registry's and the per-peer ones read from `groups` now.
pub fn scrape<'a>(
    metrics: &Metrics,
    groups: impl Iterator<Item = (&'a String, &'a Arc<Group>)>,
    format: Format,
) -> String {
    let mut om = metrics.encode_families();
    let groups: Vec<_> = groups.collect();
    super::peers::encode(&mut om, groups.iter().copied());
    super::kubernetes::encode(&mut om, &groups);
    match format {
        Format::OpenMetrics => {
            om.push_str("# EOF\n");
            om
        }
        Format::Prometheus => to_prometheus(&om),
    }
}

/// Rewrites OpenMetrics text (without `# EOF`) as Prometheus text format 0.0.4.
fn to_prometheus(om: &str) -> String {
    // Family name -> (0.0.4 name, 0.0.4 type).
    let mut families: HashMap<&str, (String, &str)> = HashMap::new();
    for line in om.lines() {
        let Some((name, kind)) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.split_once(' '))
        else {
            continue;
        };
        let renamed = match kind {
            "counter" => (format!("{name}_total"), "counter"),
            "info" => (format!("{name}_info"), "gauge"),
            "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
            _ => (name.to_owned(), "untyped"),
        };
        families.insert(name, renamed);
    }
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = families.get(name).map_or(name, |f| f.0.as_str());
            // 0.0.4 escapes only backslash and newline in help text.
            out.push_str(&format!("# HELP {name} {}\n", help.replace("\\\"", "\"")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_once(' ').map_or(rest, |(n, _)| n);
            match families.get(name) {
                Some((renamed, kind)) => out.push_str(&format!("# TYPE {renamed} {kind}\n")),
                None => out.push_str(&format!("{line}\n")),
            }
        } else if !line.starts_with('#') && is_created_sample(line, &families) {
            // Creation timestamps are OpenMetrics-only samples.
            continue;
        } else {
            // Samples are spelled alike; an exemplar (` # {...}`) is OpenMetrics-only.
            let sample = line.split_once(" # ").map_or(line, |(s, _)| s);
            out.push_str(sample);
            out.push('\n');
        }
    }
    out
}

/// `<family>_created` of a counter, histogram or summary family.
fn is_created_sample(line: &str, families: &HashMap<&str, (String, &str)>) -> bool {
    let name = line.split(['{', ' ']).next().unwrap_or("");
    name.strip_suffix("_created")
        .and_then(|family| families.get(family))
        .is_some_and(|(_, kind)| matches!(*kind, "counter" | "histogram" | "summary"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_chooses_the_format() {
        use Format::*;
        let cases = [
            (None, Prometheus),
            (Some("*/*"), Prometheus),
            (Some("text/plain;version=0.0.4"), Prometheus),
            (Some("application/openmetrics-text"), OpenMetrics),
            (Some("application/openmetrics-text; version=1.0.0"), OpenMetrics),
            // What Prometheus 2.x sends by default.
            (
                Some("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
                OpenMetrics,
            ),
            (
                Some("text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5"),
                Prometheus,
            ),
            (Some("application/openmetrics-text;q=0"), Prometheus),
            (Some("application/openmetrics-text;version=9.9.9"), Prometheus),
            (Some("application/json"), Prometheus),
        ];
        for (accept, want) in cases {
            assert_eq!(Format::negotiate(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn counters_are_typed_by_their_sample_name_in_the_text_format() {
        let om = "# HELP upkeep_requests Requests received downstream\n\
                  # TYPE upkeep_requests counter\n\
                  upkeep_requests_total 3\n\
                  upkeep_requests_created 1.7e9\n\
                  # HELP upkeep_build Build\n\
                  # TYPE upkeep_build info\n\
                  upkeep_build_info{version=\"1\"} 1\n\
                  # HELP upkeep_x_seconds A \\\"quoted\\\" help\n\
                  # TYPE upkeep_x_seconds histogram\n\
                  # UNIT upkeep_x_seconds seconds\n\
                  upkeep_x_seconds_bucket{le=\"+Inf\"} 1 # {id=\"a\"} 0.5\n";
        assert_eq!(
            to_prometheus(om),
            "# HELP upkeep_requests_total Requests received downstream\n\
             # TYPE upkeep_requests_total counter\n\
             upkeep_requests_total 3\n\
             # HELP upkeep_build_info Build\n\
             # TYPE upkeep_build_info gauge\n\
             upkeep_build_info{version=\"1\"} 1\n\
             # HELP upkeep_x_seconds A \"quoted\" help\n\
             # TYPE upkeep_x_seconds histogram\n\
             upkeep_x_seconds_bucket{le=\"+Inf\"} 1\n"
        );
    }
}
