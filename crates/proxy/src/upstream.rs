//! Upstream groups: peers, health, balancing, discovery.

pub mod active;
pub mod down;
pub mod group;
pub mod kubernetes;
pub mod names;
pub mod peer;

pub use group::{Group, PeerSet, RequestGuard, RetryPermit};
pub use peer::{FailureEffect, Peer, PeerView};
