//! One request/response exchange on an HTTP/1.1 upstream connection that the request task
//! owns: the rewritten request head goes straight into a reusable buffer and out in one
//! vectored write with the body bytes already read; the response head is read and parsed
//! (`super::head`); the body is read by [`Reading`] as the downstream side asks for it,
//! while the rest of the request body keeps going out (an upstream may answer before it has
//! read the whole upload, and stream while it reads). No connection task, channel or
//! oneshot per request: the connection goes back to the pool when the response has ended.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http::{header, HeaderMap, Method, StatusCode};
use http_body::{Body, Frame};
use tokio::io::{AsyncRead, AsyncWrite};

use super::body::{BadBody, Decoder, Piece};
use super::head::{self, BadResponse, Head, Parsed};
use crate::body::ReqBody;
use crate::error::BoxError;

/// Read buffer growth step.
const READ_CHUNK: usize = 8 * 1024;

/// An upstream connection with its buffers. The buffers are the thread's (`crate::spare`):
/// taken when there is something to write or read, given back once the request has gone out
/// (the write buffer) and when the connection goes idle (both), so that an idle pooled
/// connection holds none, and a request writes its head into memory the thread has just
/// used rather than into its connection's own, gone cold while other requests were served.
pub struct Wire<T> {
    io: T,
    /// Read but not yet consumed: a partial head, or body bytes.
    rbuf: BytesMut,
    /// Where request heads and chunk-size lines are written. A head is written to the
    /// socket from here (`wbuf[sent..]`, ahead of `pend`); what is written here once something
    /// waits in `pend` is split off into it.
    wbuf: BytesMut,
    /// Of `wbuf`, the bytes that went out (0 when it is empty).
    sent: usize,
    /// Queued for the socket after `wbuf[sent..]`, in order.
    pend: VecDeque<Bytes>,
    /// A write went out that TLS may still hold in its buffer.
    need_flush: bool,
    /// The per-try timer, kept with the connection from one exchange to the next (see
    /// [`Wire::take_timer`]).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Wire<T> {
    /// A fresh connection.
    pub fn new(io: T) -> Self {
        Self {
            io,
            rbuf: BytesMut::new(),
            wbuf: BytesMut::new(),
            sent: 0,
            pend: VecDeque::new(),
            need_flush: false,
            timer: None,
        }
    }

    /// The connection's per-try timer, to go off at `due` or before it; give it back with
    /// [`Wire::keep_timer`], and see [`poll_timer`] for what going off early means. One timer
    /// per connection rather than one per try: a new timer is put into the runtime's timer
    /// wheel when first polled and taken out when dropped, on every request. A kept one is
    /// moved only when `due` is earlier than where it stands; request after request the
    /// deadline only moves later, so the timer is left where it is, goes off early at most
    /// once per try timeout, and is moved on then.
    pub fn take_timer(&mut self, due: tokio::time::Instant) -> Pin<Box<tokio::time::Sleep>> {
        match self.timer.take() {
            Some(mut timer) => {
                if timer.deadline() > due {
                    timer.as_mut().reset(due);
                }
                timer
            }
            None => Box::pin(tokio::time::sleep_until(due)),
        }
    }

    /// Keeps the per-try timer for the next exchange.
    pub fn keep_timer(&mut self, timer: Pin<Box<tokio::time::Sleep>>) {
        self.timer = Some(timer);
    }

    /// The stream, for a look at it while the connection is idle.
    pub fn io(&self) -> &T {
        &self.io
    }

    /// The stream, for a hand-over to another HTTP client; `None` if bytes were read ahead
    /// (they would be lost, so the connection is not handed over).
    pub fn into_io(self) -> Option<T> {
        self.is_clean().then_some(self.io)
    }

    /// Between two exchanges, nothing is pending either way.
    pub fn is_clean(&self) -> bool {
        self.rbuf.is_empty() && !self.queued()
    }

    /// Bytes wait to be written.
    fn queued(&self) -> bool {
        self.sent < self.wbuf.len() || !self.pend.is_empty()
    }

    /// Queues the bytes `put` writes after everything queued: in `wbuf` while nothing waits
    /// in `pend`, else split off into it.
    fn queue_with(&mut self, put: impl FnOnce(&mut BytesMut)) {
        if self.pend.is_empty() {
            put(self.wbuf());
            return;
        }
        if !self.wbuf.is_empty() {
            // What is left of the head goes ahead of the queue.
            let mut head = self.wbuf.split();
            head.advance(self.sent);
            self.sent = 0;
            self.pend.push_front(head.freeze());
        }
        put(self.wbuf());
        let added = self.wbuf.split().freeze();
        self.pend.push_back(added);
    }

