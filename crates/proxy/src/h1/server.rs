//! upkeep's own HTTP/1 server side for downstream connections (plain and TLS), on `httparse`
//! (docs/http1.md).
//!
//! One task per connection reads a request head into a per-connection buffer (reused across
//! requests, let go of while idle), parses it once (`request`, which is also the strict
//! framing check), runs `crate::proxy::handle` in the same task with the request body read
//! from the connection as it is asked for (`wire`: `Content-Length` or validated chunked),
//! and writes the response with its own encoder (`response`). Pipelined requests wait in
//! the buffer and are answered in order. The connection's timeouts and drain rules are those
//! of the hyper path (`crate::listener`): header read, idle, send, close after the next
//! response or once quiet.
//!
//! A request it does not serve (`Expect`, `Upgrade`, `CONNECT`) or would refuse hands the
//! connection over, with every byte buffered so far, to hyper behind the framing check, for
//! the rest of the connection: hyper answers refusals (400, 414, 431) exactly as before, and
//! `crate::expect` and `crate::upgrade` work unchanged.

mod invariants;
mod request;
mod response;
mod wire;

pub use invariants::request_invariants;

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use crate::body::down::{DownBody, OwnBody};
use crate::headers::Present;
use crate::listener::{count_timeout, expired, may_close, next_deadline, Expired, Signals};
use crate::proxy::ConnCtx;
use crate::spare::give_back;
use request::Parsed;
use response::Answering;
use wire::{BodySource, Shared, READ_CHUNK};

/// How long a closing connection waits for its TLS close or FIN to go out.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// How the own server left a connection.
pub(crate) enum Outcome<IO> {
    /// The connection is finished.
    Closed,
    /// The rest of the connection is hyper's: the stream, and the bytes read from it that
    /// nothing has consumed (a whole request head first).
    HandOver(IO, BytesMut),
}

/// Serves HTTP/1 requests on `io` until the connection ends or is handed over; `prefix` is
/// what was read from it already (the protocol sniff).
pub(crate) async fn serve<IO>(
    io: IO,
    prefix: &[u8],
    ctx: &Arc<ConnCtx>,
    signals: &mut Signals,
) -> Outcome<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cfg = &*ctx.listener;
    let activity = &*ctx.activity;
    let wire = Shared::new(io, BytesMut::from(prefix));
    let mut wbuf = BytesMut::new();
    // The slices of one response waiting for the socket (reused: no allocation per
    // response).
    let mut pending = Vec::with_capacity(4);
    // Told to close: the rules of `crate::listener::drive` (after the next response once a
    // request is under way; once quiet when idle).
    let mut close_pending = *signals.close_idle.borrow();
    // The signal's value, read after each request: a look under its lock costs a tenth of a
    // poll of the wait below.
    let close_now = signals.close_idle.clone();
    // Set far off before its first poll, so that the loop below moves it to the first
    // deadline it needs (a longer configured timeout is reached by going off and moving on).
    let timer = tokio::time::sleep(Duration::from_secs(4000));
    tokio::pin!(timer);
    // One wait for the close signal for the whole connection, not a new one (a waiter added
    // to the signal and removed again) per `select!` round; polled only until it fires.
    let told = told_to_close(&mut signals.close_idle);
    tokio::pin!(told);
    loop {
        let head = loop {
            // In a block of its own: the parse's outcome (a whole request head, about 130
            // bytes) is gone before the wait below, so the connection's task does not keep
            // room for it while the connection is idle.
            let buffered = {
                // `drained`: nothing follows the head in the buffer (looked at under the
                // same lock as the parse).
                let (parsed, buffered, drained) = {
                    let mut w = wire.lock();
                    if w.rbuf.is_empty() {
                        (Parsed::Partial, false, true)
                    } else {
                        let parsed = request::parse(&mut w.rbuf, cfg.max_header_bytes);
                        (parsed, true, w.rbuf.is_empty())
                    }
                };
                match parsed {
                    Parsed::Request(h) => {
                        activity.set_head_in_progress(false);
                        break (h, drained);
                    }
                    Parsed::HandOver => return hand_over(wire),
                    Parsed::Partial if buffered => activity.set_head_in_progress(true),
                    Parsed::Partial => {}
                }
                buffered
            };
            if close_pending && may_close(activity, cfg) {
                close(&wire).await;
                return Outcome::Closed;
            }
            let mut wait = next_deadline(activity, cfg).unwrap_or(Duration::from_secs(3600));
            if close_pending {
                wait = wait.min(Duration::from_millis(50));
            }
            // Moved only when it must go off sooner (or went off): left at an earlier
            // deadline, it goes off there, `expired` finds nothing due, and it is moved on
            // then. Moving it costs more than the rest of this loop; request after request
            // the idle deadline only moves later.
            let at = Instant::now() + wait;
            if timer.deadline() > at || timer.is_elapsed() {
                timer.as_mut().reset(at);
            }
            // In this order, not a random one (which costs a random number per round): a
            // request that came is read before a timer that went off at the same moment
            // closes its connection; a head that keeps coming meets its size limit.
            tokio::select! {
                biased;
                r = poll_fn(|cx| poll_read_head(&wire, &mut wbuf, cx)) => match r {
                    Ok(0) | Err(_) => return Outcome::Closed,
                    Ok(_) => activity.touch(),
                },
                () = &mut told, if !close_pending => {
                    close_pending = true;
                }
                () = &mut timer => match expired(activity, cfg) {
                    Some(Expired::Idle) => {
                        close(&wire).await;
                        return Outcome::Closed;
                    }
                    Some(Expired::HeadTimeout) => {
                        head_timed_out(&wire, buffered, ctx).await;
                        return Outcome::Closed;
                    }
                    None => {}
                },
            }
        };

        let (
            request::Head {
                mut request,
                present,
                keep_alive,
                http10,
                head_method,
                body,
            },
            drained,
        ) = head;
        if let Some(framing) = body {
            *request.body_mut() = DownBody::Own(OwnBody::new(BodySource::start(&wire, framing)));
        }
        let accepts_trailers = present.has(Present::TE)
            && crate::trailers::accepted(request.headers(), request.version());
        // A client that closes meanwhile has left (`handled`).
        let watch_eof = body.is_none() && drained;
        // The handler and the response writer run in one box, allocated per request: held
        // inline, their state would be part of the connection task's memory for as long as
        // the connection lives, idle ones included. The handler is gone before the writer
        // starts, and each is its own awaited future, so the two share the box's space
        // (locals of one `async` block that hold them would not: the compiler keeps the
        // handler's place apart from the writer's). `None`: the client left. The box is
        // allocated first and the future made straight into it: `Box::pin(async { .. })`
        // makes it on the stack and copies it in.
        let written = Box::into_pin(Box::write(Box::new_uninit(), async {
            let resp = handled(request, ctx, present, &wire, watch_eof).await?;
            if !close_pending {
                // Told to close while the request was handled: this response says so. One
                // look now rather than a branch of the `select!` above, whose every round
                // would poll the signal again.
                close_pending = *close_now.borrow();
            }
            // A request body not read to its end leaves bytes that are not the next request:
            // the connection ends with this response. (Without a body there is nothing to
            // have read, and no need to take the wire's lock to ask.)
            let answering = Answering {
                keep_alive: keep_alive && !close_pending && (body.is_none() || wire.body_done()),
                http10,
                head_method,
                accepts_trailers,
                keepalive: &ctx.keepalive,
            };
            if wbuf.capacity() == 0 {
                wbuf = crate::spare::buffer();
            }
            Some(
                response::write(
                    &wire,
                    &mut wbuf,
                    &mut pending,
                    resp,
                    &answering,
                    cfg.send_timeout,
                    activity,
                )
                .await,
            )
        }))
        .await;
        let Some(written) = written else {
            return Outcome::Closed;
        };
        activity.touch();
        match written {
            Ok(true) if body.is_none() => {}
            Ok(true) if wire.body_done() => wire.lock().body = None,
            Ok(_) => {
                close(&wire).await;
                return Outcome::Closed;
            }
            Err(e) => {
                tracing::debug!(error = %e, "downstream connection ended with an error");
                if activity.send_timed_out() {
                    count_timeout(&ctx.shared, "send");
                }
                return Outcome::Closed;
            }
        }
    }
}

