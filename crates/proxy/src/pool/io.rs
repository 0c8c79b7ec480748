//! The upstream socket as hyper sees it, with byte counters and a second handle for the
//! liveness test before reuse (a FIN or stray data already received means discard).
//!
//! hyper owns the `TcpStream` and reads it through tokio's own `poll_read`, which knows that
//! a short read drained the socket and skips the read that would only say `EAGAIN`; the pool
//! peeks through a duplicate of the descriptor made once per connection.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Bytes moved on one upstream connection.
#[derive(Default, Debug)]
pub struct Counters {
    /// Request bytes written to the socket.
    pub written: AtomicU64,
    /// Response bytes read from the socket.
    pub read: AtomicU64,
}

/// The TCP stream hyper's connection task reads and writes, counting bytes.
pub struct SharedIo {
    stream: TcpStream,
    counters: Arc<Counters>,
}

/// The pool's handle on the same socket, for the liveness test; it never reads data.
pub struct Peeker(socket2::Socket);

impl SharedIo {
    pub fn new(stream: TcpStream) -> io::Result<(Self, Peeker, Arc<Counters>)> {
        // The duplicate shares the socket (and its non-blocking flag) with `stream`.
        let peeker = Peeker(socket2::Socket::from(stream.as_fd().try_clone_to_owned()?));
        let counters = Arc::new(Counters::default());
        Ok((
            Self {
                stream,
                counters: counters.clone(),
            },
            peeker,
            counters,
        ))
    }
}

impl Peeker {
    /// Whether an idle socket is still fit for a request: no FIN, no unexpected bytes, no
    /// error. A non-blocking peek, so it never registers a waker that would steal hyper's.
    pub fn idle_socket_is_clean(&self) -> bool {
        let mut buf = [MaybeUninit::<u8>::uninit(); 1];
        match self.0.peek(&mut buf) {
            Ok(_) => false, // 0 = FIN received; >0 = data nobody asked for
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        }
    }
}

impl AsyncRead for SharedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.stream).poll_read(cx, buf))?;
        let n = buf.filled().len() - before;
        self.counters.read.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for SharedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.stream).poll_write(cx, buf))?;
        self.counters.written.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.stream).poll_write_vectored(cx, bufs))?;
        self.counters.written.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = socket2::SockRef::from(&self.stream).shutdown(std::net::Shutdown::Write);
        Poll::Ready(match r {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        })
    }
}
