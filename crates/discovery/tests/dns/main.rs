//! The resolver and the discovery policy against a fake DNS on loopback: one test binary (one
//! link instead of one per file), each former `tests/<name>.rs` a module here, the fixture in
//! `tests/support/fixture.rs`. A new test file goes in this directory as `<name>.rs` with a
//! `mod <name>;` line below (alphabetical). `tests/change_log.rs` keeps a binary of its own:
//! it installs the process-wide tracing subscriber.

#[path = "../support/fixture.rs"]
mod support;

mod lookup;
mod policy;
