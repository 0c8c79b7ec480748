//! DNS discovery for upstream names: hickory lookups with its cache off, and the policy
//! that decides when to ask again and which addresses to keep.
//!
//! A failed lookup (SERVFAIL, REFUSED, timeout) never changes addresses; a negative answer
//! (NXDOMAIN, NODATA) keeps the last known good addresses for a grace period; only
//! records replace them, in one swap, and records of one family while the other family's
//! lookup failed replace only that family's addresses. See `docs/discovery.md`.
#![forbid(unsafe_code)]

mod outcome;
mod policy;
mod resolver;
mod watch;

pub use outcome::{Family, Outcome};
pub use policy::{Policy, StaleGrace, MAX_ERROR_BACKOFF};
pub use resolver::{Error, Lookup, Resolver};
pub use watch::{
    watch_name, watch_name_from, watch_name_with, AssumeHealthy, NameState, NoObserver, Observer,
    StaleCheck,
};
