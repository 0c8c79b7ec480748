//! The TOML zone file: surface structs, validation, and errors with line and column.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::{normalize, Mode, Zone, DEFAULT_TTL};

/// A zone file problem, located at a line and column (both 1-based).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ZoneError {
    /// 1-based line of the offending text.
    pub line: usize,
    /// 1-based column (in characters) of the offending text.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Surface {
    #[serde(default)]
    names: BTreeMap<Spanned<String>, Spanned<EntrySurface>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntrySurface {
    mode: Spanned<ModeName>,
    #[serde(default)]
    addrs: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    ttl: Option<Spanned<i64>>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum ModeName {
    Fixed,
    Alternate,
    NxDomain,
    NoData,
    ServFail,
    Refused,
    Silent,
}

pub(super) fn parse(text: &str) -> Result<Zone, ZoneError> {
    let surface: Surface = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        at(text, span, e.message().trim_end().to_owned())
    })?;
    let mut zone = Zone::new();
    for (name, entry) in surface.names {
        let key = normalize(name.get_ref());
        if let Err(why) = check_name(&key) {
            return Err(at(
                text,
                name.span(),
                format!("invalid name {:?}: {why}", name.get_ref()),
            ));
        }
        if zone.get(&key).is_some() {
            return Err(at(
                text,
                name.span(),
                format!(
                    "name {:?} appears twice (names are case-insensitive)",
                    name.get_ref()
                ),
            ));
        }
        let entry_span = entry.span();
        let entry = entry.into_inner();
        let ttl = match entry.ttl {
            None => DEFAULT_TTL,
            Some(ttl) => match u32::try_from(*ttl.get_ref()) {
                // RFC 2181 8: a TTL is an unsigned 31-bit number.
                Ok(v) if v <= i32::MAX as u32 => v,
                _ => {
                    return Err(at(
                        text,
                        ttl.span(),
                        format!("ttl must be between 0 and {}", i32::MAX),
                    ))
                }
            },
        };
        let addrs = match entry.addrs {
            None => None,
            Some(list) => {
                let span = list.span();
                let mut out = Vec::new();
                for addr in list.into_inner() {
                    match addr.get_ref().parse::<IpAddr>() {
                        Ok(ip) => out.push(ip),
                        Err(_) => {
                            return Err(at(
                                text,
                                addr.span(),
                                format!("{:?} is not an IP address", addr.get_ref()),
                            ))
                        }
                    }
                }
                Some((out, span))
            }
        };
        let mode = match (*entry.mode.get_ref(), addrs) {
            (ModeName::Fixed | ModeName::Alternate, None) => {
                return Err(at(
                    text,
                    entry_span,
                    "modes fixed and alternate need `addrs`".to_owned(),
                ))
            }
            (ModeName::Fixed | ModeName::Alternate, Some((addrs, span))) if addrs.is_empty() => {
                return Err(at(text, span, "`addrs` is empty".to_owned()));
            }
            (ModeName::Fixed, Some((addrs, _))) => Mode::Fixed(addrs),
            (ModeName::Alternate, Some((addrs, _))) => Mode::Alternate(addrs),
            (_, Some((_, span))) => {
                return Err(at(
                    text,
                    span,
                    "`addrs` only applies to modes fixed and alternate".to_owned(),
                ))
            }
            (ModeName::NxDomain, None) => Mode::NxDomain,
            (ModeName::NoData, None) => Mode::NoData,
            (ModeName::ServFail, None) => Mode::ServFail,
            (ModeName::Refused, None) => Mode::Refused,
            (ModeName::Silent, None) => Mode::Silent,
        };
        zone.insert(&key, mode, ttl);
    }
    Ok(zone)
}

/// Checks the RFC 1035 shape of a (normalized) name: labels of 1..=63 letters, digits,
/// `-` or `_`, at most 253 characters in all.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty name");
    }
    if name.len() > 253 {
        return Err("longer than 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label");
        }
        if label.len() > 63 {
            return Err("label longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("labels may hold only letters, digits, '-' and '_'");
        }
    }
    Ok(())
}

fn at(text: &str, span: Range<usize>, message: String) -> ZoneError {
    let (line, column) = line_column(text, span.start);
    ZoneError {
        line,
        column,
        message,
    }
}

