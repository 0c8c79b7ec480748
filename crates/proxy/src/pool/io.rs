//! The upstream socket as hyper sees it, with byte counters and a second handle for the
//! liveness test before reuse (a FIN or stray data already received means discard).
//!
//! hyper owns the `TcpStream` and reads it through tokio's own `poll_read`, which knows that
//! a short read drained the socket and skips the read that would only say `EAGAIN`; the pool
//! peeks through a duplicate of the descriptor made once per connection.
//!
//! Over TLS the counters count plaintext (request and response bytes, not records), and the
//! peek sees the TCP socket under TLS: a close_notify or a FIN waiting there means discard.
//!
//! A connection of upkeep's own codec is first asked the runtime, without a system call,
//! whether anything came since its last read drained the socket
//! ([`SharedIo::quiet_since_drained`]); only then is it peeked.

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

    /// Whether the runtime's I/O driver has seen nothing arrive on the socket (data, a FIN,
    /// an error) since a read last drained it, as nginx judges an idle upstream connection:
    /// a read that fills less than its buffer leaves the socket empty, and tokio then clears
    /// its readiness until the next event (`PollEvented::poll_read`), while a FIN or an
    /// error, once seen, stays. No system call: the readiness is the driver's record of the
    /// edge-triggered events it has taken from epoll. `false` (look closer) whenever the last
    /// read filled its buffer or anything came since. Only for a socket no task is reading:
    /// the look leaves a waker that does nothing in place of the reader's.
    pub fn quiet_since_drained(&self) -> bool {
        let tcp = match &self.stream {
            Transport::Plain(s) => s,
            Transport::Tls(s) => s.get_ref().0,
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        tcp.poll_read_ready(&mut cx).is_pending()
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
        // One plain write where it can (`crate::h1::poll_write_gathered`): the own codec's
        // requests and hyper's alike.
        let n = ready!(match &mut self.stream {
            Transport::Plain(s) => crate::h1::poll_write_gathered(Pin::new(s), cx, bufs),
            Transport::Tls(s) => crate::h1::poll_write_gathered(Pin::new(s), cx, bufs),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An upstream connection as the pool holds it, and the server's end of it.
    async fn pair() -> (SharedIo, Peeker, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let peeker = Peeker::new(&c).unwrap();
        (SharedIo::new(Transport::Plain(c)).0, peeker, s)
    }

    /// Lets the runtime's I/O driver take what epoll has for it.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// One read into a buffer of `room` bytes.
    async fn read(io: &mut SharedIo, room: usize) -> usize {
        let mut buf = vec![0u8; room];
        io.read(&mut buf).await.unwrap()
    }

    /// `bytes` come from the server: the socket is no longer quiet, and is again once a read
    /// with room to spare took them.
    async fn arrives(server: &mut TcpStream, io: &mut SharedIo, peeker: &Peeker, bytes: &[u8]) {
        server.write_all(bytes).await.unwrap();
        settle().await;
        assert!(!io.quiet_since_drained(), "{bytes:?} wait unread");
        assert!(!peeker.idle_socket_is_clean());
        assert_eq!(read(io, 64).await, bytes.len());
        assert!(
            io.quiet_since_drained(),
            "the read of {bytes:?} drained the socket"
        );
    }

    #[tokio::test]
    async fn a_drained_socket_is_quiet_until_data_or_a_fin_arrives() {
        let (mut io, peeker, mut server) = pair().await;
        settle().await;
        assert!(io.quiet_since_drained(), "nothing was ever sent");
        assert!(peeker.idle_socket_is_clean());

        // A response, read with room to spare: the read drained the socket.
        arrives(&mut server, &mut io, &peeker, b"HTTP/1.1 200 OK\r\n\r\n").await;
        settle().await;
        assert!(io.quiet_since_drained(), "nothing came since");
        assert!(peeker.idle_socket_is_clean());

        // Stray bytes while idle (a 408 without a close).
        arrives(&mut server, &mut io, &peeker, b"HTTP/1.1 408 ").await;

        // The server closes the idle connection.
        drop(server);
        settle().await;
        assert!(!io.quiet_since_drained(), "a FIN came");
        assert!(!peeker.idle_socket_is_clean());
    }

    #[tokio::test]
    async fn a_read_that_fills_its_buffer_is_not_taken_as_draining() {
        let (mut io, peeker, mut server) = pair().await;
        server.write_all(b"12345678").await.unwrap();
        settle().await;
        assert_eq!(read(&mut io, 8).await, 8);
        // More could be waiting: the peek decides (here it finds nothing).
        assert!(!io.quiet_since_drained());
        assert!(peeker.idle_socket_is_clean());
    }

    #[tokio::test]
    async fn a_fin_read_with_the_last_response_keeps_the_socket_from_being_quiet() {
        let (mut io, peeker, mut server) = pair().await;
        server.write_all(b"last").await.unwrap();
        server.shutdown().await.unwrap();
        settle().await;
        assert_eq!(read(&mut io, 64).await, 4);
        assert!(!io.quiet_since_drained(), "the FIN was seen with the bytes");
        assert!(!peeker.idle_socket_is_clean());
    }
}
