//! The peer's first SETTINGS frame on an upstream HTTP/2 connection, read as it passes under
//! hyper: whether the peer announced `SETTINGS_ENABLE_CONNECT_PROTOCOL` (RFC 8441 §3), which
//! decides how an upgrade reaches it (`crate::upgrade`).
//!
//! hyper reports the setting only on its connection object, which the pool's connection task
//! owns, and h2 applies it in another task again; a request cannot ask either when it needs
//! to know. The server's preface is its SETTINGS frame (RFC 9113 §3.4), and RFC 8441 §3
//! forbids taking the setting back once announced, so the first frame answers it for the
//! connection's life. (h2's client sends an extended CONNECT whether or not it has applied
//! the setting yet, so knowing it here first is enough.)

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use super::h2_continue::{ContinueScan, OnContinue};

/// Frame header length (RFC 9113 §4.1).
const HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;
/// A first SETTINGS frame longer than this is not looked into (the setting reads as off).
const MAX_PAYLOAD: usize = 6 * 64;

/// An upstream stream whose first read bytes are looked at for the peer's SETTINGS (and, on
/// a connection for one `Expect: 100-continue` request, for its `100`: `h2_continue`).
pub(crate) struct SettingsWatch<IO> {
    io: IO,
    /// The first frame's bytes so far; `None` once it has been read.
    first: Option<Vec<u8>>,
    tx: watch::Sender<Option<bool>>,
    cont: Option<ContinueScan>,
}

impl<IO> SettingsWatch<IO> {
    /// Wraps `io`; `tx` gets the answer once the first frame has arrived.
    pub(crate) fn new(io: IO, tx: watch::Sender<Option<bool>>) -> Self {
        Self {
            io,
            first: Some(Vec::with_capacity(HEADER + 6 * 8)),
            tx,
            cont: None,
        }
    }

    /// Also looks for a `100` as the peer's first answer on stream 1.
    pub(crate) fn with_continue(mut self, on_continue: Option<OnContinue>) -> Self {
        self.cont = on_continue.map(ContinueScan::new);
        self
    }

    fn look(&mut self, data: &[u8]) {
        let Some(buf) = &mut self.first else { return };
        buf.extend_from_slice(data);
        match parse(buf) {
            Parsed::More => {}
            Parsed::Done(enabled) => {
                self.first = None;
                self.tx.send_replace(Some(enabled));
            }
        }
    }
}

enum Parsed {
    More,
    Done(bool),
}

/// Reads the first frame in `buf`: `Done(true)` when it is SETTINGS with
/// ENABLE_CONNECT_PROTOCOL = 1.
fn parse(buf: &[u8]) -> Parsed {
    if buf.len() < HEADER {
        return Parsed::More;
    }
    let len = (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
    if buf[3] != SETTINGS || len > MAX_PAYLOAD {
        return Parsed::Done(false);
    }
    if buf.len() < HEADER + len {
        return Parsed::More;
    }
    let enabled = buf[HEADER..HEADER + len]
        .chunks_exact(6)
        .rfind(|e| u16::from_be_bytes([e[0], e[1]]) == ENABLE_CONNECT_PROTOCOL)
        .is_some_and(|e| u32::from_be_bytes([e[2], e[3], e[4], e[5]]) == 1);
    Parsed::Done(enabled)
}

impl<IO: AsyncRead + Unpin> AsyncRead for SettingsWatch<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        let looking = self.first.is_some() || self.cont.as_ref().is_some_and(ContinueScan::active);
        if looking {
            if let Poll::Ready(Ok(())) = r {
                let filled = buf.filled();
                if filled.len() == before {
                    // The peer closed (before its SETTINGS, if those are still awaited).
                    if self.first.take().is_some() {
                        self.tx.send_replace(Some(false));
                    }
                    if let Some(c) = &mut self.cont {
                        c.closed();
                    }
                } else {
                    let new = filled[before..].to_vec();
                    self.look(&new);
                    if let Some(c) = &mut self.cont {
                        c.look(&new);
                    }
                }
            }
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for SettingsWatch<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(entries: &[(u16, u32)]) -> Vec<u8> {
        let len = entries.len() * 6;
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            SETTINGS,
            0,
            0,
            0,
            0,
            0,
        ];
        for (id, v) in entries {
            f.extend_from_slice(&id.to_be_bytes());
            f.extend_from_slice(&v.to_be_bytes());
        }
        f
    }

    #[tokio::test]
    async fn the_first_settings_frame_says_whether_extended_connect_is_on() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for (entries, want) in [
            (vec![(0x3, 100), (0x8, 1)], true),
            (vec![(0x3, 100)], false),
            (vec![(0x8, 0)], false),
            (vec![], false),
        ] {
            let (a, mut b) = tokio::io::duplex(64);
            let (tx, mut rx) = watch::channel(None);
            let mut w = SettingsWatch::new(a, tx);
            let frame = settings(&entries);
            // Split across reads: the answer comes only with the whole frame.
            b.write_all(&frame[..5]).await.unwrap();
            let mut buf = [0u8; 64];
            let n = w.read(&mut buf).await.unwrap();
            assert_eq!(n, 5);
            assert_eq!(*rx.borrow(), None);
            b.write_all(&frame[5..]).await.unwrap();
            b.write_all(b"more frames").await.unwrap();
            let _ = w.read(&mut buf).await.unwrap();
            assert_eq!(*rx.borrow_and_update(), Some(want), "{entries:?}");
        }
    }
}