/// 1-based line and character column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zone::Entry;

    #[test]
    fn parses_every_mode_and_defaults_ttl() {
        let text = r#"
[names."app.upkeep.test"]
mode = "alternate"
addrs = ["127.0.0.2", "127.0.0.3"]
ttl = 1

[names."Fixed.Upkeep.Test."]
mode = "fixed"
addrs = ["127.0.0.4", "::1"]

[names."nx.upkeep.test"]
mode = "nxdomain"
[names."empty.upkeep.test"]
mode = "nodata"
[names."fail.upkeep.test"]
mode = "servfail"
[names."no.upkeep.test"]
mode = "refused"
[names."quiet.upkeep.test"]
mode = "silent"
"#;
        let zone = Zone::from_toml_str(text).expect("valid zone");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            zone.get("app.upkeep.test"),
            Some(&Entry {
                mode: Mode::Alternate(vec![ip("127.0.0.2"), ip("127.0.0.3")]),
                ttl: 1
            })
        );
        assert_eq!(
            zone.get("fixed.upkeep.test"),
            Some(&Entry {
                mode: Mode::Fixed(vec![ip("127.0.0.4"), ip("::1")]),
                ttl: DEFAULT_TTL
            })
        );
        let modes: Vec<&str> = [
            "nx.upkeep.test",
            "empty.upkeep.test",
            "fail.upkeep.test",
            "no.upkeep.test",
            "quiet.upkeep.test",
        ]
        .iter()
        .map(|n| zone.get(n).unwrap().mode.keyword())
        .collect();
        assert_eq!(
            modes,
            ["nxdomain", "nodata", "servfail", "refused", "silent"]
        );
    }

    #[test]
    fn empty_file_is_an_empty_zone() {
        assert_eq!(Zone::from_toml_str("").unwrap(), Zone::new());
    }

    fn err(text: &str) -> ZoneError {
        Zone::from_toml_str(text).expect_err("zone should be rejected")
    }

    #[test]
    fn unknown_mode_is_reported_at_its_position() {
        let e = err("[names.\"a.test\"]\nmode = \"sometimes\"\n");
        assert_eq!((e.line, e.column), (2, 8), "{e}");
        assert!(e.message.contains("sometimes"), "{e}");
    }

    #[test]
    fn bad_address_is_reported_at_its_position() {
        let e = err("[names.\"a.test\"]\nmode = \"fixed\"\naddrs = [\"127.0.0.1\", \"1.2.3\"]\n");
        assert_eq!((e.line, e.column), (3, 23), "{e}");
        assert!(e.message.contains("not an IP address"), "{e}");
    }

    #[test]
    fn fixed_without_addrs_is_rejected() {
        let e = err("[names.\"a.test\"]\nmode = \"fixed\"\n");
        assert_eq!(e.line, 1, "{e}");
        assert!(e.message.contains("need `addrs`"), "{e}");
        let e = err("[names.\"a.test\"]\nmode = \"alternate\"\naddrs = []\n");
        assert_eq!((e.line, e.column), (3, 9), "{e}");
    }

    #[test]
    fn addrs_on_a_negative_mode_is_rejected() {
        let e = err("[names.\"a.test\"]\nmode = \"nxdomain\"\naddrs = [\"127.0.0.1\"]\n");
        assert_eq!(e.line, 3, "{e}");
    }

    #[test]
    fn out_of_range_ttl_is_rejected() {
        let e = err("[names.\"a.test\"]\nmode = \"nodata\"\nttl = -1\n");
        assert_eq!((e.line, e.column), (3, 7), "{e}");
        let e = err("[names.\"a.test\"]\nmode = \"nodata\"\nttl = 4294967296\n");
        assert_eq!(e.line, 3, "{e}");
    }

    #[test]
    fn unknown_key_is_rejected() {
        let e = err("[names.\"a.test\"]\nmode = \"nodata\"\nttl_s = 3\n");
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("ttl_s"), "{e}");
    }

    #[test]
    fn invalid_and_duplicate_names_are_rejected() {
        let e = err("[names.\"bad name.test\"]\nmode = \"nodata\"\n");
        assert_eq!(e.line, 1, "{e}");
        assert!(e.message.contains("invalid name"), "{e}");
        let e =
            err("[names.\"a.test\"]\nmode = \"nodata\"\n[names.\"A.TEST\"]\nmode = \"nodata\"\n");
        assert!(e.message.contains("appears twice"), "{e}");
    }

    #[test]
    fn syntax_error_carries_position_not_panic() {
        let e = err("[names.\"a.test\"\nmode = \"nodata\"\n");
        assert_eq!(e.line, 1, "{e}");
    }

    #[test]
    fn line_column_counts_characters() {
        assert_eq!(line_column("ab\ncé d", 7), (2, 4));
        assert_eq!(line_column("", 0), (1, 1));
    }
}
