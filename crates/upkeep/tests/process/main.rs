//! The real `upkeep` binary as a user runs it: one test binary for every process-level test
//! (one link instead of one per file), with one way to start and stop the process
//! (`support`). The lab scenarios have their own binary (`tests/lab_scenarios.rs`) so that
//! their timing never shares the cores with these tests' load.

mod support;

mod admin;
mod affinity;
mod allocator;
mod endpointslices;
mod head_timeout;
mod hostile;
mod kubernetes;
mod lifecycle;
mod limits;
mod observability;
mod serve;
mod wording;
