//! The result of one lookup, with "the name does not exist" kept apart from "the lookup failed".

use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::lookup::Lookup;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::RData;

/// An address family, as asked with A or AAAA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// A records.
    V4,
    /// AAAA records.
    V6,
}

impl Family {
    /// Whether `ip` is of this family.
    pub fn has(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_))
        )
    }
}

/// What one lookup of a name (A and AAAA together) said.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Addresses were found (never empty); `ttl` is the smallest record TTL.
    Records {
        /// IPv4 addresses first, then IPv6, without duplicates.
        addrs: Vec<IpAddr>,
        /// Smallest TTL among the answer records.
        ttl: Duration,
    },
    /// One family's lookup gave addresses (never empty) while the other's failed (timeout,
    /// SERVFAIL, ...): the failed family is unknown, not empty, so the addresses last known
    /// for it are kept.
    Partial {
        /// The addresses found, all of the family that answered.
        addrs: Vec<IpAddr>,
        /// Smallest TTL among the answer records.
        ttl: Duration,
        /// The family whose lookup failed.
        unknown: Family,
    },
    /// The name does not exist (authoritative NXDOMAIN).
    NxDomain,
    /// The name exists but has no A or AAAA record (NOERROR, empty answer).
    NoData,
    /// The server failed (SERVFAIL): nothing is known about the name.
    ServFail,
    /// The server refused to answer (REFUSED): nothing is known about the name.
    Refused,
    /// No answer within the timeout.
    Timeout,
    /// Any other failure (network error, malformed answer, other response code).
    Error(String),
}

