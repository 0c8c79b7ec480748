//! An HTTP/2 stream as a byte stream, for the tunnel of an extended CONNECT (RFC 8441): reads
//! are the client's DATA frames (capacity released as they are read), writes go out as DATA
//! within the client's window, and shutdown ends the stream (END_STREAM).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use crate::error::BoxError;

/// An extended CONNECT's stream waiting for its answer, kept in the request's extensions
/// (as hyper keeps its `OnUpgrade`): the stream's task hands over the send side once the
/// `200` is out.
#[derive(Clone)]
pub(crate) struct H2Pending(Arc<Mutex<Option<Waiting>>>);

struct Waiting {
    recv: h2::RecvStream,
    send: oneshot::Receiver<h2::SendStream<Bytes>>,
}

/// The stream never became a tunnel (the `200` could not be sent).
#[derive(Debug, thiserror::Error)]
#[error("the HTTP/2 stream was not handed over")]
struct NotHandedOver;

impl H2Pending {
    /// The pending stream, and the sender its task hands the send side through.
    pub(super) fn new(recv: h2::RecvStream) -> (oneshot::Sender<h2::SendStream<Bytes>>, Self) {
        let (tx, rx) = oneshot::channel();
        (
            tx,
            H2Pending(Arc::new(Mutex::new(Some(Waiting { recv, send: rx })))),
        )
    }

    /// The stream as a byte stream, once the `200` has gone out.
    pub(crate) async fn upgraded(&self) -> Result<H2Upgraded, BoxError> {
        let waiting = self.0.lock().unwrap().take().ok_or(NotHandedOver)?;
        let send = waiting.send.await.map_err(|_| NotHandedOver)?;
        Ok(H2Upgraded {
            recv: waiting.recv,
            send,
            buf: Bytes::new(),
        })
    }
}

/// Both halves of a stream that carries a tunnel.
pub(crate) struct H2Upgraded {
    recv: h2::RecvStream,
    send: h2::SendStream<Bytes>,
    /// Received and not yet read.
    buf: Bytes,
}

fn io_error(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::Error::other("h2 I/O error"));
    }
    io::Error::new(io::ErrorKind::BrokenPipe, e)
}

impl AsyncRead for H2Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while this.buf.is_empty() {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    this.buf = data;
                }
                // The client ended its side (END_STREAM), or cancelled the stream.
                None => return Poll::Ready(Ok(())),
                Some(Err(e))
                    if matches!(
                        e.reason(),
                        Some(h2::Reason::NO_ERROR) | Some(h2::Reason::CANCEL)
                    ) =>
                {
                    return Poll::Ready(Ok(()))
                }
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
            }
        }
        let n = this.buf.len().min(out.remaining());
        out.put_slice(&this.buf[..n]);
        this.buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let send = &mut self.send;
        send.reserve_capacity(buf.len());
        loop {
            let cap = send.capacity();
            if cap > 0 {
                let n = cap.min(buf.len());
                send.send_data(Bytes::copy_from_slice(&buf[..n]), false)
                    .map_err(io_error)?;
                return Poll::Ready(Ok(n));
            }
            if let Poll::Ready(r) = send.poll_reset(cx) {
                let e = match r {
                    Ok(reason) => io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        format!("stream reset by the client: {reason:?}"),
                    ),
                    Err(e) => io_error(e),
                };
                return Poll::Ready(Err(e));
            }
            match ready!(send.poll_capacity(cx)) {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2 writes frames out as the connection's task runs; nothing is held here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.send.reserve_capacity(0);
        // Already ended or reset: nothing more to say.
        let _ = self.send.send_data(Bytes::new(), true);
        Poll::Ready(Ok(()))
    }
}
