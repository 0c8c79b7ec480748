//! The request body as the downstream connection delivers it, whichever server read it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::error::BoxError;

/// A downstream request body: hyper's (HTTP/1 connections handed to hyper), one read by
/// upkeep's own HTTP/1 server (`crate::h1::server`), or a stream of upkeep's HTTP/2 server
/// (`crate::h2server`).
pub enum DownBody {
    /// Read by hyper's server.
    Hyper(hyper::body::Incoming),
    /// Read by upkeep's own server.
    Own(OwnBody),
    /// An HTTP/2 stream's DATA and trailers.
    H2(crate::h2server::H2Body),
}

/// Where an own server's request body comes from: the connection it arrived on.
pub trait OwnSource: Send + 'static {
    /// The next frame, `None` at the end.
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>;
    /// Nothing more comes.
    fn is_end_stream(&self) -> bool;
    /// What is known of the length.
    fn size_hint(&self) -> SizeHint;
}

/// A request body read by upkeep's own server; `None`: the request has none.
pub struct OwnBody(Option<Box<dyn OwnSource>>);

impl OwnBody {
    /// A request without a body.
    pub fn empty() -> Self {
        Self(None)
    }

    /// A body read from `source`.
    pub fn new(source: impl OwnSource) -> Self {
        Self(Some(Box::new(source)))
    }
}

impl Body for DownBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            DownBody::Hyper(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(BoxError::from))),
            DownBody::Own(OwnBody(None)) => Poll::Ready(None),
            DownBody::Own(OwnBody(Some(s))) => s.poll_frame(cx),
            DownBody::H2(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(BoxError::from))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            DownBody::Hyper(b) => b.is_end_stream(),
            DownBody::Own(OwnBody(None)) => true,
            DownBody::Own(OwnBody(Some(s))) => s.is_end_stream(),
            DownBody::H2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            DownBody::Hyper(b) => b.size_hint(),
            DownBody::Own(OwnBody(None)) => SizeHint::with_exact(0),
            DownBody::Own(OwnBody(Some(s))) => s.size_hint(),
            DownBody::H2(b) => b.size_hint(),
        }
    }
}