    /// The write buffer: one of the thread's (`crate::spare`) when the connection holds none.
    fn wbuf(&mut self) -> &mut BytesMut {
        if self.wbuf.capacity() == 0 {
            self.wbuf = crate::spare::buffer();
        }
        &mut self.wbuf
    }

    /// Lets go of the buffers before the connection goes idle (`crate::spare::give_back`);
    /// bytes read ahead stay.
    pub fn release(&mut self) {
        if self.rbuf.is_empty() {
            crate::spare::give_back(&mut self.rbuf);
        }
        crate::spare::give_back(&mut self.wbuf);
        self.sent = 0;
    }

    /// Room for the next read: a buffer of the thread's when the connection holds none.
    fn read_room(&mut self) {
        crate::spare::read_room(&mut self.rbuf, READ_CHUNK / 2, READ_CHUNK);
    }
}

/// Polls a timer from [`Wire::take_timer`] for a try due at `due`: ready only once `due` has
/// come. A timer that went off at an earlier deadline it was left at is moved to `due` and
/// waits again.
pub fn poll_timer(
    timer: &mut Pin<Box<tokio::time::Sleep>>,
    due: tokio::time::Instant,
    cx: &mut Context<'_>,
) -> Poll<()> {
    while timer.as_mut().poll(cx).is_ready() {
        if timer.deadline() >= due {
            return Poll::Ready(());
        }
        timer.as_mut().reset(due);
    }
    Poll::Pending
}

/// Why an exchange failed before the response head was complete.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Reading or writing the socket failed.
    #[error("upstream connection failed: {0}")]
    Io(#[source] io::Error),
    /// The upstream closed the connection before a complete response head.
    #[error("the upstream closed the connection before a complete response head")]
    Closed,
    /// The response head is malformed or ambiguous.
    #[error(transparent)]
    Bad(#[from] BadResponse),
    /// The client's request body failed (timeout, limit, malformed).
    #[error("request body failed: {0}")]
    Body(#[source] BoxError),
}

/// How the request body goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enc {
    Length(u64),
    Chunked,
}

/// The request body on its way out, after the head.
pub struct Upload {
    body: Option<ReqBody>,
    enc: Enc,
    /// The request declared trailer fields (`Trailer`): only then are trailers sent.
    declared: bool,
    trailers: Option<HeaderMap>,
    /// The body ended and its last bytes are queued.
    finishing: bool,
    /// Every byte of the request went to the socket.
    done: bool,
    /// Writing failed or the body failed: the connection is not reused.
    broken: bool,
    write_error: Option<io::Error>,
    /// Some byte went to the socket.
    written_any: bool,
    /// A frame was taken from the client's body (beyond the one already read).
    took_any: bool,
}

impl Upload {
    /// The whole request was written.
    pub fn is_done(&self) -> bool {
        self.done
    }
}

/// What an exchange gives: the final response head, and the upload still going on.
pub struct Sent {
    /// The final response head.
    pub head: Head,
    /// The rest of the request body.
    pub upload: Upload,
}

/// The request an exchange sends, as the proxy made it.
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The request target.
    pub target: &'a PathAndQuery,
    /// The fields as received, sent first (`super::fields`); `headers` then holds only
    /// what upkeep inserted.
    pub(crate) received: Option<&'a super::fields::RawFields>,
    /// The header fields.
    pub headers: &'a HeaderMap,
    /// Fields upkeep adds, sent after `headers`.
    pub added: &'a crate::headers::Added,
    /// The response goes to upkeep's own HTTP/1 server, which takes its head as received
    /// when it qualifies (`head::RawHead`).
    pub raw_head: bool,
}

