//! The doctor: finds the traps behind transient 5xx (docs/incidents.md) in nginx configs, error
//! logs, Kubernetes manifests and live servers.
#![forbid(unsafe_code)]

pub mod cli;
pub mod finding;
mod http;
pub mod k8s;
pub mod keepalive;
pub mod logs;
pub mod nginx;
