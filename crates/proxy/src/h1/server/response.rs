//! Writes a response to the downstream client: the status line always `HTTP/1.1` (RFC 9110
//! §6.2: a server sends its own version, also to an HTTP/1.0 client), the header fields, the
//! body framed as it dictates (`Content-Length`, `chunked`, or until the close for an
//! HTTP/1.0 client), no body for HEAD, 204 and 304, trailers to a client that sent
//! `TE: trailers` (all the upstream sent, declared or not). The head goes out with the body bytes already at hand in one write
//! (`crate::h1::poll_write_gathered`). The framing rules are hyper's server's, so clients see what they saw before; hyper's
//! server sent only the trailer fields named in `Trailer`.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::StatusCode;
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};

use super::wire::Shared;
use crate::headers::KEEP_ALIVE;
use crate::listener::ConnActivity;

/// What the writer needs to know of the request the response answers.
pub(crate) struct Answering<'a> {
    /// The response may leave the connection open (the client and the drain rules allow it).
    pub keep_alive: bool,
    /// The client speaks HTTP/1.0: no chunked body; keep-alive said with `Connection`.
    pub http10: bool,
    /// A `HEAD` request.
    pub head_method: bool,
    /// The client sent `TE: trailers`.
    pub accepts_trailers: bool,
    /// The connection's `Keep-Alive` value (`timeout=N`), said when the handler asks for it
    /// (`RespBody::keepalive_hinted`).
    pub keepalive: &'a HeaderValue,
}

/// How the body goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enc {
    Length(u64),
    Chunked,
    /// Until the connection closes.
    Close,
}

/// What is known of the body's length before it is read (hyper's `BodyLength`).
#[derive(Clone, Copy)]
enum Known {
    None,
    Exact(u64),
    Unknown,
}

/// Whether an upstream trailer field may go on in the chunked trailer section. Every field
/// passes, declared in `Trailer` or not (an HTTP/2 upstream declares none ahead: gRPC's
/// custom trailing metadata is only known at the end), except those that frame, route or
/// belong to one hop (RFC 9110 §6.5.1), which a trailer section must not carry.
fn fit_for_trailer(name: &HeaderName) -> bool {
    !matches!(
        *name,
        header::CONTENT_LENGTH
            | header::TRANSFER_ENCODING
            | header::TRAILER
            | header::HOST
            | header::CONNECTION
            | header::TE
            | header::UPGRADE
    ) && name != "keep-alive"
        && name != "proxy-connection"
}

/// The per-second `Date` value, made once a second per serving thread.
fn date(out: &mut BytesMut) {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs || d.1.is_empty() {
            *d = (secs, httpdate::fmt_http_date(now));
        }
        out.put_slice(d.1.as_bytes());
    });
}

/// The response head's fields on their way out, and what they decided.
struct Fields<'a> {
    /// The body's framing, once a field set it.
    enc: Option<Enc>,
    wrote_date: bool,
    /// The `Connection` values, said together at the end.
    connection: BytesMut,
    te_chunked_last: bool,
    /// A `transfer-encoding` line is open (more codings may join it).
    te_written: bool,
    keep_alive: bool,
    known: Known,
    req: &'a Answering<'a>,
    can_chunk: bool,
}

