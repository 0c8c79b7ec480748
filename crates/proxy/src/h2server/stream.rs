//! One HTTP/2 stream's task: the request goes to the handler, the client's reset cancels it,
//! a `100 Continue` goes out when the handler first reads an `Expect` body (the upstream
//! asked for it, `crate::expect`), and the response is sent within the client's window.
//! An extended CONNECT answered `200` hands its stream to the tunnel (`crate::upgrade`).

use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::{ready, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;

use super::body::{H2Body, Progress};
use super::io::H2Pending;
use crate::body::RespBody;
use crate::error::BoxError;
use crate::headers::Present;
use crate::listener::h2_stall::{StallWatch, StreamExec};
use crate::proxy::{ConnCtx, DownRequest};

/// Spawns the task of a stream the connection accepted, under the stall timer
/// (`send_timeout`).
pub(super) fn spawn(
    exec: &StreamExec,
    req: Request<h2::RecvStream>,
    respond: h2::server::SendResponse<Bytes>,
    ctx: Arc<ConnCtx>,
) {
    let Some(stream) = Stream::start(req, respond, ctx) else {
        return;
    };
    exec.spawn(Box::into_pin(Box::write(Box::new_uninit(), run(stream))));
}

/// A stream's request made ready for the handler, with what its task needs besides. Made in a
/// plain function ([`Stream::start`]): the request's parts, which an `async fn` would keep
/// twice (as its argument and as the locals it takes them apart into) for as long as the
/// stream lasts, never enter the task's future, which is allocated per stream.
struct Stream {
    req: Box<DownRequest>,
    present: Present,
    respond: h2::server::SendResponse<Bytes>,
    ctx: Arc<ConnCtx>,
    /// An extended CONNECT: hands the stream's sending half to the tunnel after a `2xx`.
    tunnel: Option<tokio::sync::oneshot::Sender<h2::SendStream<Bytes>>>,
    /// The client's body, followed while it still has some to send.
    progress: Option<Arc<Progress>>,
}

impl Stream {
    /// `None`: the stream was refused (reset) already.
    fn start(
        req: Request<h2::RecvStream>,
        mut respond: h2::server::SendResponse<Bytes>,
        ctx: Arc<ConnCtx>,
    ) -> Option<Self> {
        let (mut parts, recv) = req.into_parts();
        let present = Present::of(&parts.headers);
        // Most requests carry none: no lookup (a hash of the name and a probe) for it.
        let content_length = if present.has(Present::CONTENT_LENGTH) {
            content_length(&parts.headers)
        } else {
            None
        };
        let mut tunnel = None;
        let (body, progress) = if parts.method == Method::CONNECT {
            if content_length.is_some_and(|n| n != 0) {
                respond.send_reset(h2::Reason::INTERNAL_ERROR);
                return None;
            }
            if let Some(p) = parts.extensions.remove::<h2::ext::Protocol>() {
                parts
                    .extensions
                    .insert(hyper::ext::Protocol::from(p.as_str()));
                let (tx, pending) = H2Pending::new(recv);
                parts.extensions.insert(pending);
                tunnel = Some(tx);
            }
            (H2Body::empty(), None)
        } else {
            // Followed only when the client has a body still to send: a request without one
            // (most) allocates nothing for it, and has no `100 Continue` to wait for.
            let progress = (!recv.is_end_stream()).then(|| Arc::new(Progress::default()));
            let expects = progress.is_some()
                && crate::expect::expects_continue(parts.version, &parts.headers);
            (
                H2Body::new(recv, content_length, progress.clone(), expects),
                progress,
            )
        };
        let req = Box::new(DownRequest {
            req: Request::from_parts(parts, crate::body::DownBody::H2(body)),
            fields: None,
        });
        Some(Self {
            req,
            present,
            respond,
            ctx,
            tunnel,
            progress,
        })
    }
}

/// A plain function: an `async fn` would keep `stream` twice, as its argument and as the
/// locals it is taken apart into; the block uses the argument's fields where they are.
#[allow(clippy::manual_async_fn)] // an `async fn` keeps its arguments twice (`proxy::handle_with`)
fn run(mut stream: Stream) -> impl std::future::Future<Output = ()> + Send {
    async move {
        // The handler's future, most of the task's, ends with this block: sending the response
        // reuses its room.
        let answered = {
            let mut handled = std::pin::pin!(crate::proxy::handle_with(
                stream.req,
                stream.ctx,
                stream.present,
                false
            ));
            poll_fn(|cx| {
                if let Poll::Ready(r) = handled.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
                if stream.progress.as_ref().is_some_and(|p| p.poll_wanted(cx)) {
                    let mut r = Response::new(());
                    *r.status_mut() = StatusCode::CONTINUE;
                    if let Err(e) = stream.respond.send_informational(r) {
                        tracing::debug!(error = %e, "HTTP/2 stream: 100 Continue not sent");
                    }
                }
                // The client's reset cancels the request (the handler is dropped).
                match stream.respond.poll_reset(cx) {
                    Poll::Ready(r) => {
                        tracing::debug!(reason = ?r.ok(), "HTTP/2 stream reset by the client");
                        Poll::Ready(None)
                    }
                    Poll::Pending => Poll::Pending,
                }
            })
            .await
        };
        let Some(Ok(resp)) = answered else {
            return;
        };
        let (mut head, body) = crate::proxy::unbox(resp).into_parts();
        let mut names = Names::of(&head.headers);
        if names.hop {
            strip_connection_headers(&mut head.headers);
            // Its `Connection` field may have named either of the others.
            names = Names::of(&head.headers);
        }
        if names.never_repeats {
            crate::headers::mark_never_indexed(&mut head.headers);
        }
        if !names.date {
            head.headers.insert(header::DATE, date());
        }
        if let Some(tx) = stream.tunnel {
            if head.status.is_success() {
                head.headers.remove(header::CONTENT_LENGTH);
                match stream
                    .respond
                    .send_response(Response::from_parts(head, ()), false)
                {
                    Ok(send) => {
                        let _ = tx.send(send);
                    }
                    Err(e) => tracing::debug!(error = %e, "HTTP/2 stream: response not sent"),
                }
                return;
            }
        }
        let body = StallWatch::new(body);
        let eos = body.is_end_stream();
        if !eos && !names.length {
            if let Some(n) = body.size_hint().exact() {
                head.headers
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            }
        }
        let send = match stream
            .respond
            .send_response(Response::from_parts(head, ()), eos)
        {
            Ok(send) => send,
            Err(e) => {
                tracing::debug!(error = %e, "HTTP/2 stream: response not sent");
                stream.respond.send_reset(h2::Reason::INTERNAL_ERROR);
                return;
            }
        };
        let send = if eos { send } else { pipe(body, send).await };
        if stream.progress.is_some_and(|p| !p.ended()) {
            linger(send).await;
        }
    }
}

/// How long a stream answered before its request body ended stays open for the client to end
/// it (curl ends it as soon as it has the answer to an `Expect`).
const LINGER: Duration = Duration::from_millis(500);

/// Holds the stream's last handle for a while after an early answer. Dropping it at once
/// makes h2 reset the stream (NO_ERROR, RFC 9113 §8.1), and a client that reads the reset
/// before the answer it came with reports no answer at all (curl: "Empty reply from
/// server"). A client that ends its body closes the stream cleanly meanwhile; one that goes
/// on uploading gets the reset when the time is up.
async fn linger(send: h2::SendStream<Bytes>) {
    let _send = send;
    tokio::time::sleep(LINGER).await;
}

/// Sends the response body: a frame is taken from the body only once the client has window
/// for some of it (so a stalled client stops the body, which `send_timeout` then sees),
/// then its trailers, or an empty DATA with END_STREAM.
async fn pipe(body: StallWatch<RespBody>, mut tx: h2::SendStream<Bytes>) -> h2::SendStream<Bytes> {
    tokio::pin!(body);
    let mut buffered: Option<(Bytes, bool)> = None;
    poll_fn(|cx| loop {
        if let Poll::Ready(r) = tx.poll_reset(cx) {
            tracing::debug!(reason = ?r.ok(), "HTTP/2 stream reset by the client");
            return Poll::Ready(());
        }
        if buffered.is_some() {
            while tx.capacity() == 0 {
                match ready!(tx.poll_capacity(cx)) {
                    Some(Ok(0)) => {}
                    Some(Ok(_)) => break,
                    Some(Err(_)) | None => return Poll::Ready(()),
                }
            }
            let (data, eos) = buffered.take().expect("checked above");
            if tx.send_data(data, eos).is_err() || eos {
                return Poll::Ready(());
            }
            continue;
        }
        match ready!(body.as_mut().poll_frame(cx)) {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    let eos = body.is_end_stream();
                    if data.is_empty() {
                        if tx.send_data(data, eos).is_err() || eos {
                            return Poll::Ready(());
                        }
                        continue;
                    }
                    // A small claim on the window, not the whole chunk: h2 raises it to
                    // what is buffered, and a claim never pins window another stream needs.
                    tx.reserve_capacity(1);
                    buffered = Some((data, eos));
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        tx.reserve_capacity(0);
                        let _ = tx.send_trailers(trailers);
                        return Poll::Ready(());
                    }
                }
            },
            Some(Err(e)) => {
                let reason = reason_of(&e);
                tracing::debug!(error = %e, "HTTP/2 stream: response body failed; reset");
                tx.send_reset(reason);
                return Poll::Ready(());
            }
            None => {
                let _ = tx.send_data(Bytes::new(), true);
                return Poll::Ready(());
            }
        }
    })
    .await;
    tx
}