/// Writes the request head (and body bytes already read) to `wire`, then reads until a
/// final response head, skipping 1xx heads, while the body keeps going out. `body` is left
/// in place, untouched, when the exchange fails before any byte was written, so that the
/// request can be sent again on another connection; `written` says whether any byte went.
#[allow(clippy::manual_async_fn)] // an `async fn` keeps its arguments twice (`proxy::handle_with`)
pub fn exchange<'a, T: AsyncRead + AsyncWrite + Unpin>(
    wire: &'a mut Wire<T>,
    req: RequestHead<'a>,
    body: &'a mut Option<ReqBody>,
    written: &'a mut bool,
) -> impl std::future::Future<Output = Result<Box<Sent>, SendError>> + 'a {
    async move {
        let RequestHead {
            method,
            target,
            received,
            headers,
            added,
            raw_head,
        } = req;
        let head_request = *method == Method::HEAD;
        let mut b = body.take();
        // A bodyless request (most are) looks up neither `Content-Length` nor `Trailer`. Fields
        // kept as received have no `Transfer-Encoding`: a body there has its length.
        let enc = match (&b, received) {
            (None, _) => Enc::Length(0),
            (Some(_), Some(f)) => Enc::Length(f.length().unwrap_or(0)),
            (Some(_), None) => match headers.get(header::CONTENT_LENGTH) {
                Some(v) => Enc::Length(
                    std::str::from_utf8(v.as_bytes())
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .ok_or_else(|| SendError::Body("invalid Content-Length".into()))?,
                ),
                None => Enc::Chunked,
            },
        };
        write_head(
            wire,
            method,
            target,
            received,
            headers,
            added,
            enc == Enc::Chunked,
        );
        let declared = b.is_some() && headers.contains_key(header::TRAILER);
        let first = b.as_mut().and_then(ReqBody::take_first);
        let mut up = Upload {
            body: b,
            enc,
            declared,
            trailers: None,
            finishing: false,
            done: false,
            broken: false,
            write_error: None,
            written_any: false,
            took_any: false,
        };
        if let Some(f) = &first {
            if let Err(e) = up.encode(wire, f) {
                return Err(SendError::Body(e));
            }
        }
        if up.body.is_none() {
            up.finish(wire).map_err(SendError::Body)?;
            up.finishing = true;
        }
        let mut eof = false;
        let res = poll_fn(|cx| {
            // Until a read finds nothing in this poll: then the task is woken when more comes,
            // and reading again in this poll (the upload made progress) would find nothing
            // again.
            let mut may_read = true;
            loop {
                let mut progress = up.poll_upload(wire, cx)?;
                if may_read {
                    wire.read_room();
                    match tokio_util::io::poll_read_buf(Pin::new(&mut wire.io), cx, &mut wire.rbuf)
                    {
                        Poll::Ready(Ok(0)) => eof = true,
                        Poll::Ready(Ok(_)) => progress = true,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(SendError::Io(e))),
                        Poll::Pending => may_read = false,
                    }
                }
                // Nothing read yet (the first poll, as a rule): nothing to parse.
                while !wire.rbuf.is_empty() {
                    match head::parse_scratch(&mut wire.rbuf, head_request, raw_head)? {
                        Parsed::Partial => break,
                        // 101 to a request that asked no upgrade: nothing can follow it here.
                        Parsed::Informational(s, _) if s == StatusCode::SWITCHING_PROTOCOLS => {
                            return Poll::Ready(Err(SendError::Bad(BadResponse(
                                "101 Switching Protocols to a request without Upgrade",
                            ))))
                        }
                        // 100 Continue (nobody waits for it here: the body is already going),
                        // 102, 103: skipped, as hyper does.
                        Parsed::Informational(..) => continue,
                        Parsed::Final(h, _) => return Poll::Ready(Ok(h)),
                    }
                }
                if eof {
                    return Poll::Ready(Err(up
                        .write_error
                        .take()
                        .map_or(SendError::Closed, SendError::Io)));
                }
                if !progress {
                    return Poll::Pending;
                }
            }
        })
        .await;
        *written = up.written_any;
        match res {
            // On the heap: the head and the upload (352 bytes) go up through the attempt's
            // polls as a pointer.
            Ok(head) => Ok(Box::new(Sent { head, upload: up })),
            Err(e) => {
                if !up.written_any && !up.took_any {
                    // Nothing went out: the body is whole again for another connection.
                    if let Some(mut b) = up.body.take() {
                        if let Some(f) = first {
                            b.restore_first(f);
                        }
                        *body = Some(b);
                    }
                }
                Err(e)
            }
        }
    }
}

