//! The downstream connection as the own server shares it between the connection's task
//! (request heads, responses) and the request body being read (which an upstream
//! connection's task may poll): the stream and its read buffer behind one lock, taken for
//! one poll at a time, never across an await.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::body::down::OwnSource;
use crate::error::BoxError;
use crate::h1::body::{Decoder, Piece};
use crate::h1::head::Framing;

/// Bytes read at a time into the read buffer.
pub(crate) const READ_CHUNK: usize = 4 * 1024;
/// Body bytes read at a time.
const BODY_CHUNK: usize = 16 * 1024;

/// The stream, what was read from it and not consumed yet, and the request body in
/// progress.
pub(crate) struct Wire<IO> {
    pub io: IO,
    pub rbuf: BytesMut,
    /// The request body being read: `Some` until its end was read.
    pub body: Option<Decoder>,
}

/// A wire shared by the connection's task and the request body.
pub(crate) struct Shared<IO>(Arc<Mutex<Wire<IO>>>);

impl<IO> Clone for Shared<IO> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Shared<IO> {
    /// A wire over `io`, with `rbuf` already read.
    pub fn new(io: IO, rbuf: BytesMut) -> Self {
        Self(Arc::new(Mutex::new(Wire {
            io,
            rbuf,
            body: None,
        })))
    }

    /// The wire, for one poll.
    pub fn lock(&self) -> MutexGuard<'_, Wire<IO>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The stream and unconsumed bytes back, when nothing else holds the wire.
    pub fn into_parts(self) -> Option<(IO, BytesMut)> {
        let w = Arc::try_unwrap(self.0).ok()?;
        let w = w.into_inner().unwrap_or_else(|p| p.into_inner());
        Some((w.io, w.rbuf))
    }

    /// Reads more into the buffer; `Ok(0)` at the end of the stream.
    pub fn poll_read_more(&self, cx: &mut Context<'_>, chunk: usize) -> Poll<io::Result<usize>> {
        read_more(&mut self.lock(), cx, chunk)
    }

    /// [`Shared::poll_read_more`] for a connection that waits (for its next request, or for
    /// its end while its request is handled): when nothing came and nothing waits in the
    /// read buffer, the connection lets go of it (`crate::spare::give_back`), and the next
    /// read on this thread takes it while its bytes are still in cache.
    pub fn poll_read_or_release(
        &self,
        cx: &mut Context<'_>,
        chunk: usize,
    ) -> Poll<io::Result<usize>> {
        let mut w = self.lock();
        let read = read_more(&mut w, cx, chunk);
        if read.is_pending() && w.rbuf.is_empty() {
            crate::spare::give_back(&mut w.rbuf);
        }
        read
    }

    /// Writes some of `bufs`.
    pub fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        crate::h1::poll_write_gathered(Pin::new(&mut self.lock().io), cx, bufs)
    }

    /// Flushes what the stream holds (TLS).
    pub fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.lock().io).poll_flush(cx)
    }

    /// Closes the stream's write side (TLS `close_notify`, FIN).
    pub fn poll_shutdown(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.lock().io).poll_shutdown(cx)
    }

    /// Whether the last request's body has been read to its end (or ends without reading
    /// more): only then can the next request be read.
    pub fn body_done(&self) -> bool {
        self.lock().body.as_ref().is_none_or(Decoder::at_end)
    }
}

/// The client closed its connection inside its request body.
#[derive(Debug, thiserror::Error)]
#[error("the client closed the connection before the end of its request body")]
pub struct BodyCut;

/// A request body read from the wire, as the request's handler (or the upstream connection
/// it goes to) asks for it. Lets go of the wire at its end.
pub(crate) struct BodySource<IO> {
    wire: Option<Shared<IO>>,
    /// Bytes still to come (Content-Length bodies).
    remaining: Option<u64>,
    /// The body's end was read with its last piece.
    wire_done: bool,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> BodySource<IO> {
    /// Starts reading a body framed as `framing` from `wire`.
    pub fn start(wire: &Shared<IO>, framing: Framing) -> Self {
        wire.lock().body = Some(Decoder::new(framing));
        let remaining = match framing {
            Framing::Length(n) => Some(n),
            _ => None,
        };
        Self {
            wire: Some(wire.clone()),
            remaining,
            wire_done: false,
        }
    }
}

impl<IO> OwnSource for BodySource<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(wire) = &self.wire else {
            return Poll::Ready(None);
        };
        loop {
            let piece = {
                let mut w = wire.lock();
                let Wire { rbuf, body, .. } = &mut *w;
                let Some(decoder) = body.as_mut() else {
                    return Poll::Ready(None);
                };
                match decoder.decode(rbuf) {
                    Ok(Some(Piece::End)) => {
                        *body = None;
                        None
                    }
                    Ok(Some(p)) => {
                        if decoder.at_end() {
                            // The last bytes: the wire is let go of now, not at the next poll.
                            *body = None;
                            self.wire_done = true;
                        }
                        Some(p)
                    }
                    Ok(None) => {
                        drop(w);
                        match ready!(wire.poll_read_more(cx, BODY_CHUNK)) {
                            Ok(0) => return Poll::Ready(Some(Err(Box::new(BodyCut)))),
                            Ok(_) => continue,
                            Err(e) => return Poll::Ready(Some(Err(Box::new(e)))),
                        }
                    }
                    Err(e) => return Poll::Ready(Some(Err(Box::new(e)))),
                }
            };
            if std::mem::take(&mut self.wire_done) {
                self.wire = None;
            }
            return Poll::Ready(match piece {
                None | Some(Piece::End) => {
                    self.wire = None;
                    self.remaining = Some(0);
                    None
                }
                Some(Piece::Data(d)) => {
                    if let Some(r) = &mut self.remaining {
                        *r = r.saturating_sub(d.len() as u64);
                    }
                    Some(Ok(Frame::data(d)))
                }
                Some(Piece::Trailers(t)) => Some(Ok(Frame::trailers(t))),
            });
        }
    }

    fn is_end_stream(&self) -> bool {
        self.wire.is_none() || self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::new(),
        }
    }
}

/// [`Shared::poll_read_more`] under the lock.
fn read_more<IO: AsyncRead + Unpin>(
    w: &mut Wire<IO>,
    cx: &mut Context<'_>,
    chunk: usize,
) -> Poll<io::Result<usize>> {
    let Wire { io, rbuf, .. } = w;
    crate::spare::read_room(rbuf, 512, chunk);
    tokio_util::io::poll_read_buf(Pin::new(io), cx, rbuf)
}
