//! Request and response bodies: streamed frame by frame, never buffered whole.

pub mod down;
mod progress;
mod replay;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::error::{BoxError, Cut};
use crate::pool::Checkin;

pub use down::DownBody;
pub use progress::SendProgress;
pub use replay::{Replay, REPLAY_LIMIT};

/// The client sent nothing inside its request body for `client_body_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the client sent nothing inside its request body for {0:?} (client_body_timeout)")]
pub struct ClientBodyTimeout(pub Duration);

/// The request body passed the route's `max_body_bytes` while it streamed.
#[derive(Debug, thiserror::Error)]
#[error("the request body is larger than {0} bytes (max_body_bytes)")]
pub struct BodyTooLarge(pub u64);

/// A silence timer: armed when a wait starts, disarmed by progress; one allocation per body.
#[derive(Default)]
struct Silence {
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl Silence {
    /// Polls the timer for a wait that began now or earlier; ready once `limit` has passed.
    fn poll_expired(&mut self, cx: &mut Context<'_>, limit: Duration) -> bool {
        if !self.armed {
            self.armed = true;
            let at = Instant::now() + limit;
            match &mut self.timer {
                Some(t) => t.as_mut().reset(at),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        self.timer
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
    }

    fn progress(&mut self) {
        self.armed = false;
    }
}

/// The body sent upstream: empty, or the client's body with its first frame already read
/// (so a malformed first chunk is refused before any upstream sees the request).
pub enum ReqBody {
    /// No body.
    Empty,
    /// The client's body.
    Stream(Box<StreamBody>),
    /// The client's body behind `Expect: 100-continue`: not read until the upstream asks for
    /// it (`crate::expect`).
    Gated(Box<StreamBody>, crate::expect::Waiter),
    /// The client's body, kept as it goes out so that it can be sent again (HTTP/2 refusals).
    Replay(Replay),
}

/// The client's body on its way upstream, with its silence timer.
pub struct StreamBody {
    first: Option<Frame<Bytes>>,
    rest: DownBody,
    seen: Arc<AtomicU64>,
    timeout: Duration,
    silence: Silence,
    progress: Arc<SendProgress>,
    /// Most body bytes passed on (`max_body_bytes`); the body fails past it.
    limit: Option<u64>,
}

impl ReqBody {
    /// The client's body: `first` already read, `seen` counts bytes passed on, and a silence
    /// of `timeout` inside it fails the body with `ClientBodyTimeout`.
    pub fn stream(
        first: Frame<Bytes>,
        rest: DownBody,
        seen: Arc<AtomicU64>,
        timeout: Duration,
    ) -> Self {
        ReqBody::Stream(Box::new(StreamBody {
            first: Some(first),
            rest,
            seen,
            timeout,
            silence: Silence::default(),
            progress: Arc::new(SendProgress::new()),
            limit: None,
        }))
    }

    /// The client's body, none of it read yet, sent only once the upstream asks for it
    /// (`Expect: 100-continue`, see `crate::expect`).
    pub fn gated(rest: DownBody, seen: Arc<AtomicU64>, timeout: Duration) -> Self {
        ReqBody::Gated(
            Box::new(StreamBody {
                first: None,
                rest,
                seen,
                timeout,
                silence: Silence::default(),
                progress: Arc::new(SendProgress::new()),
                limit: None,
            }),
            crate::expect::Waiter::new(),
        )
    }

    /// Fails the body with [`BodyTooLarge`] once more than `limit` bytes have passed, so an
    /// upstream never gets more than the limit, whatever the framing (chunked, HTTP/2 data).
    pub fn with_limit(mut self, limit: Option<u64>) -> Self {
        if let ReqBody::Stream(s) | ReqBody::Gated(s, _) = &mut self {
            s.limit = limit;
        }
        self
    }

    /// How the sending is going (`None` without a body).
    pub fn progress(&self) -> Option<Arc<SendProgress>> {
        match self {
            ReqBody::Empty => None,
            ReqBody::Stream(s) | ReqBody::Gated(s, _) => Some(s.progress.clone()),
            ReqBody::Replay(r) => r.progress(),
        }
    }

    /// The first frame, already read, taken to go out with the request head (`crate::h1`).
    /// Counted as passed on, as `poll_frame` counts it (its size was checked against the
    /// limit when it was read).
    pub(crate) fn take_first(&mut self) -> Option<Frame<Bytes>> {
        let ReqBody::Stream(s) = self else {
            return None;
        };
        let frame = s.first.take()?;
        s.silence.progress();
        s.progress.handed_over();
        if let Some(d) = frame.data_ref() {
            s.seen.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
        Some(frame)
    }

    /// Puts back the frame `take_first` gave, when none of it was sent.
    pub(crate) fn restore_first(&mut self, frame: Frame<Bytes>) {
        if let ReqBody::Stream(s) = self {
            if let Some(d) = frame.data_ref() {
                s.seen.fetch_sub(d.len() as u64, Ordering::Relaxed);
            }
            s.first = Some(frame);
        }
    }

    /// The `Expect: 100-continue` gate of a gated body.
    pub fn gate(&self) -> Option<Arc<crate::expect::Gate>> {
        match self {
            ReqBody::Gated(_, w) => Some(w.gate()),
            _ => None,
        }
    }
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let s = match self.get_mut() {
            ReqBody::Empty => return Poll::Ready(None),
            ReqBody::Replay(r) => return r.poll_frame(cx),
            ReqBody::Stream(s) => s,
            ReqBody::Gated(s, waiter) => {
                if let Err(e) = ready!(waiter.poll_open(cx)) {
                    return Poll::Ready(Some(Err(e)));
                }
                s
            }
        };
        let frame = match s.first.take() {
            Some(f) => Some(Ok(f)),
            None => match Pin::new(&mut s.rest).poll_frame(cx) {
                Poll::Ready(f) => f,
                Poll::Pending => {
                    s.progress.waiting_for_client();
                    if s.silence.poll_expired(cx, s.timeout) {
                        return Poll::Ready(Some(Err(ClientBodyTimeout(s.timeout).into())));
                    }
                    return Poll::Pending;
                }
            },
        };
        s.silence.progress();
        s.progress.handed_over();
        if let Some(d) = frame
            .as_ref()
            .and_then(|f| f.as_ref().ok())
            .and_then(|f| f.data_ref())
        {
            let n = d.len() as u64;
            let total = s.seen.fetch_add(n, Ordering::Relaxed) + n;
            if let Some(max) = s.limit.filter(|max| total > *max) {
                return Poll::Ready(Some(Err(BodyTooLarge(max).into())));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Empty => true,
            ReqBody::Stream(s) | ReqBody::Gated(s, _) => {
                s.first.is_none() && s.rest.is_end_stream()
            }
            ReqBody::Replay(r) => r.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Empty => SizeHint::with_exact(0),
            ReqBody::Replay(_) => SizeHint::new(),
            ReqBody::Stream(s) | ReqBody::Gated(s, _) => {
                let h = s.rest.size_hint();
                let n = s
                    .first
                    .as_ref()
                    .and_then(|f| f.data_ref())
                    .map_or(0, |d| d.len() as u64);
                let mut out = SizeHint::new();
                // Upper before lower: SizeHint asserts lower <= upper on every set.
                if let Some(u) = h.upper() {
                    out.set_upper(u + n);
                }
                out.set_lower(h.lower() + n);
                out
            }
        }
    }
}

/// The upstream sent nothing inside its response body for `read_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent nothing inside its response body for {0:?} (read_timeout)")]
pub struct UpstreamReadTimeout(pub Duration);

/// Called once when a response body ends or is dropped, with the bytes sent, whether it
/// completed, and why upkeep cut it, if it did.
pub trait OnDone: Send + 'static {
    /// The body is finished (or abandoned).
    fn done(self: Box<Self>, bytes: u64, complete: bool, cut: Option<Cut>);
}

/// The body sent downstream.
pub struct RespBody {
    inner: Inner,
    bytes: u64,
    complete: bool,
    cut: Option<Cut>,
    on_done: Option<Box<dyn OnDone>>,
    /// A gRPC call's deadline (`grpc-timeout`, a route's or group's `deadline`), for the
    /// whole call: at it the upstream stream is dropped (reset) and the call ends with
    /// `DEADLINE_EXCEEDED` trailers.
    call_deadline: Option<Pin<Box<Sleep>>>,
    /// The handler wants the connection's `Keep-Alive: timeout=N` said with this response,
    /// and left it to upkeep's own HTTP/1 server to write (no field in the map).
    keepalive_hint: bool,
}

enum Inner {
    Full(Option<Bytes>),
    /// Read by upkeep's own HTTP/1 codec from the connection it arrived on.
    Own {
        body: Box<crate::h1::Streaming>,
        read_timeout: Duration,
        silence: Silence,
    },
    /// Read by hyper's client (HTTP/2 upstreams, a body gated on `100 Continue`). Boxed: the
    /// common case is `Own`, and every move of a response (a dozen per request, up through
    /// the handler's futures) copies the largest variant.
    Upstream(Box<Upstream>),
}

struct Upstream {
    body: Incoming,
    checkin: Option<Checkin>,
    read_timeout: Duration,
    silence: Silence,
}

impl RespBody {
    /// A body made by upkeep itself.
    pub fn full(data: impl Into<Bytes>) -> Self {
        Self::new(Inner::Full(Some(data.into())))
    }

    /// An empty body.
    pub fn empty() -> Self {
        Self::new(Inner::Full(None))
    }

    /// An upstream body; at its end the connection goes back to the pool. A silence of
    /// `read_timeout` inside it cuts it (and so the client's connection, as nginx does).
    pub(crate) fn upstream(
        body: Incoming,
        checkin: Option<Checkin>,
        read_timeout: Duration,
    ) -> Self {
        Self::new(Inner::Upstream(Box::new(Upstream {
            body,
            checkin,
            read_timeout,
            silence: Silence::default(),
        })))
    }

    /// An upstream body read by upkeep's own HTTP/1 codec; the connection goes back to the
    /// pool at its end. A silence of `read_timeout` inside it cuts it.
    pub(crate) fn own(body: Box<crate::h1::Streaming>, read_timeout: Duration) -> Self {
        Self::new(Inner::Own {
            body,
            read_timeout,
            silence: Silence::default(),
        })
    }

    /// The upstream's response head as received, when upkeep's own HTTP/1 client kept it
    /// that way for the own HTTP/1 server (`crate::h1::head::RawHead`); taken once.
    pub(crate) fn take_raw_head(&mut self) -> Option<crate::h1::head::RawHead> {
        match &mut self.inner {
            Inner::Own { body, .. } => body.take_raw_head(),
            _ => None,
        }
    }

    fn new(inner: Inner) -> Self {
        Self {
            inner,
            bytes: 0,
            complete: false,
            cut: None,
            on_done: None,
            call_deadline: None,
            keepalive_hint: false,
        }
    }

    /// Ends an upstream body at `at` when it is still streaming then: the upstream stream is
    /// dropped (HTTP/2: reset with `CANCEL`) and the client gets gRPC `DEADLINE_EXCEEDED`
    /// trailers, since the response head has already gone.
    pub(crate) fn with_call_deadline(mut self, at: Instant) -> Self {
        if matches!(self.inner, Inner::Upstream(_)) {
            self.call_deadline = Some(Box::pin(tokio::time::sleep_until(at)));
        }
        self
    }

    /// Registers what happens when the body is finished.
    /// Asks upkeep's own HTTP/1 server to say the connection's `Keep-Alive: timeout=N` with
    /// this response (where a map would have carried the field: after the others).
    pub(crate) fn hint_keepalive(&mut self) {
        self.keepalive_hint = true;
    }

    /// Whether the own HTTP/1 server is to say `Keep-Alive: timeout=N`.
    pub(crate) fn keepalive_hinted(&self) -> bool {
        self.keepalive_hint
    }

    pub fn on_done(&mut self, f: Box<dyn OnDone>) {
        self.on_done = Some(f);
    }
}

impl Drop for RespBody {
    fn drop(&mut self) {
        // hyper stops polling once a length-delimited body is fully sent, so "ended" is
        // also "nothing left to read".
        let ended = match &self.inner {
            Inner::Full(d) => d.is_none(),
            Inner::Upstream(u) => u.body.is_end_stream(),
            Inner::Own { body, .. } => body.is_end_stream(),
        };
        if let Inner::Own { body, .. } = &mut self.inner {
            body.finish_on_drop();
        }
        self.complete |= ended;
        if let Inner::Upstream(u) = &mut self.inner {
            if u.body.is_end_stream() {
                if let Some(c) = u.checkin.take() {
                    c.finish_later();
                }
            }
        }
        if let Some(f) = self.on_done.take() {
            f.done(self.bytes, self.complete, self.cut);
        }
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let res = match &mut this.inner {
            Inner::Full(data) => data.take().map(|d| Ok(Frame::data(d))),
            Inner::Own {
                body,
                read_timeout,
                silence,
            } => {
                let polled = body.poll_frame(cx);
                if polled.is_pending() {
                    if silence.poll_expired(cx, *read_timeout) {
                        // The connection is dropped, never reused.
                        body.abandon();
                        this.cut = Some(Cut::UpstreamReadTimeout);
                        return Poll::Ready(Some(Err(Box::new(UpstreamReadTimeout(
                            *read_timeout,
                        )))));
                    }
                    return Poll::Pending;
                }
                silence.progress();
                ready!(polled)
            }
            Inner::Upstream(u) => {
                let Upstream {
                    body,
                    checkin,
                    read_timeout,
                    silence,
                } = &mut **u;
                if let Some(t) = &mut this.call_deadline {
                    if t.as_mut().poll(cx).is_ready() {
                        this.call_deadline = None;
                        // Dropping the upstream body (and its stream's claim) resets the
                        // upstream stream: the backend stops working on a call nobody waits for.
                        this.inner = Inner::Full(None);
                        this.cut = Some(Cut::CallDeadline);
                        return Poll::Ready(Some(Ok(Frame::trailers(
                            crate::grpc::deadline_trailers(),
                        ))));
                    }
                }
                let polled = Pin::new(&mut *body).poll_frame(cx);
                if polled.is_pending() {
                    if silence.poll_expired(cx, *read_timeout) {
                        // The upstream connection is dropped with the ticket, never reused.
                        checkin.take();
                        this.cut = Some(Cut::UpstreamReadTimeout);
                        return Poll::Ready(Some(Err(Box::new(UpstreamReadTimeout(
                            *read_timeout,
                        )))));
                    }
                    return Poll::Pending;
                }
                silence.progress();
                match ready!(polled) {
                    Some(Ok(f)) => Some(Ok(f)),
                    Some(Err(e)) => {
                        checkin.take();
                        Some(Err(e.into()))
                    }
                    None => {
                        if let Some(c) = checkin.take() {
                            c.finish(cx);
                        }
                        None
                    }
                }
            }
        };
        match &res {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    this.bytes += d.len() as u64;
                }
            }
            None => this.complete = true,
            Some(Err(_)) => {}
        }
        Poll::Ready(res)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full(d) => d.is_none(),
            // Polled to the end even when empty, so the connection returns to the pool (an
            // HTTP/2 stream returns nothing: its end is told at once, so that a Trailers-Only
            // gRPC answer stays one HEADERS frame).
            Inner::Upstream(u) => {
                u.checkin.as_ref().is_none_or(|c| !c.returns_to_pool()) && u.body.is_end_stream()
            }
            Inner::Own { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(Some(d)) => SizeHint::with_exact(d.len() as u64),
            Inner::Full(None) => SizeHint::with_exact(0),
            Inner::Upstream(u) => u.body.size_hint(),
            Inner::Own { body, .. } => match body.remaining() {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::new(),
            },
        }
    }
}