impl Fields<'_> {
    /// Writes one field, or takes what it says (framing, `Connection`) for the end of the
    /// head.
    fn put(&mut self, wbuf: &mut BytesMut, name: &HeaderName, value: &[u8]) -> io::Result<()> {
        match *name {
            header::CONTENT_LENGTH => {
                if self.enc.is_some() && !matches!(self.enc, Some(Enc::Length(_))) {
                    return Ok(());
                }
                match self.known {
                    Known::Exact(n) => {
                        if self.enc.is_some() {
                            return Ok(());
                        }
                        self.enc = Some(Enc::Length(n));
                    }
                    Known::Unknown => {
                        if self.enc.is_some() {
                            return Ok(());
                        }
                        let Some(n) = std::str::from_utf8(value)
                            .ok()
                            .and_then(|v| v.trim().parse::<u64>().ok())
                        else {
                            return Err(io::Error::other("invalid Content-Length in a response"));
                        };
                        self.enc = Some(Enc::Length(n));
                    }
                    // No body: the field stays only on a response to HEAD.
                    Known::None if !self.req.head_method => return Ok(()),
                    Known::None => self.enc = Some(Enc::Length(0)),
                }
            }
            header::TRANSFER_ENCODING => {
                if self.req.http10 || !self.can_chunk || matches!(self.enc, Some(Enc::Length(_))) {
                    return Ok(());
                }
                self.enc = Some(Enc::Chunked);
                self.te_chunked_last = value
                    .rsplit(|&b| b == b',')
                    .next()
                    .is_some_and(|t| crate::h1::head::trim_ows(t).eq_ignore_ascii_case(b"chunked"));
                wbuf.put_slice(if self.te_written {
                    &b", "[..]
                } else {
                    &b"transfer-encoding: "[..]
                });
                wbuf.put_slice(value);
                self.te_written = true;
                return Ok(());
            }
            header::CONNECTION => {
                for t in value.split(|&b| b == b',') {
                    if crate::h1::head::trim_ows(t).eq_ignore_ascii_case(b"close") {
                        self.keep_alive = false;
                    }
                }
                if !self.connection.is_empty() {
                    self.connection.put_slice(b", ");
                }
                self.connection.put_slice(value);
                return Ok(());
            }
            header::DATE => self.wrote_date = true,
            header::TRAILER if self.req.http10 || !self.can_chunk => return Ok(()),
            _ => {}
        }
        if self.te_written {
            // The transfer-encoding line is ended before any other field.
            if !self.te_chunked_last {
                wbuf.put_slice(b", chunked");
            }
            wbuf.put_slice(b"\r\n");
            self.te_written = false;
            self.te_chunked_last = true;
        }
        wbuf.put_slice(name.as_str().as_bytes());
        wbuf.put_slice(b": ");
        wbuf.put_slice(value);
        wbuf.put_slice(b"\r\n");
        Ok(())
    }
}

/// The longest chunk-size line written: 16 hex digits and CRLF.
const SIZE_LINE: usize = 18;
/// Room for the chunk-size lines of a chunked response, taken when it runs out.
const SIZE_LINES: usize = 512;

