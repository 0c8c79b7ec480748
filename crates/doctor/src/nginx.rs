//! nginx configuration checks: a parser for nginx's grammar and the rules that read it.

pub mod model;
pub mod parse;
pub mod rules;

use crate::finding::{Finding, Location, Severity};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Loads `path` (following `include`) and runs every nginx rule over it; an include of a
/// file that is not there is a warning naming it, and the rest is still checked.
pub fn check_file(
    path: &Path,
    prefix: Option<&Path>,
    root: Option<&Path>,
) -> Result<Vec<Finding>, parse::ParseError> {
    let loaded = parse::load_lenient(path, prefix, root)?;
    // One finding per include position, however often its file was included.
    let mut at: BTreeMap<(String, u32, u32), (&parse::ParseError, BTreeSet<String>)> =
        BTreeMap::new();
    for m in &loaded.missing {
        let e = &m.error;
        let entry = at
            .entry((e.file.clone(), e.pos.line, e.pos.column))
            .or_insert_with(|| (e, BTreeSet::new()));
        if let Some(site) = &m.included_at {
            entry.1.insert(site.to_string());
        }
    }
    let mut out: Vec<Finding> = Vec::new();
    for (e, sites) in at.into_values() {
        let mut f = include_missing(e);
        if sites.len() > 1 {
            f.problem = format!(
                "{} (this file is included {} times: {})",
                f.problem,
                sites.len(),
                sites.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }
        if !sites.is_empty() {
            f = f.with_detail("included_from", sites.into_iter().collect::<Vec<_>>());
        }
        out.push(f);
    }
    out.extend(rules::check(&loaded.tree));
    Ok(out)
}

fn include_missing(e: &parse::ParseError) -> Finding {
    let name = match &e.kind {
        parse::ParseErrorKind::IncludeNotFound(n) => n.as_str(),
        _ => "?",
    };
    Finding::new(
        "include-missing",
        Severity::Warning,
        Location::at(e.file.clone(), e.pos.line, e.pos.column),
        format!("include \"{name}\" is not there, so its directives were not checked; the rest of the config was."),
        "nginx itself would not start without it (`nginx -t` fails). If the config was copied from another machine, its neighbour files were left behind.",
        format!("# check against a copy of the machine's whole config directory:\n# upkeep doctor nginx --root COPY_OF_ROOT /etc/nginx/nginx.conf\n# or --prefix DIR when \"{name}\" lives in another directory"),
    )
    .with_detail("include", name.to_owned())
}