/// `METHOD target HTTP/1.1`, the header fields as they are, and the body's framing.
fn write_head<T>(
    wire: &mut Wire<T>,
    method: &Method,
    target: &PathAndQuery,
    received: Option<&super::fields::RawFields>,
    headers: &HeaderMap,
    added: &crate::headers::Added,
    chunked: bool,
) {
    let target = target.as_str();
    let lines = received.map_or(&[][..], super::fields::RawFields::lines);
    debug_assert!(!wire.queued(), "a head is written between two exchanges");
    let w = wire.wbuf();
    w.reserve(64 + target.len() + lines.len() + (headers.len() + 3) * 32);
    w.put_slice(method.as_str().as_bytes());
    w.put_u8(b' ');
    w.put_slice(target.as_bytes());
    w.put_slice(b" HTTP/1.1\r\n");
    w.put_slice(lines);
    let fields = headers.iter().map(|(n, v)| (n, v.as_bytes()));
    for (name, value) in fields.chain(added.iter()) {
        w.put_slice(name.as_str().as_bytes());
        w.put_slice(b": ");
        w.put_slice(value);
        w.put_slice(b"\r\n");
    }
    if chunked {
        w.put_slice(b"transfer-encoding: chunked\r\n");
    }
    w.put_slice(b"\r\n");
    // Written to the socket from `wbuf` (`Upload::poll_send`).
}

impl Upload {
    /// Queues one frame of the client's body, framed for the upstream.
    fn encode<T>(&mut self, wire: &mut Wire<T>, frame: &Frame<Bytes>) -> Result<(), BoxError> {
        if let Some(data) = frame.data_ref() {
            if data.is_empty() {
                return Ok(());
            }
            match &mut self.enc {
                Enc::Length(left) => {
                    let n = data.len() as u64;
                    if n > *left {
                        return Err("request body longer than its Content-Length".into());
                    }
                    *left -= n;
                    wire.pend.push_back(data.clone());
                }
                Enc::Chunked => {
                    wire.queue_with(|w| crate::h1::put_chunk_size(w, data.len()));
                    wire.pend.push_back(data.clone());
                    wire.pend.push_back(Bytes::from_static(b"\r\n"));
                }
            }
        } else if let Some(t) = frame.trailers_ref() {
            if self.enc == Enc::Chunked && self.declared {
                self.trailers = Some(t.clone());
            }
        }
        Ok(())
    }

    /// The body ended: the last chunk (with declared trailers), or a check of the length.
    fn finish<T>(&mut self, wire: &mut Wire<T>) -> Result<(), BoxError> {
        match self.enc {
            Enc::Length(0) => Ok(()),
            Enc::Length(_) => Err("request body shorter than its Content-Length".into()),
            Enc::Chunked => {
                let trailers = self.trailers.take();
                wire.queue_with(|w| {
                    w.put_slice(b"0\r\n");
                    for (name, value) in trailers.iter().flatten() {
                        w.put_slice(name.as_str().as_bytes());
                        w.put_slice(b": ");
                        w.put_slice(value.as_bytes());
                        w.put_slice(b"\r\n");
                    }
                    w.put_slice(b"\r\n");
                });
                Ok(())
            }
        }
    }

    /// Moves the upload on: writes what is queued, then takes the next body frame. `Ok(true)`
    /// when something moved. A write error stops the upload (the response may still come:
    /// an upstream that refuses an upload answers and closes); a body error fails it.
    #[inline]
    fn poll_upload<T: AsyncWrite + Unpin>(
        &mut self,
        wire: &mut Wire<T>,
        cx: &mut Context<'_>,
    ) -> Result<bool, SendError> {
        // Once every byte went out (after the first poll, for a bodiless request) there is
        // nothing to move: no call, for each of the exchange's and the body's later polls.
        if self.done {
            return Ok(false);
        }
        self.poll_send(wire, cx)
    }