/// Writes `resp`; `Ok(true)` when the connection may carry another request.
#[allow(clippy::manual_async_fn)] // an `async fn` keeps its arguments twice (`proxy::handle_with`)
pub(crate) fn write<'a, IO: AsyncRead + AsyncWrite + Unpin>(
    wire: &'a Shared<IO>,
    wbuf: &'a mut BytesMut,
    pending: &'a mut Vec<Bytes>,
    resp: crate::proxy::Resp,
    req: &'a Answering<'a>,
    send_timeout: Duration,
    activity: &'a ConnActivity,
) -> impl std::future::Future<Output = io::Result<bool>> + 'a {
    async move {
        let (parts, mut body) = crate::proxy::unbox(resp).into_parts();
        let status = parts.status;
        let informational = status.is_informational();
        let no_content = matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
        let can_chunk = !req.head_method && !informational && !no_content;
        let can_length = !informational && !no_content;
        let known = if body.is_end_stream() {
            Known::None
        } else {
            match body.size_hint().exact() {
                Some(n) => Known::Exact(n),
                None => Known::Unknown,
            }
        };
        let keep_alive = req.keep_alive;

        wbuf.clear();
        if status == StatusCode::OK {
            wbuf.put_slice(b"HTTP/1.1 200 OK\r\n");
        } else {
            wbuf.put_slice(b"HTTP/1.1 ");
            wbuf.put_slice(status.as_str().as_bytes());
            wbuf.put_u8(b' ');
            wbuf.put_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
            wbuf.put_slice(b"\r\n");
        }
        let mut head = Fields {
            enc: None,
            wrote_date: false,
            connection: BytesMut::new(),
            te_chunked_last: true,
            te_written: false,
            keep_alive,
            known,
            req,
            can_chunk,
        };
        if let Some(raw) = body.take_raw_head() {
            // The upstream's fields as received (no framing or hop-by-hop one among them), then
            // its framing fields through the same rules as a map's.
            wbuf.put_slice(&raw.fields);
            head.wrote_date = raw.date;
            if let Some(n) = raw.length {
                let mut digits = [0u8; 20];
                head.put(
                    wbuf,
                    &header::CONTENT_LENGTH,
                    crate::h1::num(n, 10, &mut digits),
                )?;
            }
            if raw.chunked {
                head.put(wbuf, &header::TRANSFER_ENCODING, b"chunked")?;
            }
        }
        for (name, value) in &parts.headers {
            head.put(wbuf, name, value.as_bytes())?;
        }
        if body.keepalive_hinted() {
            head.put(wbuf, &KEEP_ALIVE, req.keepalive.as_bytes())?;
        }
        if head.te_written {
            if !head.te_chunked_last {
                wbuf.put_slice(b", chunked");
            }
            wbuf.put_slice(b"\r\n");
        }
        let Fields {
            enc,
            wrote_date,
            connection,
            mut keep_alive,
            ..
        } = head;
        // The fields are in the head now: the map's memory serves the next message.
        crate::headers::recycle_map(parts.headers);
        let mut enc = match enc {
            Some(e) => e,
            None => match known {
                Known::Unknown if req.http10 || !can_chunk => Enc::Close,
                Known::Unknown => {
                    wbuf.put_slice(b"transfer-encoding: chunked\r\n");
                    Enc::Chunked
                }
                Known::None | Known::Exact(0) => {
                    if can_length && !req.head_method {
                        wbuf.put_slice(b"content-length: 0\r\n");
                    }
                    Enc::Length(0)
                }
                Known::Exact(n) => {
                    if can_length {
                        wbuf.put_slice(b"content-length: ");
                        crate::h1::put_num(wbuf, n, 10);
                        wbuf.put_slice(b"\r\n");
                        Enc::Length(n)
                    } else {
                        Enc::Length(0)
                    }
                }
            },
        };
        if !can_chunk {
            // HEAD, 1xx, 204, 304: never a body, whatever the fields say.
            enc = Enc::Length(0);
        }
        if enc == Enc::Close && can_chunk {
            keep_alive = false;
        }
        // The connection's fate, said to the client: an HTTP/1.0 client keeps it only when told
        // `keep-alive`; an HTTP/1.1 one is told `close` when it ends here.
        let has = |tok: &[u8]| {
            connection[..]
                .split(|&b| b == b',')
                .any(|t| crate::h1::head::trim_ows(t).eq_ignore_ascii_case(tok))
        };
        let add: Option<&[u8]> = if keep_alive {
            (req.http10 && !has(b"keep-alive")).then_some(&b"keep-alive"[..])
        } else {
            (!has(b"close")).then_some(&b"close"[..])
        };
        if !connection.is_empty() || add.is_some() {
            wbuf.put_slice(b"connection: ");
            wbuf.put_slice(&connection);
            if let Some(a) = add {
                if !connection.is_empty() {
                    wbuf.put_slice(b", ");
                }
                wbuf.put_slice(a);
            }
            wbuf.put_slice(b"\r\n");
        }
        if !wrote_date {
            wbuf.put_slice(b"date: ");
            date(wbuf);
            wbuf.put_slice(b"\r\n");
        }
        wbuf.put_slice(b"\r\n");
        let trailers_allowed = req.accepts_trailers && enc == Enc::Chunked;
        let mut out = Out {
            wire,
            send_timeout,
            activity,
        };

        if enc == Enc::Length(0) {
            // Nothing of the body goes out: it is dropped unread, as hyper did.
            drop(body);
            out.write_all(wbuf, &mut []).await?;
            return Ok(keep_alive);
        }

        let mut left = match enc {
            Enc::Length(n) => n,
            _ => 0,
        };
        // A small body already at hand goes into the head's buffer, so that the response is
        // one buffer and one `send(2)` without copying the head again
        // (`crate::h1::poll_write_gathered`). Any other frame is the loop's.
        let mut first = None;
        if left > 0 && left <= crate::h1::GATHER as u64 {
            match poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if data.len() as u64 <= left => {
                        left -= data.len() as u64;
                        wbuf.put_slice(&data);
                    }
                    Ok(data) => first = Some(Some(Ok(http_body::Frame::data(data)))),
                    Err(frame) => first = Some(Some(Ok(frame))),
                },
                Poll::Ready(frame) => first = Some(frame),
                Poll::Pending => {}
            }
        }
        // What follows the head (in `wbuf`, written from there: no share of it split off per
        // response) is queued in `pending`.
        pending.clear();
        let mut lines = BytesMut::new();
        loop {
            // A frame at hand goes out with what is queued; none at hand: the queue goes now.
            let frame = if let Some(frame) = first.take() {
                frame
            } else if wbuf.is_empty() && pending.is_empty() {
                poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
            } else if pending.len() >= 15 {
                out.write_all(wbuf, pending).await?;
                pending.clear();
                continue;
            } else {
                match poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await {
                    Poll::Ready(f) => f,
                    Poll::Pending => {
                        out.write_all(wbuf, pending).await?;
                        pending.clear();
                        continue;
                    }
                }
            };
            match frame {
                None => {
                    match enc {
                        Enc::Chunked => {
                            pending.push(Bytes::from_static(b"0\r\n\r\n"));
                        }
                        // Shorter than its length: the client can only tell by the close.
                        Enc::Length(_) if left > 0 => keep_alive = false,
                        _ => {}
                    }
                    drop(body);
                    out.write_all(wbuf, pending).await?;
                    return Ok(keep_alive);
                }
                Some(Err(e)) => {
                    // Cut mid-body: the client sees the close before the end.
                    drop(body);
                    if !wbuf.is_empty() || !pending.is_empty() {
                        let _ = out.write_all(wbuf, pending).await;
                    }
                    return Err(io::Error::other(e));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if data.is_empty() {
                            continue;
                        }
                        match enc {
                            Enc::Length(_) => {
                                if data.len() as u64 > left {
                                    drop(body);
                                    return Err(io::Error::other(
                                        "response body longer than its Content-Length",
                                    ));
                                }
                                left -= data.len() as u64;
                                pending.push(data);
                            }
                            Enc::Chunked => {
                                // The size lines share one buffer, taken back in place once
                                // the lines cut from it are written (no allocation a chunk).
                                if lines.capacity() < SIZE_LINE {
                                    lines.reserve(SIZE_LINES);
                                }
                                crate::h1::put_chunk_size(&mut lines, data.len());
                                pending.push(lines.split().freeze());
                                pending.push(data);
                                pending.push(Bytes::from_static(b"\r\n"));
                            }
                            Enc::Close => pending.push(data),
                        }
                    }
                    Err(frame) => {
                        let Ok(trailers) = frame.into_trailers() else {
                            continue;
                        };
                        if !trailers_allowed {
                            continue;
                        }
                        let mut end = BytesMut::new();
                        end.put_slice(b"0\r\n");
                        for (name, value) in &trailers {
                            if fit_for_trailer(name) {
                                end.put_slice(name.as_str().as_bytes());
                                end.put_slice(b": ");
                                end.put_slice(value.as_bytes());
                                end.put_slice(b"\r\n");
                            }
                        }
                        end.put_slice(b"\r\n");
                        pending.push(end.freeze());
                        // The trailers end the body.
                        drop(body);
                        out.write_all(wbuf, pending).await?;
                        return Ok(keep_alive);
                    }
                },
            }
        }
    }
}

