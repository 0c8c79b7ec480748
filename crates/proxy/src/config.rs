//! Configuration: TOML surface -> validation with file:line:column -> immutable model.

mod duration;
mod model;
mod print;
mod surface;
mod upstream_tls;
mod validate;

use std::fmt;
use std::path::{Path, PathBuf};

pub use duration::parse_duration;
pub use model::*;
pub use print::{to_toml, PrintError};
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

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        problems: vec![Problem {
            file: path.to_owned(),
            line: 0,
            column: 0,
            message: format!("cannot read config: {e}"),
        }],
    })?;
    parse(path, &text)
}

/// Validates config text; `path` names it in problems and anchors relative paths.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let locate = Locator::new(path, text);
    let surface: surface::File = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map(|s| locate.position(s.start)).unwrap_or((0, 0));
        ConfigError {
            problems: vec![Problem {
                file: path.to_owned(),
                line,
                column,
                message: e.message().trim().to_owned(),
            }],
        }
    })?;
    validate::validate(surface, &locate)
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
