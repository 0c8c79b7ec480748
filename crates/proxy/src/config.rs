//! Configuration: TOML surface -> validation with file:line:column -> immutable model.

mod collect;
mod duration;
mod model;
mod print;
mod protocol;
mod route_rules;
mod surface;
mod upstream_tls;
mod validate;

use std::fmt;
use std::path::{Path, PathBuf};

pub use duration::parse_duration;
pub use model::*;
pub use print::{to_toml, PrintError};
pub use protocol::UpstreamProtocol;
pub use route_rules::*;
pub use validate::parse_endpoint;

/// One problem found in a config file, with its position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file the problem is in.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong, and what would be right.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

/// Every problem found in a config, in file order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The problems; never empty.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// Reads and validates a config file; warnings (deprecated keys) are logged.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let (cfg, warnings) = load_with_warnings(path)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(cfg)
}

/// Reads and validates a config file, returning the warnings beside the config.
pub fn load_with_warnings(path: &Path) -> Result<(Config, Vec<Problem>), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        problems: vec![Problem {
            file: path.to_owned(),
            line: 0,
            column: 0,
            message: format!("cannot read config: {e}"),
        }],
    })?;
    parse_with_warnings(path, &text)
}

/// Validates config text; `path` names it in problems and anchors relative paths.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let (cfg, warnings) = parse_with_warnings(path, text)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(cfg)
}

/// Like `parse`, returning the warnings (deprecated keys) beside the config.
pub fn parse_with_warnings(path: &Path, text: &str) -> Result<(Config, Vec<Problem>), ConfigError> {
    let locate = Locator::new(path, text);
    let (surface, found) = collect::surface(text);
    let partial = !found.is_empty();
    let mut cx = validate::Ctx {
        loc: &locate,
        partial,
        problems: found
            .into_iter()
            .map(|p| locate.problem(p.span, p.message))
            .collect(),
        warnings: Vec::new(),
    };
    // What could be read is validated too, so one run reports every problem in the file.
    let cfg = surface.and_then(|s| validate::validate(s, &mut cx));
    match cfg {
        Some(cfg) if cx.problems.is_empty() => Ok((cfg, cx.warnings)),
        _ => {
            let mut problems = cx.problems;
            problems.sort_by_key(|p| (p.line, p.column));
            problems.dedup();
            if problems.is_empty() {
                problems.push(locate.problem(0..0, "the file could not be read as a config"));
            }
            Err(ConfigError { problems })
        }
    }
}

/// Maps byte offsets to line and column.
pub(crate) struct Locator {
    file: PathBuf,
    line_starts: Vec<usize>,
    text_len: usize,
}

impl Locator {
    fn new(file: &Path, text: &str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self {
            file: file.to_owned(),
            line_starts,
            text_len: text.len(),
        }
    }

    fn position(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text_len);
        let line = self.line_starts.partition_point(|&s| s <= offset);
        let start = self.line_starts[line - 1];
        (line, offset - start + 1)
    }

    pub(crate) fn problem(
        &self,
        span: std::ops::Range<usize>,
        message: impl Into<String>,
    ) -> Problem {
        let (line, column) = self.position(span.start);
        Problem {
            file: self.file.clone(),
            line,
            column,
            message: message.into(),
        }
    }

    pub(crate) fn base_dir(&self) -> PathBuf {
        self.file.parent().map(Path::to_owned).unwrap_or_default()
    }
}
