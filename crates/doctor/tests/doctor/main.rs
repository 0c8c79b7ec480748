//! The doctor's integration tests: one test binary (one link instead of one per file), each
//! former `tests/<name>.rs` a module here. A new test file goes in this directory as
//! `<name>.rs` with a `mod <name>;` line below (alphabetical); fixtures stay in
//! `tests/fixtures`, found through `CARGO_MANIFEST_DIR`.

mod k8s;
mod keepalive;
mod logs;
mod nginx;
mod output;
