//! JSON output: one object with a findings array, stable field names.

use super::Finding;

/// Renders findings as a pretty-printed JSON document.
pub fn render_json(findings: &[Finding]) -> String {
    let doc = serde_json::json!({
        "tool": "upkeep-doctor",
        "version": env!("CARGO_PKG_VERSION"),
        "findings": findings,
    });
    // A tree of plain maps and strings always serializes.
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}