/// Runs the handler for one request. As hyper did: a client that closes while its bodiless
/// request is handled (`watch_eof`) has left, and the request is dropped (its upstream
/// exchange with it): `None`. Bytes that come meanwhile (a pipelined request) wait in the
/// buffer.
#[allow(clippy::manual_async_fn)] // an `async fn` keeps its arguments twice (`proxy::handle_with`)
fn handled<'a, IO>(
    request: Box<crate::proxy::DownRequest>,
    ctx: &'a Arc<ConnCtx>,
    present: Present,
    wire: &'a Shared<IO>,
    mut watch_eof: bool,
) -> impl std::future::Future<Output = Option<crate::proxy::Resp>> + 'a
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    async move {
        let mut handling = std::pin::pin!(crate::proxy::handle_with(
            request,
            ctx.clone(),
            present,
            true
        ));
        loop {
            // The answer first, when the client also left meanwhile.
            tokio::select! {
                biased;
                r = &mut handling => {
                    let Ok(resp) = r;
                    return Some(resp);
                }
                // Nothing to read as a rule: the read buffer goes back meanwhile, for the
                // upstream exchange to take.
                r = poll_fn(|cx| wire.poll_read_or_release(cx, READ_CHUNK)), if watch_eof => match r {
                    Ok(0) | Err(_) => {
                        tracing::debug!("the client closed its connection while its request was handled");
                        return None;
                    }
                    Ok(_) => watch_eof = false,
                },
            }
        }
    }
}

/// Reads more of the next request head. When nothing has come, the connection lets go of its
/// write buffer, and of its read buffer unless part of a head waits in it: an idle
/// keep-alive connection holds no buffer. They are kept aside for the thread's next read or
/// response (`crate::spare::give_back`, at most 256), so this costs no allocation per request (a
/// connection busy with pipelined requests never waits here, and keeps its buffers).
fn poll_read_head<IO>(
    wire: &Shared<IO>,
    wbuf: &mut BytesMut,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<std::io::Result<usize>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let read = wire.poll_read_or_release(cx, READ_CHUNK);
    if read.is_pending() {
        give_back(wbuf);
    }
    read
}

