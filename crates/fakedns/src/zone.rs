//! What the fake server answers for each name: a mode and a TTL.

mod file;

use std::collections::BTreeMap;
use std::net::IpAddr;

pub use file::ZoneError;

/// TTL given to names whose zone entry does not state one.
pub const DEFAULT_TTL: u32 = 5;

/// How the server answers queries for one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every answer carries all the addresses of the queried family.
    Fixed(Vec<IpAddr>),
    /// Every answer carries ONE address of the queried family, rotating per query (a GSLB).
    Alternate(Vec<IpAddr>),
    /// NXDOMAIN with an SOA in the authority section.
    NxDomain,
    /// NOERROR with an empty answer and an SOA in the authority section.
    NoData,
    /// SERVFAIL.
    ServFail,
    /// REFUSED.
    Refused,
    /// No answer at all: UDP queries are dropped, TCP connections stay open and unanswered.
    Silent,
}

impl Mode {
    /// Every mode's spelling, in the order of the enum.
    pub const KEYWORDS: [&'static str; 7] = [
        "fixed",
        "alternate",
        "nxdomain",
        "nodata",
        "servfail",
        "refused",
        "silent",
    ];

    /// The mode spelled `keyword` (any case) answering with `addrs` (used by `fixed` and
    /// `alternate` only); `None` for an unknown keyword.
    pub fn from_keyword(keyword: &str, addrs: Vec<IpAddr>) -> Option<Mode> {
        Some(match keyword.to_ascii_lowercase().as_str() {
            "fixed" => Mode::Fixed(addrs),
            "alternate" => Mode::Alternate(addrs),
            "nxdomain" => Mode::NxDomain,
            "nodata" => Mode::NoData,
            "servfail" => Mode::ServFail,
            "refused" => Mode::Refused,
            "silent" => Mode::Silent,
            _ => return None,
        })
    }

    /// The zone-file spelling of this mode (`fixed`, `alternate`, `nxdomain`, ...).
    pub fn keyword(&self) -> &'static str {
        match self {
            Mode::Fixed(_) => "fixed",
            Mode::Alternate(_) => "alternate",
            Mode::NxDomain => "nxdomain",
            Mode::NoData => "nodata",
            Mode::ServFail => "servfail",
            Mode::Refused => "refused",
            Mode::Silent => "silent",
        }
    }

    /// The addresses this mode answers with (empty for the modes without records).
    pub fn addrs(&self) -> &[IpAddr] {
        match self {
            Mode::Fixed(addrs) | Mode::Alternate(addrs) => addrs,
            _ => &[],
        }
    }
}

/// Why a mode spelled as text (`nxdomain`, `fixed:127.0.0.2,127.0.0.3`) was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeParseError {
    /// The keyword is not one of the seven modes.
    #[error("unknown mode {0:?}; expected fixed, alternate, nxdomain, nodata, servfail, refused or silent")]
    UnknownMode(String),
    /// An address in the list does not parse.
    #[error("{0:?} is not an IP address")]
    BadAddress(String),
    /// `fixed` or `alternate` without addresses.
    #[error("mode {0} needs addresses, e.g. {0}:127.0.0.2,127.0.0.3")]
    MissingAddresses(&'static str),
    /// Addresses given to a mode that does not answer with records.
    #[error("mode {0} takes no addresses")]
    UnexpectedAddresses(&'static str),
}

impl std::str::FromStr for Mode {
    type Err = ModeParseError;

    /// Parses `keyword` or `keyword:addr,addr` (the form used on control interfaces).
    fn from_str(text: &str) -> Result<Mode, ModeParseError> {
        let (keyword, list) = match text.trim().split_once(':') {
            // An IPv6 address holds colons too: only the first one separates.
            Some((k, rest)) => (k.trim(), Some(rest)),
            None => (text.trim(), None),
        };
        let addrs = match list {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(|a| {
                    a.parse::<IpAddr>()
                        .map_err(|_| ModeParseError::BadAddress(a.to_owned()))
                })
                .collect::<Result<_, _>>()?,
        };
        let mode = Mode::from_keyword(keyword, addrs)
            .ok_or_else(|| ModeParseError::UnknownMode(keyword.to_owned()))?;
        match &mode {
            Mode::Fixed(a) | Mode::Alternate(a) if a.is_empty() => {
                Err(ModeParseError::MissingAddresses(mode.keyword()))
            }
            Mode::Fixed(_) | Mode::Alternate(_) => Ok(mode),
            _ if list.is_some_and(|l| !l.trim().is_empty()) => {
                Err(ModeParseError::UnexpectedAddresses(mode.keyword()))
            }
            _ => Ok(mode),
        }
    }
}

impl std::fmt::Display for Mode {
    /// The form [`str::parse`] reads back: `keyword` or `keyword:addr,addr`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.keyword())?;
        let addrs = self.addrs();
        if !addrs.is_empty() {
            let list: Vec<String> = addrs.iter().map(IpAddr::to_string).collect();
            write!(f, ":{}", list.join(","))?;
        }
        Ok(())
    }
}

