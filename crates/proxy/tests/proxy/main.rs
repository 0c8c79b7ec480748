//! The proxy's integration tests: one test binary (one link instead of one per file), each
//! former `tests/<name>.rs` a module here, with the shared helpers in `tests/support/`.
//!
//! A new test file goes in this directory as `<name>.rs` and gets a `mod <name>;` line below
//! (alphabetical); it reaches the helpers through `crate::support`. Data the tests read stays
//! where it was (`tests/expect`, `tests/py`, `tests/upgrade`), found through
//! `CARGO_MANIFEST_DIR`. A test that measures the whole process (its RSS, for one) cannot
//! share it with other tests and keeps a binary of its own, as `tests/streaming.rs` does.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod config_fuzz_corpus;
mod core;
mod differential;
mod ejection;
mod expect;
mod fuzz_corpus;
mod grpc;
mod h1_server;
mod h2_refused;
mod h2_tls;
mod h2_upstream;
mod hostile;
mod https_upstream;
mod limits;
mod metrics;
mod normalise;
mod pool_sizing;
mod probes;
mod reload;
mod resilience;
mod response_framing;
mod route_rules;
mod smuggling;
mod timeouts;
mod tls_sessions;
mod upgrade;
mod upgrade_h2;
mod worker_balance;