/// The reason to reset a stream with when its body failed: an HTTP/2 reason found in the
/// error's causes (an upstream stream reset passes its reason on), else INTERNAL_ERROR.
fn reason_of(e: &BoxError) -> h2::Reason {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&**e);
    while let Some(c) = cur {
        if let Some(r) = c.downcast_ref::<h2::Error>().and_then(h2::Error::reason) {
            return r;
        }
        cur = c.source();
    }
    h2::Reason::INTERNAL_ERROR
}

/// `Content-Length` when every value agrees (h2 has already refused a stream whose body
/// does not match it).
fn content_length(h: &HeaderMap) -> Option<u64> {
    let mut found = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        let n = v.to_str().ok()?.trim().parse::<u64>().ok()?;
        if found.is_some_and(|f| f != n) {
            return None;
        }
        found = Some(n);
    }
    found
}

thread_local! {
    /// This thread's `Date` value and the second it was made for.
    static DATE: std::cell::RefCell<(u64, HeaderValue)> =
        const { std::cell::RefCell::new((u64::MAX, HeaderValue::from_static(""))) };
}

/// `Date` for a response (RFC 9110 §6.6.1), as hyper's servers add it: made once a second.
fn date() -> HeaderValue {
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            let text = httpdate::fmt_http_date(now);
            *d = (
                secs,
                HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("")),
            );
        }
        d.1.clone()
    })
}

