//! Helpers for upkeep's tests: loopback backends on port 0 that record what they saw,
//! raw-socket clients, and trace setup.
#![forbid(unsafe_code)]

mod backend;
mod client;

pub use backend::{Seen, TestBackend};
pub use client::{get, get_counting, raw_exchange, send, Reply};

/// Installs a test-friendly tracing subscriber once (RUST_LOG decides the level).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Resident set size of this process in bytes (Linux).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// A loopback port that was free a moment ago (for processes that need an address up front).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}
