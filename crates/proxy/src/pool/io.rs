//! The upstream socket as hyper sees it, with byte counters and a second handle for the
//! liveness test before reuse (a FIN or stray data already received means discard).
//!
//! hyper owns the `TcpStream` and reads it through tokio's own `poll_read`, which knows that
//! a short read drained the socket and skips the read that would only say `EAGAIN`; the pool
//! peeks through a duplicate of the descriptor made once per connection.
//!
//! Over TLS the counters count plaintext (request and response bytes, not records), and the
//! peek sees the TCP socket under TLS: a close_notify or a FIN waiting there means discard.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Bytes moved on one upstream connection.
#[derive(Default, Debug)]
pub struct Counters {
    /// Request bytes written to the socket.
    pub written: AtomicU64,
    /// Response bytes read from the socket.
    pub read: AtomicU64,
}

/// The stream hyper's connection task reads and writes, counting bytes.
pub struct SharedIo {
    stream: Transport,
    counters: Arc<Counters>,
}

/// Plain TCP or TLS over TCP.
pub enum Transport {
    /// `http://` endpoints.
    Plain(TcpStream),
    /// `https://` endpoints.
    Tls(Box<TlsStream<TcpStream>>),
}

/// The pool's handle on the same socket, for the liveness test; it never reads data.
pub struct Peeker(socket2::Socket);

impl SharedIo {
    pub fn new(stream: Transport) -> (Self, Arc<Counters>) {
        let counters = Arc::new(Counters::default());
        (
            Self {
                stream,
                counters: counters.clone(),
            },
            counters,
        )
    }
}

impl Peeker {
    /// A handle on `stream`'s socket, made before any TLS layer is put on top of it.
    pub fn new(stream: &TcpStream) -> io::Result<Self> {
        // The duplicate shares the socket (and its non-blocking flag) with `stream`.
        Ok(Peeker(socket2::Socket::from(
            stream.as_fd().try_clone_to_owned()?,
        )))
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
        ready!(match &mut self.stream {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s).poll_read(cx, buf),
        })?;
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
        let n = ready!(match &mut self.stream {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s).poll_write(cx, buf),
        })?;
        self.counters.written.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(match &mut self.stream {
            Transport::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Transport::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        })?;
        self.counters.written.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Transport::Plain(_) => Poll::Ready(Ok(())),
            // rustls holds encrypted records until they are flushed to the socket.
            Transport::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = match &mut self.stream {
            Transport::Plain(s) => socket2::SockRef::from(&*s).shutdown(std::net::Shutdown::Write),
            // close_notify, then the TCP half-close.
            Transport::Tls(s) => ready!(Pin::new(s).poll_shutdown(cx)),
        };
        Poll::Ready(match r {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        })
    }
}
