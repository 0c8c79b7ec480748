//! nginx configuration checks: a parser for nginx's grammar and the rules that read it.

pub mod model;
pub mod parse;
pub mod rules;

use crate::finding::Finding;
use std::path::Path;

/// Loads `path` (following `include`) and runs every nginx rule over it.
pub fn check_file(
    path: &Path,
    prefix: Option<&Path>,
    root: Option<&Path>,
) -> Result<Vec<Finding>, parse::ParseError> {
    let tree = parse::load(path, prefix, root)?;
    Ok(rules::check(&tree))
}
