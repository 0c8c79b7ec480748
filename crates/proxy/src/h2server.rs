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

/// The keep-alive PING: one every [`KEEPALIVE_INTERVAL`]; an answer not back within
/// [`KEEPALIVE_TIMEOUT`] means the client is gone.
struct KeepAlive {
    pp: h2::PingPong,
    timer: Pin<Box<Sleep>>,
    /// A PING is out, sent at this time.
    sent: Option<Instant>,
}

impl KeepAlive {
    fn new(pp: h2::PingPong) -> Self {
        Self {
            pp,
            timer: Box::pin(tokio::time::sleep(KEEPALIVE_INTERVAL)),
            sent: None,
        }
    }

    /// A new stream: nothing to ask while the client is plainly there.
    fn activity(&mut self) {
        if self.sent.is_none() {
            self.timer
                .as_mut()
                .reset(Instant::now() + KEEPALIVE_INTERVAL);
        }
    }

    /// Drives the PING; true once one went unanswered for [`KEEPALIVE_TIMEOUT`].
    fn poll_timed_out(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.sent.is_some() {
                match self.pp.poll_pong(cx) {
                    Poll::Ready(Ok(_)) => {
                        self.sent = None;
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
            if self.pp.send_ping(h2::Ping::opaque()).is_err() {
                return false;
            }
            let now = Instant::now();
            self.sent = Some(now);
            self.timer.as_mut().reset(now + KEEPALIVE_TIMEOUT);
        }
    }
}