impl Outcome {
    /// Metric label value: `records`, `partial`, `nxdomain`, `nodata`, `servfail`,
    /// `refused`, `timeout` or `error`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Records { .. } => "records",
            Outcome::Partial { .. } => "partial",
            Outcome::NxDomain => "nxdomain",
            Outcome::NoData => "nodata",
            Outcome::ServFail => "servfail",
            Outcome::Refused => "refused",
            Outcome::Timeout => "timeout",
            Outcome::Error(_) => "error",
        }
    }

    /// The DNS response code, where one was received.
    pub fn rcode(&self) -> Option<&'static str> {
        match self {
            Outcome::Records { .. } | Outcome::Partial { .. } | Outcome::NoData => Some("NOERROR"),
            Outcome::NxDomain => Some("NXDOMAIN"),
            Outcome::ServFail => Some("SERVFAIL"),
            Outcome::Refused => Some("REFUSED"),
            Outcome::Timeout | Outcome::Error(_) => None,
        }
    }

    /// An authoritative "no addresses" answer (NXDOMAIN or NODATA).
    pub fn is_negative(&self) -> bool {
        matches!(self, Outcome::NxDomain | Outcome::NoData)
    }

    /// The lookup told nothing about the name (SERVFAIL, REFUSED, timeout, error).
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            Outcome::ServFail | Outcome::Refused | Outcome::Timeout | Outcome::Error(_)
        )
    }

    /// Classifies the result of one hickory lookup of a single record type.
    pub(crate) fn from_lookup(result: Result<Lookup, NetError>) -> Outcome {
        match result {
            Ok(lookup) => {
                let mut addrs = Vec::new();
                let mut ttl: Option<u32> = None;
                for record in lookup.answers() {
                    let ip = match &record.data {
                        RData::A(a) => IpAddr::V4(a.0),
                        RData::AAAA(a) => IpAddr::V6(a.0),
                        // CNAME chains arrive as extra answers; only addresses count.
                        _ => continue,
                    };
                    if !addrs.contains(&ip) {
                        addrs.push(ip);
                    }
                    ttl = Some(ttl.map_or(record.ttl, |t| t.min(record.ttl)));
                }
                match ttl {
                    Some(ttl) if !addrs.is_empty() => Outcome::Records {
                        addrs,
                        ttl: Duration::from_secs(u64::from(ttl)),
                    },
                    _ => Outcome::NoData,
                }
            }
            Err(error) => Outcome::from_error(&error),
        }
    }

    /// Maps a hickory error to an outcome: NXDOMAIN and NODATA arrive as `NoRecordsFound`
    /// (told apart by their response code), other codes as `ResponseCode`.
    pub(crate) fn from_error(error: &NetError) -> Outcome {
        match error {
            NetError::Dns(DnsError::NoRecordsFound(none)) => match none.response_code {
                ResponseCode::NXDomain => Outcome::NxDomain,
                ResponseCode::NoError => Outcome::NoData,
                other => Outcome::Error(format!("no records, response code {other}")),
            },
            NetError::Dns(DnsError::ResponseCode(ResponseCode::ServFail)) => Outcome::ServFail,
            NetError::Dns(DnsError::ResponseCode(ResponseCode::Refused)) => Outcome::Refused,
            NetError::Timeout => Outcome::Timeout,
            NetError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => Outcome::Timeout,
            other => Outcome::Error(other.to_string()),
        }
    }

    /// Combines the A and AAAA outcomes of one name into one.
    ///
    /// Records from either family win, so a server that mishandles AAAA cannot hide working
    /// IPv4 addresses; when the other family's lookup failed (rather than answered "none"),
    /// the result is `Partial`, so the addresses known for that family are kept rather than
    /// dropped on half the evidence. Without records, a failure on either side wins over a
    /// negative answer, for the same reason. Two negative answers give NXDOMAIN if either
    /// said so.
    pub(crate) fn combine(v4: Outcome, v6: Outcome) -> Outcome {
        match (v4, v6) {
            (
                Outcome::Records { addrs, ttl },
                Outcome::Records {
                    addrs: more,
                    ttl: ttl6,
                },
            ) => {
                let mut addrs = addrs;
                for ip in more {
                    if !addrs.contains(&ip) {
                        addrs.push(ip);
                    }
                }
                Outcome::Records {
                    addrs,
                    ttl: ttl.min(ttl6),
                }
            }
            (Outcome::Records { addrs, ttl }, failure) if failure.is_failure() => {
                Outcome::Partial {
                    addrs,
                    ttl,
                    unknown: Family::V6,
                }
            }
            (failure, Outcome::Records { addrs, ttl }) if failure.is_failure() => {
                Outcome::Partial {
                    addrs,
                    ttl,
                    unknown: Family::V4,
                }
            }
            (records @ Outcome::Records { .. }, _) | (_, records @ Outcome::Records { .. }) => {
                records
            }
            (failure, _) if failure.is_failure() => failure,
            (_, failure) if failure.is_failure() => failure,
            (Outcome::NxDomain, _) | (_, Outcome::NxDomain) => Outcome::NxDomain,
            _ => Outcome::NoData,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::net::NoRecords;
    use hickory_resolver::proto::op::Query;

    fn no_records(code: ResponseCode) -> NetError {
        NetError::Dns(DnsError::NoRecordsFound(NoRecords::new(Query::new(), code)))
    }

    fn records(ips: &[&str], ttl: u64) -> Outcome {
        Outcome::Records {
            addrs: ips.iter().map(|s| s.parse().unwrap()).collect(),
            ttl: Duration::from_secs(ttl),
        }
    }

    #[test]
    fn nxdomain_and_nodata_are_told_apart_by_response_code() {
        assert_eq!(
            Outcome::from_error(&no_records(ResponseCode::NXDomain)),
            Outcome::NxDomain
        );
        assert_eq!(
            Outcome::from_error(&no_records(ResponseCode::NoError)),
            Outcome::NoData
        );
    }

    #[test]
    fn servfail_refused_and_timeout_are_failures() {
        let code = |c| NetError::Dns(DnsError::ResponseCode(c));
        assert_eq!(
            Outcome::from_error(&code(ResponseCode::ServFail)),
            Outcome::ServFail
        );
        assert_eq!(
            Outcome::from_error(&code(ResponseCode::Refused)),
            Outcome::Refused
        );
        assert_eq!(Outcome::from_error(&NetError::Timeout), Outcome::Timeout);
        let io = NetError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(Outcome::from_error(&io), Outcome::Timeout);
        let other = Outcome::from_error(&code(ResponseCode::FormErr));
        assert!(matches!(other, Outcome::Error(_)), "{other:?}");
        let refused_conn =
            NetError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(
            Outcome::from_error(&refused_conn),
            Outcome::Error(_)
        ));
        for o in [
            Outcome::ServFail,
            Outcome::Refused,
            Outcome::Timeout,
            Outcome::Error("x".into()),
        ] {
            assert!(o.is_failure() && !o.is_negative(), "{o:?}");
        }
        assert!(Outcome::NxDomain.is_negative() && Outcome::NoData.is_negative());
    }

    #[test]
    fn labels_and_rcodes() {
        let table = [
            (records(&["127.0.0.2"], 1), "records", Some("NOERROR")),
            (Outcome::NxDomain, "nxdomain", Some("NXDOMAIN")),
            (Outcome::NoData, "nodata", Some("NOERROR")),
            (Outcome::ServFail, "servfail", Some("SERVFAIL")),
            (Outcome::Refused, "refused", Some("REFUSED")),
            (Outcome::Timeout, "timeout", None),
            (Outcome::Error("boom".into()), "error", None),
        ];
        for (outcome, label, rcode) in table {
            assert_eq!(outcome.label(), label);
            assert_eq!(outcome.rcode(), rcode);
        }
    }

    #[test]
    fn combine_merges_families_and_takes_smallest_ttl() {
        assert_eq!(
            Outcome::combine(records(&["127.0.0.2"], 5), records(&["::2"], 3)),
            records(&["127.0.0.2", "::2"], 3)
        );
    }

    #[test]
    fn combine_records_win_over_a_negative_answer() {
        let r = records(&["127.0.0.2"], 5);
        for other in [Outcome::NoData, Outcome::NxDomain] {
            assert_eq!(Outcome::combine(r.clone(), other.clone()), r);
            assert_eq!(Outcome::combine(other, r.clone()), r);
        }
    }

    #[test]
    fn combine_records_with_a_failed_family_is_partial_naming_that_family() {
        let v4 = records(&["127.0.0.2"], 5);
        let v6 = records(&["::2"], 5);
        for failure in [Outcome::ServFail, Outcome::Timeout, Outcome::Refused] {
            assert_eq!(
                Outcome::combine(v4.clone(), failure.clone()),
                Outcome::Partial {
                    addrs: vec!["127.0.0.2".parse().unwrap()],
                    ttl: Duration::from_secs(5),
                    unknown: Family::V6
                }
            );
            assert_eq!(
                Outcome::combine(failure, v6.clone()),
                Outcome::Partial {
                    addrs: vec!["::2".parse().unwrap()],
                    ttl: Duration::from_secs(5),
                    unknown: Family::V4
                }
            );
        }
    }

    #[test]
    fn combine_failure_wins_over_negative_answer() {
        assert_eq!(
            Outcome::combine(Outcome::NxDomain, Outcome::ServFail),
            Outcome::ServFail
        );
        assert_eq!(
            Outcome::combine(Outcome::Timeout, Outcome::NoData),
            Outcome::Timeout
        );
    }

    #[test]
    fn combine_negative_answers() {
        assert_eq!(
            Outcome::combine(Outcome::NoData, Outcome::NoData),
            Outcome::NoData
        );
        assert_eq!(
            Outcome::combine(Outcome::NoData, Outcome::NxDomain),
            Outcome::NxDomain
        );
        assert_eq!(
            Outcome::combine(Outcome::NxDomain, Outcome::NxDomain),
            Outcome::NxDomain
        );
    }
}
