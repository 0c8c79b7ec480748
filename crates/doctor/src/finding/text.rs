//! Text output for people, coloured when writing to a terminal.

use super::{Finding, Severity};
use std::fmt::Write as _;

/// Renders findings as text; `colour` adds ANSI colours (for a TTY).
pub fn render_text(findings: &[Finding], colour: bool) -> String {
    let mut out = String::new();
    for f in findings {
        let (on, off) = if colour {
            let code = match f.severity {
                Severity::Error => "\x1b[1;31m",
                Severity::Warning => "\x1b[1;33m",
                Severity::Info => "\x1b[1;36m",
            };
            (code, "\x1b[0m")
        } else {
            ("", "")
        };
        let _ = writeln!(
            out,
            "{}: {on}{}{off} [{}] {}",
            f.location, f.severity, f.rule, f.problem
        );
        let _ = writeln!(out, "  consequence: {}", f.consequence);
        let _ = writeln!(out, "  fix:");
        for line in f.fix.lines() {
            let _ = writeln!(out, "    {line}");
        }
        out.push('\n');
    }
    let count = |s| findings.iter().filter(|f| f.severity == s).count();
    let _ = writeln!(
        out,
        "{} finding(s): {} error, {} warning, {} info",
        findings.len(),
        count(Severity::Error),
        count(Severity::Warning),
        count(Severity::Info)
    );
    out
}
