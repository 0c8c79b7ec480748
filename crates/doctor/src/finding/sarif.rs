//! SARIF 2.1.0 output, for code-scanning UIs.

use super::{rule_info, Finding, Severity, RULES};
use serde_json::{json, Value};

/// Renders findings as a SARIF 2.1.0 log with one run.
pub fn render_sarif(findings: &[Finding]) -> String {
    let rules: Vec<Value> = RULES
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "shortDescription": { "text": r.description },
            })
        })
        .collect();
    let results: Vec<Value> = findings.iter().map(result).collect();
    let doc = json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": {
                "name": "upkeep-doctor",
                "version": env!("CARGO_PKG_VERSION"),
                "rules": rules,
            }},
            "results": results,
        }],
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

fn result(f: &Finding) -> Value {
    let level = match f.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Info => "note",
    };
    let mut physical = json!({ "artifactLocation": { "uri": uri(&f.location.file) } });
    if let Some(line) = f.location.line.filter(|l| *l > 0) {
        let mut region = json!({ "startLine": line });
        if let Some(col) = f.location.column.filter(|c| *c > 0) {
            region["startColumn"] = json!(col);
        }
        physical["region"] = region;
    }
    let mut r = json!({
        "ruleId": f.rule,
        "level": level,
        "message": { "text": format!("{} {} Fix:\n{}", f.problem, f.consequence, f.fix) },
        "locations": [{ "physicalLocation": physical }],
    });
    if let Some(index) = RULES.iter().position(|r| r.id == f.rule) {
        r["ruleIndex"] = json!(index);
    }
    debug_assert!(rule_info(f.rule).is_some(), "unknown rule {}", f.rule);
    if !f.details.is_empty() {
        r["properties"] = Value::Object(f.details.clone());
    }
    r
}

/// Paths become relative URI references with forward slashes; URLs stay as they are.
fn uri(file: &str) -> String {
    if file.contains("://") {
        return file.to_owned();
    }
    let mut out = String::with_capacity(file.len());
    for ch in file.chars() {
        match ch {
            '\\' => out.push('/'),
            ' ' => out.push_str("%20"),
            '%' => out.push_str("%25"),
            '#' => out.push_str("%23"),
            '?' => out.push_str("%3F"),
            c => out.push(c),
        }
    }
    out
}
