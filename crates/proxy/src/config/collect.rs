//! Reads the TOML surface reporting every problem in one run. serde stops at the first error,
//! so each error's key (or the table it is about) is taken out of the parsed document and the
//! rest is read again; the positions of everything else stay those of the file.

use std::ops::Range;

use serde::Deserialize;
use toml::de::{DeArray, DeTable, DeValue};

use super::surface::File;

/// Enough for any real file; a bound so that no input can loop.
const MAX_ROUNDS: usize = 256;

/// One problem in the surface: where, and what, in the config's own words.
pub(super) struct SurfaceProblem {
    pub span: Range<usize>,
    pub message: String,
}

/// The surface of `text`, as much of it as is readable, and every problem met on the way.
pub(super) fn surface(text: &str) -> (Option<File>, Vec<SurfaceProblem>) {
    let (root, syntax) = DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        let problems = syntax
            .iter()
            .map(|e| SurfaceProblem {
                span: e.span().unwrap_or(0..0),
                message: e.message().trim().to_owned(),
            })
            .collect();
        return (None, problems);
    }
    let mut root = root;
    let mut problems = Vec::new();
    // Keys taken out; a "missing field" about one of them repeats a problem already reported.
    let mut removed: Vec<String> = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let de = toml::de::Deserializer::from(root.clone());
        let err = match File::deserialize(de) {
            Ok(file) => return (Some(file), problems),
            Err(e) => e,
        };
        let message = in_our_words(err.message());
        let follow_on = missing_field(&message).is_some_and(|f| removed.iter().any(|r| r == f));
        let Some(span) = err.span() else {
            problems.push(SurfaceProblem {
                span: 0..0,
                message,
            });
            return (None, problems);
        };
        if !follow_on {
            problems.push(SurfaceProblem {
                span: span.clone(),
                message,
            });
        }
        if !remove_containing(root.get_mut(), &span, &mut removed) {
            return (None, problems);
        }
    }
    (None, problems)
}

fn missing_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("missing field `")?;
    rest.split('`').next()
}

/// serde's wording (`invalid type: string "x", expected i64`) turned into the config's.
pub(super) fn in_our_words(message: &str) -> String {
    let message = message.trim();
    let Some(rest) = message.strip_prefix("invalid type: ") else {
        return message.to_owned();
    };
    let Some((found, expected)) = rest.rsplit_once(", expected ") else {
        return message.to_owned();
    };
    let expected = match expected {
        "i64" | "i32" | "u64" | "u32" | "u16" | "u8" | "usize" => "a whole number",
        "a boolean" => "true or false",
        "a sequence" => "a list like [\"a\", \"b\"]",
        "a map" => "a table",
        other if other.starts_with("struct ") => "a table",
        other => other,
    };
    let found = match found {
        "map" => "a table",
        "sequence" => "a list",
        other => other,
    };
    format!("expected {expected}, found {found}")
}

/// Takes out the innermost entry (or array element) that `span` falls in, deepest first, so
/// a table whose own span is `span` (a missing field, a wrong shape) goes as a whole. Returns
/// whether something was removed.
fn remove_containing(
    table: &mut DeTable<'_>,
    span: &Range<usize>,
    removed: &mut Vec<String>,
) -> bool {
    for (_, v) in table.iter_mut() {
        let found = match v.get_mut() {
            DeValue::Table(t) => remove_containing(t, span, removed),
            DeValue::Array(a) => remove_in_array(a, span, removed),
            _ => false,
        };
        if found {
            return true;
        }
    }
    let hit = table
        .iter()
        .find(|(k, v)| covers(k.span(), span) || covers(v.span(), span))
        .map(|(k, _)| k.clone());
    match hit {
        Some(key) => {
            table.remove(&key);
            removed.push(key.get_ref().to_string());
            true
        }
        None => false,
    }
}

fn remove_in_array(a: &mut DeArray<'_>, span: &Range<usize>, removed: &mut Vec<String>) -> bool {
    for v in a.iter_mut() {
        let found = match v.get_mut() {
            DeValue::Table(t) => remove_containing(t, span, removed),
            DeValue::Array(inner) => remove_in_array(inner, span, removed),
            _ => false,
        };
        if found {
            return true;
        }
    }
    let Some(i) = a.iter().position(|v| covers(v.span(), span)) else {
        return false;
    };
    // Rebuilt without the element: an array has no remove.
    let mut rebuilt = DeArray::new();
    for (j, v) in a.iter().enumerate() {
        if j != i {
            rebuilt.push(v.clone());
        }
    }
    *a = rebuilt;
    true
}

fn covers(outer: Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_wording_becomes_the_configs() {
        assert_eq!(
            in_our_words("invalid type: string \"x\", expected i64"),
            "expected a whole number, found string \"x\""
        );
        assert_eq!(
            in_our_words("invalid type: integer `5`, expected a duration like \"5s\" or \"250ms\""),
            "expected a duration like \"5s\" or \"250ms\", found integer `5`"
        );
        assert_eq!(
            in_our_words("invalid type: string \"yes\", expected a boolean"),
            "expected true or false, found string \"yes\""
        );
    }
}
