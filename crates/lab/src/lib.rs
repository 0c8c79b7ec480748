//! The fault lab: fake DNS, fault backends, open-loop load, scenarios and reports.
#![forbid(unsafe_code)]

pub mod backend;
pub mod catalog;
pub mod classify;
pub mod cli;
pub mod control;
pub mod dns;
pub mod duration;
pub mod kube;
pub mod load;
pub mod report;
pub mod scenario;
pub mod target;
pub mod timeline;