/// Waits until the connection is told to close (its guard on the signal is not held).
async fn told_to_close(close_idle: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = close_idle.wait_for(|s| *s).await;
}

/// Gives the connection to the hyper path, with what was read and not consumed; a wire
/// still held elsewhere (a request body an upstream connection has not let go of) cannot
/// be handed over, and the connection closes.
fn hand_over<IO>(wire: Shared<IO>) -> Outcome<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    match wire.into_parts() {
        Some((io, rbuf)) => Outcome::HandOver(io, rbuf),
        None => Outcome::Closed,
    }
}

/// Closes the connection cleanly (TLS `close_notify`, then FIN), bounded in time.
async fn close<IO: AsyncRead + AsyncWrite + Unpin>(wire: &Shared<IO>) {
    let _ = tokio::time::timeout(CLOSE_WAIT, poll_fn(|cx| wire.poll_shutdown(cx))).await;
}

/// The header read timeout ran out: a client that sent part of a head gets `408
/// client_timeout` (logged and counted like every refused request) before the close; one
/// that sent nothing is closed silently. Best effort: a client that does not read gets
/// nothing.
async fn head_timed_out<IO: AsyncRead + AsyncWrite + Unpin>(
    wire: &Shared<IO>,
    partial: bool,
    ctx: &ConnCtx,
) {
    count_timeout(&ctx.shared, "header_read");
    if partial {
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            let mut out: &[u8] = crate::refused::HEAD_TIMEOUT_RESPONSE;
            while !out.is_empty() {
                let n = poll_fn(|cx| wire.poll_write_vectored(cx, &[std::io::IoSlice::new(out)]))
                    .await?;
                if n == 0 {
                    break;
                }
                out = &out[n..];
            }
            poll_fn(|cx| wire.poll_flush(cx)).await
        })
        .await;
        crate::refused::record(
            &ctx.shared,
            ctx.remote,
            "HTTP/1.1",
            crate::error::Cause::ClientTimeout,
            Some("header_read_timeout"),
        );
    }
    close(wire).await;
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Reads until `want` bytes wait in the read buffer.
    async fn read_until(wire: &Shared<TcpStream>, wbuf: &mut BytesMut, want: usize) {
        while wire.lock().rbuf.len() < want {
            let n = poll_fn(|cx| poll_read_head(wire, wbuf, cx)).await.unwrap();
            assert!(n > 0, "the client closed");
        }
    }

    /// One read attempt, without waiting.
    fn try_read(wire: &Shared<TcpStream>, wbuf: &mut BytesMut) -> Poll<std::io::Result<usize>> {
        poll_read_head(wire, wbuf, &mut Context::from_waker(Waker::noop()))
    }

    fn served_target(wire: &Shared<TcpStream>) -> String {
        match request::parse(&mut wire.lock().rbuf, 8192) {
            Parsed::Request(h) => h.request.uri().to_string(),
            _ => panic!("no complete request head"),
        }
    }

    #[tokio::test]
    async fn an_idle_connection_lets_go_of_its_buffers_and_keeps_a_partial_head() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let wire = Shared::new(server, BytesMut::new());
        let mut wbuf = BytesMut::new();

        // A request, and the start of a pipelined one.
        let first: &[u8] = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HT";
        client.write_all(first).await.unwrap();
        read_until(&wire, &mut wbuf, first.len()).await;
        assert_eq!(served_target(&wire), "/a");
        // As after writing a response.
        wbuf.reserve(16 * 1024);
        assert!(try_read(&wire, &mut wbuf).is_pending());
        assert_eq!(wbuf.capacity(), 0, "the write buffer is let go of");
        assert_eq!(
            &wire.lock().rbuf[..],
            b"GET /b HT",
            "the partial head stays"
        );

        let rest: &[u8] = b"TP/1.1\r\nHost: a\r\n\r\n";
        client.write_all(rest).await.unwrap();
        read_until(&wire, &mut wbuf, b"GET /b HT".len() + rest.len()).await;
        assert_eq!(served_target(&wire), "/b");
        wbuf.reserve(16 * 1024);
        assert!(wire.lock().rbuf.is_empty() && wire.lock().rbuf.capacity() > 0);
        // Nothing more comes: the connection is idle and holds no buffer.
        assert!(try_read(&wire, &mut wbuf).is_pending());
        assert_eq!(
            wire.lock().rbuf.capacity(),
            0,
            "the read buffer is let go of"
        );
        assert_eq!(wbuf.capacity(), 0, "the write buffer is let go of");

        // The next request is read into a fresh buffer.
        let next: &[u8] = b"GET /c HTTP/1.1\r\nHost: a\r\n\r\n";
        client.write_all(next).await.unwrap();
        read_until(&wire, &mut wbuf, next.len()).await;
        assert_eq!(served_target(&wire), "/c");
    }
}
