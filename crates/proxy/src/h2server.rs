//! The downstream HTTP/2 server, on the `h2` crate: one task per stream, each running the
//! request handler and sending its response.
//!
//! hyper's HTTP/2 server (which served this side before) keeps h2's `SendResponse` to itself,
//! so a handler cannot send an informational response; the upstream's `100 Continue` could
//! not reach an HTTP/2 client (`crate::expect`). Serving on `h2` directly lets a stream send
//! it ([`stream`]). Everything else follows what hyper's server did, with the same settings:
//! flow-control capacity released as the body is read, trailers both ways, RFC 8441
//! extended CONNECT, keep-alive PINGs, a GOAWAY on graceful shutdown.

mod body;
mod io;
mod stream;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use crate::listener::h2_stall::StreamExec;
use crate::proxy::ConnCtx;

pub use body::H2Body;
pub(crate) use io::{H2Pending, H2Upgraded};

/// Initial flow-control windows (stream and connection): 1 MiB each, hyper's server defaults,
/// so an upload is not held to the protocol's 64 KiB per round trip.
const WINDOW: u32 = 1024 * 1024;
/// Streams a client may have open at once (hyper's default; beyond it: REFUSED_STREAM).
const MAX_CONCURRENT_STREAMS: u32 = 200;
/// Response bytes h2 buffers per stream beyond what the client's window takes.
const MAX_SEND_BUFFER: usize = 400 * 1024;
/// Streams the server may reset for protocol errors before it ends the connection.
const MAX_LOCAL_ERROR_RESETS: usize = 1024;
/// Streams reset by the client before they were accepted: past this many at once the
/// connection ends (rapid reset, CVE-2023-44487), as hyper's server bounded it.
const MAX_PENDING_ACCEPT_RESETS: usize = 20;
/// A PING every so often on every connection, busy or idle.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// A PING not answered within this closes the connection.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// One downstream HTTP/2 connection, served until it ends; `graceful` sends GOAWAY.
pub(crate) struct H2Conn<IO> {
    state: State<IO>,
    ctx: Arc<ConnCtx>,
    exec: StreamExec,
    /// Graceful shutdown asked for before the handshake finished.
    close_pending: bool,
    closing: bool,
    ping: Option<KeepAlive>,
}

enum State<IO> {
    Handshaking(h2::server::Handshake<IO, Bytes>),
    Serving(h2::server::Connection<IO, Bytes>),
    Done,
}

impl<IO> H2Conn<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    /// Starts the handshake on `io` (the client's preface is read through it).
    pub(crate) fn new(io: IO, ctx: Arc<ConnCtx>, exec: StreamExec) -> Self {
        let mut b = h2::server::Builder::new();
        b.initial_window_size(WINDOW)
            .initial_connection_window_size(WINDOW)
            .max_frame_size(16 * 1024)
            .max_header_list_size(ctx.listener.max_header_bytes.min(u32::MAX as usize) as u32)
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .max_send_buffer_size(MAX_SEND_BUFFER)
            .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
            .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
            // RFC 8441: WebSocket over a stream (crate::upgrade).
            .enable_connect_protocol();
        Self {
            state: State::Handshaking(b.handshake(io)),
            ctx,
            exec,
            close_pending: false,
            closing: false,
            ping: None,
        }
    }

    /// Sends GOAWAY: streams already open finish, no new one is taken.
    pub(crate) fn graceful_shutdown(&mut self) {
        match &mut self.state {
            State::Serving(c) if !self.closing => {
                self.closing = true;
                c.graceful_shutdown();
            }
            State::Handshaking(_) => self.close_pending = true,
            _ => {}
        }
    }
}

impl<IO> Future for H2Conn<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    /// Ends with `Ok` whatever ended it (errors are the client's, logged at debug).
    type Output = Result<(), hyper::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let me = &mut *self;
        loop {
            match &mut me.state {
                State::Handshaking(hs) => match ready!(Pin::new(hs).poll(cx)) {
                    Ok(mut conn) => {
                        me.ping = conn.ping_pong().map(KeepAlive::new);
                        me.state = State::Serving(conn);
                        if me.close_pending {
                            me.graceful_shutdown();
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "HTTP/2 handshake failed");
                        me.state = State::Done;
                        return Poll::Ready(Ok(()));
                    }
                },
                State::Serving(conn) => {
                    if let Some(ping) = &mut me.ping {
                        if ping.poll_timed_out(cx) {
                            tracing::debug!("HTTP/2 keep-alive PING not answered; closing");
                            conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                            me.ping = None;
                        }
                    }
                    match ready!(conn.poll_accept(cx)) {
                        Some(Ok((req, respond))) => {
                            if let Some(ping) = &mut me.ping {
                                ping.activity();
                            }
                            stream::spawn(&me.exec, req, respond, me.ctx.clone());
                        }
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "downstream HTTP/2 connection ended with an error");
                            me.state = State::Done;
                            return Poll::Ready(Ok(()));
                        }
                        None => {
                            // No more streams: flush what is left (GOAWAY, last frames).
                            let r = ready!(conn.poll_closed(cx));
                            if let Err(e) = r {
                                tracing::debug!(error = %e, "downstream HTTP/2 connection closed with an error");
                            }
                            me.state = State::Done;
                            return Poll::Ready(Ok(()));
                        }
                    }
                }
                State::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// The keep-alive PING: one once a [`KEEPALIVE_INTERVAL`] has passed without a new stream;
