//! The upstream socket as hyper sees it, with byte counters and a second handle for the
//! liveness test before reuse (a FIN or stray data already received means discard).

use std::io;
use std::mem::MaybeUninit;
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

/// A TCP stream shared between hyper's connection task and the pool.
pub struct SharedIo {
    stream: Arc<TcpStream>,
    counters: Arc<Counters>,
}

impl SharedIo {
    pub fn new(stream: TcpStream) -> (Self, Arc<TcpStream>, Arc<Counters>) {
        let stream = Arc::new(stream);
        let counters = Arc::new(Counters::default());
        (
            Self {
                stream: stream.clone(),
                counters: counters.clone(),
            },
            stream,
            counters,
        )
    }
}

/// Whether an idle socket is still fit for a request: no FIN, no unexpected bytes, no error.
/// A non-blocking peek, so it never registers a waker that would steal hyper's.
pub fn idle_socket_is_clean(stream: &TcpStream) -> bool {
    let mut buf = [MaybeUninit::<u8>::uninit(); 1];
    match socket2::SockRef::from(stream).peek(&mut buf) {
        Ok(_) => false, // 0 = FIN received; >0 = data nobody asked for
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
    }
}

impl AsyncRead for SharedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match self.stream.try_read(unfilled) {
                Ok(n) => {
                    buf.advance(n);
                    self.counters.read.fetch_add(n as u64, Ordering::Relaxed);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for SharedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write(buf) {
                Ok(n) => {
                    self.counters.written.fetch_add(n as u64, Ordering::Relaxed);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write_vectored(bufs) {
                Ok(n) => {
                    self.counters.written.fetch_add(n as u64, Ordering::Relaxed);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = socket2::SockRef::from(&*self.stream).shutdown(std::net::Shutdown::Write);
        Poll::Ready(match r {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        })
    }
}
