//! `max_connections` per listener: open connections are counted by a guard, and a connection
//! over the limit is answered cheaply and closed: `503 overloaded` on HTTP/1, a GOAWAY on
//! HTTP/2, so the client learns why instead of meeting a reset.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::H2_PREFACE;
use crate::config::ListenerConfig;
use crate::state::Shared;

/// Refusals answered at once; past this, an over-limit connection is closed unanswered so a
/// flood cannot hold descriptors through its answers.
const MAX_REFUSING: usize = 64;
/// Longest time spent answering one refused connection.
const REFUSE_WITHIN: Duration = Duration::from_secs(1);

/// Open connections of one listener, shared by every worker's copy of it.
#[derive(Default)]
pub struct ConnLimit {
    open: AtomicUsize,
    refusing: AtomicUsize,
}

/// One open connection, counted until dropped.
pub struct ConnSlot(Arc<ConnLimit>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One refusal being answered, counted until dropped.
pub struct RefuseSlot(Arc<ConnLimit>);

impl Drop for RefuseSlot {
    fn drop(&mut self) {
        self.0.refusing.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnLimit {
    /// The counter of the listener bound at `addr` (every worker's copy shares it).
    pub fn of(addr: SocketAddr) -> Arc<ConnLimit> {
        static LIMITS: OnceLock<Mutex<HashMap<SocketAddr, Weak<ConnLimit>>>> = OnceLock::new();
        let mut map = LIMITS.get_or_init(Default::default).lock().unwrap();
        if let Some(l) = map.get(&addr).and_then(Weak::upgrade) {
            return l;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let l = Arc::new(ConnLimit::default());
        map.insert(addr, Arc::downgrade(&l));
        l
    }

    /// A slot for a new connection, or `None` when `max` are open.
    pub fn try_open(self: &Arc<Self>, max: usize) -> Option<ConnSlot> {
        let mut cur = self.open.load(Ordering::Relaxed);
        loop {
            if cur >= max {
                return None;
            }
            match self.open.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(ConnSlot(self.clone())),
                Err(now) => cur = now,
            }
        }
    }

    /// A slot for answering a refusal, or `None` when enough are being answered.
    pub fn try_refuse(self: &Arc<Self>) -> Option<RefuseSlot> {
        if self.refusing.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSING {
            self.refusing.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(RefuseSlot(self.clone()))
    }
}

/// The HTTP/1 answer to a connection over the limit.
const OVERLOADED_H1: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nupkeep-error: overloaded\r\ncontent-type: text/plain; charset=utf-8\r\ncache-control: no-store\r\ncontent-length: 19\r\nconnection: close\r\n\r\nupkeep: overloaded\n";

/// The HTTP/2 answer: the server preface (empty SETTINGS), then GOAWAY with last stream 0
/// and REFUSED_STREAM, so the client knows no request was processed and may retry elsewhere.
fn overloaded_h2() -> Vec<u8> {
    let debug = b"overloaded";
    let mut out = vec![0, 0, 0, 0x4, 0, 0, 0, 0, 0];
    let len = 8 + debug.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, 0x7, 0]);
    out.extend_from_slice(&[0, 0, 0, 0]); // stream 0
    out.extend_from_slice(&[0, 0, 0, 0]); // last stream id
    out.extend_from_slice(&[0, 0, 0, 0x7]); // REFUSED_STREAM
    out.extend_from_slice(debug);
    out
}

/// Answers a connection over the limit and closes it; bounded by `REFUSE_WITHIN`.
pub async fn refuse(
    stream: TcpStream,
    cfg: Arc<ListenerConfig>,
    shared: Arc<Shared>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    _slot: RefuseSlot,
) {
    shared.metrics.connections_refused.inc();
    let within = cfg.header_read_timeout.min(REFUSE_WITHIN);
    let answered = tokio::time::timeout(within, async {
        match tls {
            None => answer(stream, None, &shared).await,
            Some(acceptor) => {
                let s = acceptor.accept(stream).await.ok()?;
                let h2 = s.get_ref().1.alpn_protocol() == Some(b"h2");
                answer(s, Some(h2), &shared).await
            }
        }
    })
    .await;
    if answered.is_err() {
        tracing::debug!(listener = %cfg.listen, "over max_connections: closed unanswered");
    }
}

/// Reads enough to tell HTTP/2 from HTTP/1 (unless ALPN said), answers, and lingers briefly
/// reading what the client still sends, so the answer is not lost to a reset.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    alpn_h2: Option<bool>,
    shared: &Shared,
) -> Option<()> {
    let mut buf = vec![0u8; 4096];
    let mut got = 0;
    let h2 = match alpn_h2 {
        Some(h2) => h2,
        None => {
            while got < H2_PREFACE.len() && H2_PREFACE.starts_with(&buf[..got]) {
                let n = s.read(&mut buf[got..]).await.ok()?;
                if n == 0 {
                    return None;
                }
                got += n;
            }
            buf[..got].starts_with(H2_PREFACE)
        }
    };
    if h2 {
        s.write_all(&overloaded_h2()).await.ok()?;
    } else {
        s.write_all(OVERLOADED_H1).await.ok()?;
        shared.metrics.response("proxy", "5xx", "overloaded");
    }
    s.flush().await.ok()?;
    let _ = s.shutdown().await;
    while s.read(&mut buf).await.ok()? > 0 {}
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_count_up_to_the_limit_and_back_down() {
        let l = Arc::new(ConnLimit::default());
        let a = l.try_open(2).unwrap();
        let _b = l.try_open(2).unwrap();
        assert!(l.try_open(2).is_none());
        drop(a);
        assert!(l.try_open(2).is_some());
    }

    #[test]
    fn the_goaway_frame_is_well_formed() {
        let f = overloaded_h2();
        // SETTINGS: empty, stream 0.
        assert_eq!(&f[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let g = &f[9..];
        let len = (usize::from(g[0]) << 16) | (usize::from(g[1]) << 8) | usize::from(g[2]);
        assert_eq!(g[3], 7, "GOAWAY");
        assert_eq!(len, g.len() - 9);
        assert_eq!(&g[13..17], &[0, 0, 0, 7], "REFUSED_STREAM");
    }
}
