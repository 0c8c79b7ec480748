//! An authoritative fake DNS server for tests and the lab: per name a mode (fixed,
//! alternate, NXDOMAIN, NODATA, SERVFAIL, REFUSED, silent), switchable at run time, on UDP
//! and TCP on one port, with every query logged.
//!
//! Names that are not in the zone are answered NXDOMAIN, whatever their suffix: the server
//! claims authority for every name, so a misspelt name fails the same way as in a real zone.
#![forbid(unsafe_code)]

mod server;
mod zone;

pub use server::{FakeDns, QueryRecord, Transport};
pub use zone::{Entry, Mode, ModeParseError, Zone, ZoneError, DEFAULT_TTL};