    /// The work of [`Upload::poll_upload`].
    pub fn poll_send<T: AsyncWrite + Unpin>(
        &mut self,
        wire: &mut Wire<T>,
        cx: &mut Context<'_>,
    ) -> Result<bool, SendError> {
        let mut progress = false;
        loop {
            if self.broken {
                return Ok(progress);
            }
            while wire.queued() {
                let mut slices = [IoSlice::new(&[]); 16];
                let k = super::write_slices(&mut slices, &wire.wbuf[wire.sent..], wire.pend.iter());
                match Pin::new(&mut wire.io).poll_write_vectored(cx, &slices[..k]) {
                    Poll::Ready(Ok(0)) => {
                        self.fail_write(io::ErrorKind::WriteZero.into());
                        return Ok(true);
                    }
                    Poll::Ready(Ok(mut n)) => {
                        progress = true;
                        self.written_any = true;
                        wire.need_flush = true;
                        let of_head = n.min(wire.wbuf.len() - wire.sent);
                        wire.sent += of_head;
                        n -= of_head;
                        if wire.sent == wire.wbuf.len() {
                            wire.wbuf.clear();
                            wire.sent = 0;
                        }
                        while n > 0 {
                            let front = wire.pend.front_mut().expect("written bytes were queued");
                            if n >= front.len() {
                                n -= front.len();
                                wire.pend.pop_front();
                            } else {
                                front.advance(n);
                                n = 0;
                            }
                        }
                    }
                    Poll::Ready(Err(e)) => {
                        self.fail_write(e);
                        return Ok(true);
                    }
                    Poll::Pending => return Ok(progress),
                }
            }
            if wire.need_flush {
                match Pin::new(&mut wire.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => wire.need_flush = false,
                    Poll::Ready(Err(e)) => {
                        self.fail_write(e);
                        return Ok(true);
                    }
                    Poll::Pending => return Ok(progress),
                }
            }
            if self.done || self.finishing {
                // Everything queued is written: the request is complete, and the write buffer
                // goes back to the thread for the next request's head.
                self.done = true;
                crate::spare::give_back(&mut wire.wbuf);
                return Ok(progress);
            }
            let Some(body) = self.body.as_mut() else {
                self.done = true;
                return Ok(progress);
            };
            match Pin::new(body).poll_frame(cx) {
                Poll::Pending => return Ok(progress),
                Poll::Ready(Some(Err(e))) => {
                    self.broken = true;
                    return Err(SendError::Body(e));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    self.took_any = true;
                    progress = true;
                    if let Err(e) = self.encode(wire, &frame) {
                        self.broken = true;
                        return Err(SendError::Body(e));
                    }
                }
                Poll::Ready(None) => {
                    progress = true;
                    self.body = None;
                    if let Err(e) = self.finish(wire) {
                        self.broken = true;
                        return Err(SendError::Body(e));
                    }
                    // Done once the last bytes are written, next round.
                    self.finishing = true;
                }
            }
        }
    }

    fn fail_write(&mut self, e: io::Error) {
        self.broken = true;
        self.write_error = Some(e);
    }
}

/// The response body as it is read from the connection.
pub struct Reading {
    decoder: Decoder,
    upload: Upload,
    keep_alive: bool,
}

/// What reading the body gave.
pub enum Read {
    /// A frame for the downstream side.
    Frame(Frame<Bytes>),
    /// The body ended; `reusable` says whether the connection may take another request.
    End {
        /// Nothing is left over either way and the upstream allows reuse.
        reusable: bool,
    },
}