/// The client's side of the connection, with `send_timeout` on every write.
struct Out<'a, IO> {
    wire: &'a Shared<IO>,
    send_timeout: Duration,
    activity: &'a ConnActivity,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Out<'_, IO> {
    /// Writes every byte of `head`, then of `bufs`, and flushes; `head` is left empty. A
    /// write the client does not accept for `send_timeout` fails (nginx's `send_timeout`,
    /// between two successive writes). The head is written from its buffer as it is: a
    /// share of it split off to queue would cost two atomic reference counts per response.
    async fn write_all(&mut self, head: &mut BytesMut, bufs: &mut [Bytes]) -> io::Result<()> {
        // `head[..at]` went out.
        let mut at = 0;
        let mut first = 0;
        loop {
            while bufs.get(first).is_some_and(Bytes::is_empty) {
                first += 1;
            }
            let mut slices = [IoSlice::new(&[]); 16];
            let k = crate::h1::write_slices(&mut slices, &head[at..], bufs[first..].iter());
            if k == 0 {
                break;
            }
            let wire = self.wire;
            let mut n = match self
                .bounded(|cx| wire.poll_write_vectored(cx, &slices[..k]))
                .await?
            {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => n,
            };
            let of_head = n.min(head.len() - at);
            at += of_head;
            n -= of_head;
            while n > 0 {
                let b = &mut bufs[first];
                if n >= b.len() {
                    n -= b.len();
                    *b = Bytes::new();
                    first += 1;
                } else {
                    b.advance(n);
                    n = 0;
                }
            }
        }
        head.clear();
        let wire = self.wire;
        self.bounded(|cx| wire.poll_flush(cx)).await
    }

    /// One write (or flush): tried at once, and only when the client's window is full is
    /// it bounded by `send_timeout` (no timer per write that completes).
    async fn bounded<T>(
        &self,
        mut op: impl FnMut(&mut std::task::Context<'_>) -> Poll<io::Result<T>>,
    ) -> io::Result<T> {
        let now = poll_fn(|cx| match op(cx) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            Poll::Pending => Poll::Ready(None),
        })
        .await;
        if let Some(r) = now {
            return r;
        }
        match tokio::time::timeout(self.send_timeout, poll_fn(op)).await {
            Err(_) => Err(self.timed_out()),
            Ok(r) => r,
        }
    }

    fn timed_out(&self) -> io::Error {
        self.activity.note_send_timeout();
        io::Error::new(
            io::ErrorKind::TimedOut,
            "the client accepted no response byte for send_timeout",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::RespBody;
    use crate::h1::{Recorder, Written};
    use http::Response;
    use tokio::io::AsyncReadExt;

    async fn written(resp: Response<RespBody>, req: Answering<'_>) -> (String, bool) {
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let wire = Shared::new(ours, BytesMut::new());
        let activity = ConnActivity::for_tests();
        let mut wbuf = BytesMut::new();
        let keep = write(
            &wire,
            &mut wbuf,
            &mut Vec::new(),
            Box::new(resp),
            &req,
            Duration::from_secs(1),
            &activity,
        )
        .await
        .unwrap();
        drop(wire);
        let mut out = Vec::new();
        theirs.read_to_end(&mut out).await.unwrap();
        (String::from_utf8(out).unwrap(), keep)
    }

    static KEEPALIVE: HeaderValue = HeaderValue::from_static("timeout=7");

    fn answering(http10: bool, keep_alive: bool, head_method: bool) -> Answering<'static> {
        Answering {
            keep_alive,
            http10,
            head_method,
            accepts_trailers: false,
            keepalive: &KEEPALIVE,
        }
    }

    #[tokio::test]
    async fn the_keepalive_hint_asked_for_is_said_after_the_maps_fields() {
        let mut resp = Response::new(RespBody::full("hi"));
        resp.headers_mut()
            .insert("x-a", HeaderValue::from_static("1"));
        resp.body_mut().hint_keepalive();
        let (out, keep) = written(resp, answering(false, true, false)).await;
        assert!(
            out.contains("\r\nx-a: 1\r\nkeep-alive: timeout=7\r\n"),
            "{out}"
        );
        assert!(keep);
        let (out, _) = written(
            Response::new(RespBody::full("hi")),
            answering(false, true, false),
        )
        .await;
        assert!(!out.contains("keep-alive"), "not asked for: {out}");
    }

    #[tokio::test]
    async fn an_http10_client_gets_http11_with_its_connection_said() {
        let (out, keep) = written(
            Response::new(RespBody::full("hi")),
            answering(true, false, false),
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("\r\ncontent-length: 2\r\n"), "{out}");
        assert!(out.contains("\r\nconnection: close\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nhi"), "{out}");
        assert!(!keep);
        let (out, keep) = written(
            Response::new(RespBody::full("hi")),
            answering(true, true, false),
        )
        .await;
        assert!(out.contains("\r\nconnection: keep-alive\r\n"), "{out}");
        assert!(keep);
    }

    /// `resp` written to a [`Recorder`]: the writer's result and the writes it made.
    async fn recorded(resp: Response<RespBody>) -> (io::Result<bool>, Vec<Written>) {
        let rec = Recorder::new();
        let wire = Shared::new(rec.clone(), BytesMut::new());
        let activity = ConnActivity::for_tests();
        let req = answering(false, true, false);
        let r = write(
            &wire,
            &mut BytesMut::new(),
            &mut Vec::new(),
            Box::new(resp),
            &req,
            Duration::from_secs(1),
            &activity,
        )
        .await;
        (r, rec.writes())
    }

    #[tokio::test]
    async fn a_small_body_goes_out_with_its_head_in_one_plain_write() {
        let (r, writes) = recorded(Response::new(RespBody::full("hi"))).await;
        assert!(r.unwrap());
        assert_eq!(writes.len(), 1, "one write: {writes:?}");
        let (vectored, bytes) = &writes[0];
        assert!(!vectored, "a plain write, not writev");
        let text = String::from_utf8_lossy(bytes);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nhi"), "{text}");
    }

    #[tokio::test]
    async fn a_large_body_goes_out_beside_its_head_uncopied() {
        let body = vec![b'x'; crate::h1::GATHER + 1];
        let (r, writes) = recorded(Response::new(RespBody::full(body.clone()))).await;
        assert!(r.unwrap());
        assert_eq!(writes.len(), 1, "one write: {writes:?}");
        let (vectored, bytes) = &writes[0];
        assert!(vectored, "head and body as two buffers of one writev");
        assert!(bytes.ends_with(&body));
        let head = String::from_utf8_lossy(&bytes[..bytes.len() - body.len()]);
        assert!(
            head.contains(&format!("\r\ncontent-length: {}\r\n", body.len())),
            "{head}"
        );
    }

    #[tokio::test]
    async fn head_204_and_304_have_no_body() {
        let mut resp = Response::new(RespBody::full("hello"));
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, "5".parse().unwrap());
        let (out, keep) = written(resp, answering(false, true, true)).await;
        assert!(out.contains("\r\ncontent-length: 5\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\n"), "{out}");
        assert!(keep);
        for status in [StatusCode::NO_CONTENT, StatusCode::NOT_MODIFIED] {
            let mut resp = Response::new(RespBody::empty());
            *resp.status_mut() = status;
            let (out, _) = written(resp, answering(false, true, false)).await;
            assert!(out.starts_with(&format!("HTTP/1.1 {status}\r\n")), "{out}");
            assert!(!out.contains("content-length"), "{out}");
            assert!(out.ends_with("\r\n\r\n"), "{out}");
        }
    }
}