/// One name's answer: its mode and the TTL put on records and on the SOA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// How queries for the name are answered.
    pub mode: Mode,
    /// TTL in seconds of the answer records (and the SOA's negative-caching TTL).
    pub ttl: u32,
}

/// The set of names the fake server knows; every other name gets NXDOMAIN.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Zone {
    entries: BTreeMap<String, Entry>,
}

impl Zone {
    /// An empty zone: every name is NXDOMAIN.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) `name` with the given mode and TTL.
    pub fn with(mut self, name: &str, mode: Mode, ttl: u32) -> Self {
        self.insert(name, mode, ttl);
        self
    }

    /// Adds (or replaces) `name` with the given mode and TTL.
    pub fn insert(&mut self, name: &str, mode: Mode, ttl: u32) {
        self.entries.insert(normalize(name), Entry { mode, ttl });
    }

    /// Reads a zone file (TOML); errors carry the line and column of the problem.
    pub fn from_toml_str(text: &str) -> Result<Zone, ZoneError> {
        file::parse(text)
    }

    /// The entry for `name` (any case, with or without a trailing dot).
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(&normalize(name))
    }

    /// The names in the zone, lower case, without trailing dot, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub(crate) fn into_entries(self) -> BTreeMap<String, Entry> {
        self.entries
    }
}

/// The key a name is stored under: lower case, no trailing dot, since DNS names are
/// case-insensitive and the root label is implied.
pub(crate) fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_case_insensitive_and_ignore_trailing_dot() {
        let zone = Zone::new().with("App.Upkeep.TEST.", Mode::NoData, 7);
        assert_eq!(zone.get("app.upkeep.test").map(|e| e.ttl), Some(7));
        assert_eq!(zone.get("APP.upkeep.test.").map(|e| e.ttl), Some(7));
        assert!(zone.get("other.upkeep.test").is_none());
        assert_eq!(zone.names().collect::<Vec<_>>(), vec!["app.upkeep.test"]);
    }

    #[test]
    fn mode_text_round_trips() {
        for text in [
            "fixed:127.0.0.2,::1",
            "alternate:127.0.0.2,127.0.0.3",
            "nxdomain",
            "nodata",
            "servfail",
            "refused",
            "silent",
        ] {
            let mode: Mode = text.parse().unwrap();
            assert_eq!(mode.to_string(), text);
        }
        assert_eq!(
            " NXDOMAIN ".parse::<Mode>(),
            Ok(Mode::NxDomain),
            "case and spaces do not matter"
        );
    }

    #[test]
    fn bad_mode_text_is_rejected() {
        assert!(matches!(
            "sometimes".parse::<Mode>(),
            Err(ModeParseError::UnknownMode(_))
        ));
        assert!(matches!(
            "fixed".parse::<Mode>(),
            Err(ModeParseError::MissingAddresses("fixed"))
        ));
        assert!(matches!(
            "alternate:1.2.3".parse::<Mode>(),
            Err(ModeParseError::BadAddress(_))
        ));
        assert!(matches!(
            "nxdomain:127.0.0.1".parse::<Mode>(),
            Err(ModeParseError::UnexpectedAddresses("nxdomain"))
        ));
    }

    #[test]
    fn with_replaces_an_existing_name() {
        let zone = Zone::new()
            .with("a.test", Mode::NxDomain, 1)
            .with("A.test", Mode::ServFail, 2);
        assert_eq!(
            zone.get("a.test"),
            Some(&Entry {
                mode: Mode::ServFail,
                ttl: 2
            })
        );
    }
}
