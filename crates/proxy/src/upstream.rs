//! Upstream groups: peers, health, balancing, discovery.

pub mod active;
pub mod down;
pub mod group;
pub mod kubernetes;
pub mod names;
pub mod peer;

pub use group::{Group, PeerSet, RequestGuard, RetryPermit};
pub use peer::{FailureEffect, Peer, PeerView};

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::StaleGrace;

/// The group's discovery settings as the last-known-good policy both DNS names and
/// EndpointSlices follow.
fn discovery_policy(group: &Group) -> upkeep_discovery::Policy {
    let d = &group.config().discovery;
    upkeep_discovery::Policy {
        min_refresh: d.min_refresh,
        max_refresh: d.max_refresh,
        stale_grace: match d.stale_grace {
            StaleGrace::WhileHealthy => upkeep_discovery::StaleGrace::WhileHealthy,
            StaleGrace::For(t) => upkeep_discovery::StaleGrace::For(t),
        },
        error_backoff: d.error_backoff,
    }
}

/// Applies every state a discovery loop publishes to `group` while the group lives; the loop
/// and its follower end with the group (a reload's replacement carries the state over).
fn follow<S: Clone + Send + Sync + 'static>(
    group: &Arc<Group>,
    loop_task: JoinHandle<()>,
    mut rx: watch::Receiver<S>,
    mut apply: impl FnMut(&Group, S) + Send + 'static,
) {
    let weak = Arc::downgrade(group);
    let follower = tokio::spawn(async move {
        loop {
            let state = rx.borrow_and_update().clone();
            match weak.upgrade() {
                Some(g) => apply(&g, state),
                None => return,
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
    let mut tasks = group.tasks.lock().unwrap();
    tasks.push(loop_task.abort_handle());
    tasks.push(follower.abort_handle());
}
