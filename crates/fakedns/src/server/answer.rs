//! Which reply a query gets, from the name's entry and the query type.

use std::net::IpAddr;

use crate::zone::{Entry, Mode, DEFAULT_TTL};

/// The record family a query asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    V4,
    V6,
    /// Any type other than A and AAAA: known names answer it with NODATA.
    Other,
}

/// What goes on the wire for one query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// NOERROR with these address records (never empty).
    Addrs(Vec<IpAddr>),
    /// NOERROR, no answer, SOA in authority.
    NoData,
    /// NXDOMAIN, SOA in authority.
    NxDomain,
    ServFail,
    Refused,
    /// Nothing is sent.
    Silent,
}

impl Reply {
    /// The text kept in the query log.
    pub(crate) fn describe(&self) -> String {
        match self {
            Reply::Addrs(addrs) => addrs
                .iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(","),
            Reply::NoData => "NODATA".to_owned(),
            Reply::NxDomain => "NXDOMAIN".to_owned(),
            Reply::ServFail => "SERVFAIL".to_owned(),
            Reply::Refused => "REFUSED".to_owned(),
            Reply::Silent => "(silent)".to_owned(),
        }
    }
}

/// One name's entry plus its rotation position per family.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    pub(crate) entry: Entry,
    /// Counted per family so that a resolver asking A and AAAA in turn still sees
    /// every IPv4 address in rotation.
    next: [usize; 2],
}

impl Slot {
    pub(crate) fn new(entry: Entry) -> Self {
        Slot {
            entry,
            next: [0, 0],
        }
    }

    /// The reply to the next query of `family` for this name, and its TTL; advances
    /// the rotation of alternate mode.
    pub(crate) fn answer(&mut self, family: Family) -> (Reply, u32) {
        let ttl = self.entry.ttl;
        let reply = match &self.entry.mode {
            Mode::NxDomain => Reply::NxDomain,
            Mode::NoData => Reply::NoData,
            Mode::ServFail => Reply::ServFail,
            Mode::Refused => Reply::Refused,
            Mode::Silent => Reply::Silent,
            Mode::Fixed(addrs) => {
                let picked: Vec<IpAddr> = of_family(addrs, family).collect();
                if picked.is_empty() {
                    Reply::NoData
                } else {
                    Reply::Addrs(picked)
                }
            }
            Mode::Alternate(addrs) => {
                let picked: Vec<IpAddr> = of_family(addrs, family).collect();
                let counter = match family {
                    Family::V4 => &mut self.next[0],
                    Family::V6 => &mut self.next[1],
                    Family::Other => return (Reply::NoData, ttl),
                };
                if picked.is_empty() {
                    Reply::NoData
                } else {
                    let one = picked[*counter % picked.len()];
                    *counter = counter.wrapping_add(1);
                    Reply::Addrs(vec![one])
                }
            }
        };
        (reply, ttl)
    }
}

/// The reply for a name that is not in the zone.
pub(crate) fn unknown_name() -> (Reply, u32) {
    (Reply::NxDomain, DEFAULT_TTL)
}

fn of_family(addrs: &[IpAddr], family: Family) -> impl Iterator<Item = IpAddr> + '_ {
    addrs.iter().copied().filter(move |a| match family {
        Family::V4 => a.is_ipv4(),
        Family::V6 => a.is_ipv6(),
        Family::Other => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn slot(mode: Mode) -> Slot {
        Slot::new(Entry { mode, ttl: 3 })
    }

    #[test]
    fn alternate_rotates_one_address_per_query() {
        let mut s = slot(Mode::Alternate(vec![ip("127.0.0.2"), ip("127.0.0.3")]));
        let got: Vec<Reply> = (0..4).map(|_| s.answer(Family::V4).0).collect();
        assert_eq!(
            got,
            vec![
                Reply::Addrs(vec![ip("127.0.0.2")]),
                Reply::Addrs(vec![ip("127.0.0.3")]),
                Reply::Addrs(vec![ip("127.0.0.2")]),
                Reply::Addrs(vec![ip("127.0.0.3")]),
            ]
        );
    }

    #[test]
    fn alternate_rotation_is_per_family() {
        let mut s = slot(Mode::Alternate(vec![
            ip("127.0.0.2"),
            ip("127.0.0.3"),
            ip("::2"),
        ]));
        // Interleaved AAAA queries must not skip IPv4 addresses.
        assert_eq!(s.answer(Family::V4).0, Reply::Addrs(vec![ip("127.0.0.2")]));
        assert_eq!(s.answer(Family::V6).0, Reply::Addrs(vec![ip("::2")]));
        assert_eq!(s.answer(Family::V4).0, Reply::Addrs(vec![ip("127.0.0.3")]));
        assert_eq!(s.answer(Family::V6).0, Reply::Addrs(vec![ip("::2")]));
    }

    #[test]
    fn fixed_answers_all_addresses_of_the_family() {
        let mut s = slot(Mode::Fixed(vec![
            ip("127.0.0.2"),
            ip("::1"),
            ip("127.0.0.3"),
        ]));
        assert_eq!(
            s.answer(Family::V4),
            (Reply::Addrs(vec![ip("127.0.0.2"), ip("127.0.0.3")]), 3)
        );
        assert_eq!(s.answer(Family::V6).0, Reply::Addrs(vec![ip("::1")]));
    }

    #[test]
    fn missing_family_and_other_types_are_nodata() {
        let mut s = slot(Mode::Fixed(vec![ip("127.0.0.2")]));
        assert_eq!(s.answer(Family::V6).0, Reply::NoData);
        assert_eq!(s.answer(Family::Other).0, Reply::NoData);
        let mut s = slot(Mode::Alternate(vec![ip("127.0.0.2")]));
        assert_eq!(s.answer(Family::V6).0, Reply::NoData);
        assert_eq!(s.answer(Family::Other).0, Reply::NoData);
    }

    #[test]
    fn negative_modes_apply_to_every_type() {
        for (mode, reply) in [
            (Mode::NxDomain, Reply::NxDomain),
            (Mode::NoData, Reply::NoData),
            (Mode::ServFail, Reply::ServFail),
            (Mode::Refused, Reply::Refused),
            (Mode::Silent, Reply::Silent),
        ] {
            let mut s = slot(mode);
            for family in [Family::V4, Family::V6, Family::Other] {
                assert_eq!(s.answer(family).0, reply);
            }
        }
    }

    #[test]
    fn describe_names_the_answer() {
        assert_eq!(
            Reply::Addrs(vec![ip("127.0.0.2"), ip("::1")]).describe(),
            "127.0.0.2,::1"
        );
        assert_eq!(Reply::NxDomain.describe(), "NXDOMAIN");
        assert_eq!(Reply::NoData.describe(), "NODATA");
        assert_eq!(Reply::ServFail.describe(), "SERVFAIL");
        assert_eq!(Reply::Refused.describe(), "REFUSED");
        assert_eq!(Reply::Silent.describe(), "(silent)");
    }
}