/// an answer not back within [`KEEPALIVE_TIMEOUT`] means the client is gone.
struct KeepAlive {
    pp: h2::PingPong,
    timer: Pin<Box<Sleep>>,
    /// A PING is out, sent at this time.
    sent: Option<Instant>,
    /// A stream came since the timer was last set. The timer is not moved for each stream
    /// (a clock read and a timer-wheel update per request); when it fires after such an
    /// interval it is set again instead of sending a PING, so an idle connection is asked
    /// one to two intervals after its last stream.
    active: bool,
}

impl KeepAlive {
    fn new(pp: h2::PingPong) -> Self {
        Self {
            pp,
            timer: Box::pin(tokio::time::sleep(KEEPALIVE_INTERVAL)),
            sent: None,
            active: false,
        }
    }

    /// A new stream: nothing to ask while the client is plainly there.
    fn activity(&mut self) {
        self.active = true;
    }

    /// Drives the PING; true once one went unanswered for [`KEEPALIVE_TIMEOUT`].
    fn poll_timed_out(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.sent.is_some() {
                match self.pp.poll_pong(cx) {
                    Poll::Ready(Ok(_)) => {
                        self.sent = None;
                        self.active = false;
                        self.timer
                            .as_mut()
                            .reset(Instant::now() + KEEPALIVE_INTERVAL);
                    }
                    Poll::Ready(Err(_)) => return false,
                    Poll::Pending => {
                        return self.timer.as_mut().poll(cx).is_ready();
                    }
                }
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            if std::mem::take(&mut self.active) {
                self.timer
                    .as_mut()
                    .reset(Instant::now() + KEEPALIVE_INTERVAL);
                continue;
            }
            if self.pp.send_ping(h2::Ping::opaque()).is_err() {
                return false;
            }
            let now = Instant::now();
            self.sent = Some(now);
            self.timer.as_mut().reset(now + KEEPALIVE_TIMEOUT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves one HTTP/2 connection whose client never answers a PING, noting a stream's
    /// activity at each of `streams_at` (seconds, on tokio's paused clock). Returns when the
    /// server sent its first PING and when the keep-alive gave the client up.
    async fn unanswered(streams_at: &[u64]) -> (Duration, Duration) {
        let start = Instant::now();
        let (client, server) = tokio::io::duplex(1 << 16);
        let (mut rd, mut wr) = tokio::io::split(client);
        wr.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .unwrap();
        // The server's frames, read raw: the time of the first PING (type 6, no ACK flag).
        let first_ping = tokio::spawn(async move {
            loop {
                let mut head = [0u8; 9];
                rd.read_exact(&mut head).await.ok()?;
                let len =
                    usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
                let mut payload = vec![0; len];
                rd.read_exact(&mut payload).await.ok()?;
                if head[3] == 6 && head[4] & 1 == 0 {
                    return Some(start.elapsed());
                }
            }
        });
        let mut conn = h2::server::handshake(server).await.unwrap();
        let mut ka = KeepAlive::new(conn.ping_pong().unwrap());
        let mut marks: Vec<_> = streams_at
            .iter()
            .map(|s| Box::pin(tokio::time::sleep(Duration::from_secs(*s))))
            .collect();
        poll_fn(|cx| {
            marks.retain_mut(|m| {
                let fired = m.as_mut().poll(cx).is_ready();
                if fired {
                    ka.activity();
                }
                !fired
            });
            if ka.poll_timed_out(cx) {
                return Poll::Ready(());
            }
            // Drives the connection (its PING goes out from here); no stream ever comes.
            assert!(conn.poll_accept(cx).is_pending());
            Poll::Pending
        })
        .await;
        let gave_up = start.elapsed();
        drop(conn);
        (first_ping.await.unwrap().expect("a PING was sent"), gave_up)
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_client_is_pinged_after_an_interval_and_given_up_when_it_does_not_answer() {
        let (ping, gave_up) = unanswered(&[]).await;
        assert_eq!(ping.as_secs(), KEEPALIVE_INTERVAL.as_secs());
        assert_eq!(
            gave_up.as_secs(),
            (KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT).as_secs()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_within_an_interval_puts_the_ping_off_by_one_interval() {
        // A stream half-way through the first interval: no PING when it ends; the next
        // interval has none, so the PING goes out at its end.
        let half = KEEPALIVE_INTERVAL.as_secs() / 2;
        let (ping, gave_up) = unanswered(&[half]).await;
        assert_eq!(ping.as_secs(), 2 * KEEPALIVE_INTERVAL.as_secs());
        assert_eq!(
            gave_up.as_secs(),
            (2 * KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT).as_secs()
        );
        // Streams in every interval keep it off for as long as they come.
        let i = KEEPALIVE_INTERVAL.as_secs();
        let (ping, _) = unanswered(&[half, i + half, 2 * i + half]).await;
        assert_eq!(ping.as_secs(), 4 * i);
    }
}