/// What one look at a response's names finds: a connection-specific field to strip (HTTP/2
/// has none, RFC 9113 §8.2.2), a `Date`, a `Content-Length`, a field whose value never
/// repeats (an echoed request id, `headers::never_repeats`: sent never indexed). Each name is compared as an enum
/// tag; a lookup by name (`entry`, `contains_key`) hashes and probes, about 200 instructions
/// each, and a response from an HTTP/1.1 upstream has both fields already.
#[derive(Default)]
struct Names {
    hop: bool,
    date: bool,
    length: bool,
    never_repeats: bool,
}

impl Names {
    fn of(h: &HeaderMap) -> Self {
        let mut names = Self::default();
        for name in h.keys() {
            if *name == header::DATE {
                names.date = true;
            } else if *name == header::CONTENT_LENGTH {
                names.length = true;
            } else if crate::headers::is_hop_by_hop(name) {
                names.hop = true;
            } else if crate::headers::never_repeats(name) {
                names.never_repeats = true;
            }
        }
        names
    }
}

/// Fields HTTP/2 does not carry (RFC 9113 §8.2.2); h2 refuses a response with them.
fn strip_connection_headers(h: &mut HeaderMap) {
    if !crate::headers::has_hop_by_hop(h) {
        return;
    }
    let named: Vec<header::HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| header::HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TE,
        header::HeaderName::from_static("keep-alive"),
        header::HeaderName::from_static("proxy-connection"),
    ] {
        h.remove(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        fields
            .iter()
            .map(|(n, v)| {
                (
                    header::HeaderName::from_static(n),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn connection_fields_and_the_fields_they_name_are_stripped() {
        let mut h = map(&[
            ("content-type", "text/plain"),
            ("connection", "x-hop, close"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("te", "trailers"),
            ("x-kept", "2"),
        ]);
        strip_connection_headers(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "x-kept"]);
    }

    #[test]
    fn a_response_without_connection_fields_is_left_as_it_is() {
        let fields = [("content-type", "text/plain"), ("x-a", "1"), ("x-a", "2")];
        let mut h = map(&fields);
        strip_connection_headers(&mut h);
        assert_eq!(h, map(&fields));
    }

    #[test]
    fn one_look_at_the_names_finds_an_echoed_request_id_or_trace_context() {
        let h = map(&[("x-request-id", "4f2a"), ("server", "up")]);
        assert!(Names::of(&h).never_repeats);
        let h = map(&[("traceparent", "00-ab-cd-01"), ("date", "x")]);
        assert!(Names::of(&h).never_repeats);
        let h = map(&[
            ("server", "up"),
            ("x-request-ids", "1"),
            ("content-length", "0"),
        ]);
        assert!(!Names::of(&h).never_repeats);
    }
}
