//! EndpointSlice discovery: list and watch one Service's EndpointSlices through the API
//! server (kube-rs), and keep the last known good peers the way DNS discovery does. Ready
//! endpoints are peers; serving and terminating ones drain; an unreachable, slow or failing
//! API server never changes the peers; an empty set empties them only after `stale_grace`.
//! See `docs/discovery.md`.
#![forbid(unsafe_code)]

mod slices;
mod tracker;
mod watch;

pub use slices::{endpoints, split, Endpoint, PortSel, ServiceRef, Split};
pub use tracker::{NoObserver, Observer, ServiceState, StaleCheck};
pub use watch::{watch_service, ApiSettings, SERVICE_ACCOUNT_DIR};
