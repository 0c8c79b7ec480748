//! Optional active HTTP checks: GET a path on every peer at an interval, with rise/fall
//! thresholds. A success brings an ejected peer back at once.

use std::sync::Arc;

use http_body_util::Empty;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::{Group, Peer};
use crate::config::ActiveCheck;

/// Starts active checks for `group` if configured.
pub fn start(group: &Arc<Group>) {
    let Some(check) = group.config().health.active.clone() else {
        return;
    };
    let weak = Arc::downgrade(group);
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(check.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(g) = weak.upgrade() else { return };
            let peers: Vec<Arc<Peer>> = g.peers().all().cloned().collect();
            drop(g);
            let checks = peers.into_iter().map(|p| {
                let check = check.clone();
                async move {
                    let ok = probe(&p, &check).await;
                    p.record_check(ok, check.rise, check.fall);
                }
            });
            futures_util::future::join_all(checks).await;
        }
    });
    group.tasks.lock().unwrap().push(task.abort_handle());
}

async fn probe(peer: &Peer, check: &ActiveCheck) -> bool {
    let run = async {
        let stream = TcpStream::connect(peer.addr()).await.ok()?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
        tokio::spawn(conn);
        let req = http::Request::get(check.path.as_str())
            .header(http::header::HOST, peer.addr().to_string())
            .header("user-agent", "upkeep-health-check")
            .body(Empty::<bytes::Bytes>::new())
            .ok()?;
        let resp = sender.send_request(req).await.ok()?;
        Some(resp.status().is_success() || resp.status().is_redirection())
    };
    matches!(
        tokio::time::timeout(check.timeout, run).await,
        Ok(Some(true))
    )
}
