//! The config loader's invariants, shared by the `config_load` fuzz target and the corpus
//! replay in `cargo test`: any text gives a config or problems whose positions lie inside
//! the text, never a panic or a hang.

use std::path::Path;

/// Loads `data` as a config file and checks every problem's position.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines: Vec<&str> = text.split('\n').collect();
    match upkeep_proxy::config::parse_with_warnings(Path::new("fuzz.toml"), text) {
        Ok((cfg, warnings)) => {
            assert!(!cfg.listeners.is_empty() && !cfg.routes.is_empty());
            for w in &warnings {
                assert!(w.line >= 1 && w.line <= lines.len(), "{w}");
            }
        }
        Err(e) => {
            assert!(!e.problems.is_empty());
            for p in &e.problems {
                assert!(p.line >= 1 && p.line <= lines.len(), "{p}");
                let len = lines[p.line - 1].len();
                assert!(p.column >= 1 && p.column <= len + 1, "{p}");
                assert!(!p.message.is_empty(), "{p}");
            }
        }
    }
}