/// The body failed: truncated, malformed, or the connection failed.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Malformed or truncated.
    #[error(transparent)]
    Bad(#[from] BadBody),
    /// The socket failed.
    #[error("upstream connection failed inside the response body: {0}")]
    Io(#[source] io::Error),
    /// The client's request body failed while the response streamed.
    #[error("request body failed: {0}")]
    Upload(#[source] BoxError),
}

impl Reading {
    /// Reads the body of the response that `sent` began.
    pub fn new(sent: Box<Sent>) -> (Head, Self) {
        let Sent { head, upload } = *sent;
        let reading = Self {
            decoder: Decoder::new(head.framing),
            upload,
            keep_alive: head.keep_alive,
        };
        (head, reading)
    }

    /// Nothing more comes: the body has ended, or ends without another read.
    pub fn at_end(&self) -> bool {
        self.decoder.at_end()
    }

    /// The body is over, the request fully sent, nothing left over, and the upstream allows
    /// another request: the connection may go back to the pool.
    pub fn ended_cleanly<T>(&self, wire: &Wire<T>) -> bool {
        self.decoder.at_end()
            && self.keep_alive
            && self.upload.done
            && !self.upload.broken
            && wire.is_clean()
    }

    /// Bytes still expected, when known.
    pub fn remaining(&self) -> Option<u64> {
        self.decoder.remaining()
    }

    /// The next frame, or the end.
    pub fn poll_read<T: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        wire: &mut Wire<T>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Read, BodyError>> {
        // The upload goes on while the response streams (an echoing upstream needs it).
        if let Err(e) = self.upload.poll_upload(wire, cx) {
            return Poll::Ready(Err(match e {
                SendError::Body(b) => BodyError::Upload(b),
                SendError::Io(e) => BodyError::Io(e),
                other => BodyError::Upload(Box::new(other)),
            }));
        }
        loop {
            match self.decoder.decode(&mut wire.rbuf)? {
                Some(Piece::Data(d)) => return Poll::Ready(Ok(Read::Frame(Frame::data(d)))),
                Some(Piece::Trailers(t)) => {
                    return Poll::Ready(Ok(Read::Frame(Frame::trailers(t))))
                }
                Some(Piece::End) => {
                    let reusable = self.ended_cleanly(wire);
                    return Poll::Ready(Ok(Read::End { reusable }));
                }
                None => {}
            }
            wire.read_room();
            match tokio_util::io::poll_read_buf(Pin::new(&mut wire.io), cx, &mut wire.rbuf) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(match self.decoder.eof()? {
                        Piece::End => Ok(Read::End { reusable: false }),
                        _ => Err(BodyError::Bad(BadBody("unexpected end"))),
                    })
                }
                Poll::Ready(Ok(_)) => continue,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(BodyError::Io(e))),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// Sends a bodyless GET on `wire` and answers it with `response` from `server`.
    async fn get(wire: &mut Wire<TcpStream>, server: &mut TcpStream, response: &[u8]) -> Head {
        let (method, target) = (Method::GET, PathAndQuery::from_static("/a"));
        let headers = HeaderMap::new();
        let added = crate::headers::Added::default();
        let req = RequestHead {
            method: &method,
            target: &target,
            received: None,
            headers: &headers,
            added: &added,
            raw_head: false,
        };
        let (mut body, mut written) = (None, false);
        let answer = async {
            let mut buf = [0u8; 1024];
            let mut got = Vec::new();
            while !got.ends_with(b"\r\n\r\n") {
                let n = server.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request head did not come");
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got.starts_with(b"GET /a HTTP/1.1\r\n"));
            server.write_all(response).await.unwrap();
        };
        let (sent, ()) = tokio::join!(exchange(wire, req, &mut body, &mut written), answer);
        let sent = sent.unwrap();
        assert!(written && sent.upload.is_done());
        sent.head
    }

    #[tokio::test]
    async fn an_idle_upstream_connection_holds_no_buffer_and_keeps_what_it_read_ahead() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let mut wire = Wire::new(client);

        // The request went out: the write buffer is already back with the thread.
        let head = get(&mut wire, &mut server, b"HTTP/1.1 204 No Content\r\n\r\n").await;
        assert_eq!(head.status, StatusCode::NO_CONTENT);
        assert_eq!(wire.wbuf.capacity(), 0);
        assert!(wire.rbuf.is_empty() && wire.rbuf.capacity() > 0);
        wire.release();
        assert_eq!((wire.rbuf.capacity(), wire.wbuf.capacity()), (0, 0));

        // Bytes read ahead (here a body, left unread) stay through `release`.
        let head = get(
            &mut wire,
            &mut server,
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        )
        .await;
        assert_eq!(head.status, StatusCode::OK);
        wire.release();
        assert_eq!(&wire.rbuf[..], b"ok");
        assert_eq!(wire.wbuf.capacity(), 0);
    }

    #[test]
    fn a_read_buffer_without_room_gets_room_and_keeps_what_it_holds() {
        let mut wire = Wire::new(());
        // What is left of a write buffer once a head was split off: small, empty, and
        // sharing its allocation with the head.
        let mut rest = BytesMut::with_capacity(256);
        rest.put_slice(b"GET / HTTP/1.1\r\nhost: a.test\r\n\r\n");
        let head = rest.split().freeze();
        wire.rbuf = rest;
        wire.read_room();
        assert!(wire.rbuf.is_empty());
        assert!(
            wire.rbuf.capacity() >= READ_CHUNK,
            "{}",
            wire.rbuf.capacity()
        );
        assert_eq!(&head[..4], b"GET ", "the head's bytes are untouched");

        // A buffer holding bytes read ahead keeps them as it grows.
        let mut held = BytesMut::with_capacity(64);
        held.put_slice(b"HTTP/1.1 200 OK\r\n");
        wire.rbuf = held;
        wire.read_room();
        assert_eq!(&wire.rbuf[..], b"HTTP/1.1 200 OK\r\n");
        assert!(wire.rbuf.capacity() - wire.rbuf.len() >= READ_CHUNK / 2);
    }
}
