//! The proxy's typed error: where a failure came from, whether a retry is safe, and whether it
//! happened on a reused pooled connection. `rescue` is the one place that turns it into a response.

use std::fmt;
use std::net::SocketAddr;

/// A boxed error source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The cause code of a response upkeep generated itself; stable strings (logs, headers, metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// No route matched host and path.
    NoRoute,
    /// The group had no usable peer.
    NoPeers,
    /// Every attempt failed to connect.
    ConnectFailed,
    /// The upstream reset or closed before a complete response head.
    UpstreamReset,
    /// The upstream did not answer in time.
    UpstreamTimeout,
    /// A retry was needed but the retry budget was spent.
    RetryBudget,
    /// upkeep refused work to protect itself.
    Overloaded,
    /// The downstream request was malformed (400).
    BadRequest,
    /// The request head was larger than `max_header_bytes` (431).
    HeaderTooLarge,
    /// The request target was longer than the HTTP/1 parser takes (414).
    UriTooLong,
    /// upkeep itself failed while handling the request (500): a bug, caught at the request
    /// boundary and logged with its panic message.
    Internal,
    /// The TLS handshake with the upstream failed (certificate, protocol).
    UpstreamTls,
    /// The client went silent inside its request body for `client_body_timeout` (408).
    ClientTimeout,
    /// The request body is larger than the route's `max_body_bytes` (413).
    BodyTooLarge,
    /// An upgrade (WebSocket) routed to an HTTP/2 peer that does not take RFC 8441 extended
    /// CONNECT and cannot be reached over HTTP/1.1 (502).
    UpstreamNoUpgrade,
}

/// Why a response body was cut after its head was sent (access log `cause`, metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cut {
    /// The upstream sent nothing inside the body for `read_timeout`.
    UpstreamReadTimeout,
    /// The client accepted no byte of the response for `send_timeout`.
    ClientSendTimeout,
    /// An upgraded connection carried no byte either way for `upgrade_idle_timeout`.
    UpgradeIdleTimeout,
    /// An upgraded connection was still open `shutdown_timeout` after shutdown began.
    Shutdown,
    /// A gRPC call was still streaming at its deadline (`grpc-timeout`, `deadline`).
    CallDeadline,
}

impl Cut {
    /// The cause code as written in the access log and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Cut::UpstreamReadTimeout => "upstream_read_timeout",
            Cut::ClientSendTimeout => "client_send_timeout",
            Cut::UpgradeIdleTimeout => "upgrade_idle_timeout",
            Cut::Shutdown => "shutdown",
            Cut::CallDeadline => "call_deadline",
        }
    }
}

impl Cause {
    /// The cause code as written in logs, headers and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::NoRoute => "no_route",
            Cause::NoPeers => "no_peers",
            Cause::ConnectFailed => "connect_failed",
            Cause::UpstreamReset => "upstream_reset",
            Cause::UpstreamTimeout => "upstream_timeout",
            Cause::RetryBudget => "retry_budget",
            Cause::Overloaded => "overloaded",
            Cause::BadRequest => "bad_request",
            Cause::HeaderTooLarge => "header_too_large",
            Cause::UriTooLong => "uri_too_long",
            Cause::Internal => "internal",
            Cause::UpstreamTls => "upstream_tls",
            Cause::ClientTimeout => "client_timeout",
            Cause::BodyTooLarge => "body_too_large",
            Cause::UpstreamNoUpgrade => "upstream_no_upgrade",
        }
    }

    /// The status a response with this cause gets.
    pub fn status(self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            Cause::NoRoute => S::NOT_FOUND,
            Cause::NoPeers | Cause::RetryBudget | Cause::Overloaded => S::SERVICE_UNAVAILABLE,
            Cause::ConnectFailed
            | Cause::UpstreamReset
            | Cause::UpstreamTls
            | Cause::UpstreamNoUpgrade => S::BAD_GATEWAY,
            Cause::UpstreamTimeout => S::GATEWAY_TIMEOUT,
            Cause::BadRequest => S::BAD_REQUEST,
            Cause::HeaderTooLarge => S::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Cause::UriTooLong => S::URI_TOO_LONG,
            Cause::Internal => S::INTERNAL_SERVER_ERROR,
            Cause::ClientTimeout => S::REQUEST_TIMEOUT,
            Cause::BodyTooLarge => S::PAYLOAD_TOO_LARGE,
        }
    }
}

/// Why a group had no usable peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoPeersReason {
    /// No endpoint name has resolved yet.
    NeverResolved,
    /// Names resolved, but to no addresses (e.g. dropped after the stale grace ended).
    EmptyGroup,
    /// Every peer is ejected (the panic threshold keeps this from happening through ejection alone).
    AllEjected,
    /// Every usable peer was already tried by this request.
    AllTried,
    /// Every peer has failed to connect for longer than `connect_retry_window`: the group is
    /// known to be down and requests fail at once while probes look for its return.
    AllDown,
}

impl NoPeersReason {
    /// The reason as written in logs and headers.
    pub fn as_str(self) -> &'static str {
        match self {
            NoPeersReason::NeverResolved => "never_resolved",
            NoPeersReason::EmptyGroup => "empty_group",
            NoPeersReason::AllEjected => "all_ejected",
            NoPeersReason::AllTried => "all_tried",
            NoPeersReason::AllDown => "all_down",
        }
    }
}

#[derive(Debug)]
pub(crate) enum Kind {
    NoRoute,
    NoPeers(NoPeersReason),
    Connect,
    ConnectTimeout,
    /// Reset, EOF or protocol error before a complete response head.
    Reset,
    /// The per-try timeout or overall deadline passed before response headers.
    Timeout,
    RetryBudget,
    BadRequest,
    /// A request refused by a normalisation rule, with the rule's reason.
    Invalid(&'static str),
    /// A panic caught at the request boundary.
    Internal,
    /// The TLS handshake failed; no request byte was sent.
    Tls,
    /// The client's body went silent for `client_body_timeout`: the client's fault.
    ClientTimeout,
    /// The peer is at `max_connections_per_peer`: not a failure of the peer.
    PeerFull,
    /// The request body passed the route's `max_body_bytes`: the client's doing.
    BodyTooLarge,
    /// The upstream's response head was malformed or ambiguous (refused, never passed on).
    BadResponse,
    /// The peer speaks HTTP/2 without extended CONNECT and no HTTP/1.1 to it is possible:
    /// an upgrade cannot be carried. Not a failure of the peer.
    NoUpgrade,
}

/// A classified proxy failure. On the heap: a request path's results are `Result`s of it,
/// moved up through each layer on success too, where only a pointer's worth is then moved.
pub struct ProxyError(Box<Failure>);

struct Failure {
    kind: Kind,
    peer: Option<SocketAddr>,
    reused: bool,
    written: bool,
    /// A reset or close that came before any response byte was read.
    unanswered: bool,
    source: Option<BoxError>,
}

impl ProxyError {
    pub(crate) fn new(kind: Kind) -> Self {
        Self(Box::new(Failure {
            kind,
            peer: None,
            reused: false,
            written: false,
            unanswered: false,
            source: None,
        }))
    }

    pub(crate) fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.0.source = Some(source.into());
        self
    }

    pub(crate) fn on_peer(mut self, peer: SocketAddr, reused: bool, written: bool) -> Self {
        self.0.peer = Some(peer);
        self.0.reused = reused;
        self.0.written = written;
        self
    }

    /// The connection failed before any response byte was read from it.
    pub(crate) fn unanswered(mut self, unanswered: bool) -> Self {
        self.0.unanswered = unanswered;
        self
    }

    pub(crate) fn kind(&self) -> &Kind {
        &self.0.kind
    }

    /// The cause code for this failure.
    pub fn cause(&self) -> Cause {
        match self.0.kind {
            Kind::NoRoute => Cause::NoRoute,
            Kind::NoPeers(_) => Cause::NoPeers,
            Kind::Connect | Kind::ConnectTimeout => Cause::ConnectFailed,
            Kind::Reset | Kind::BadResponse => Cause::UpstreamReset,
            Kind::Timeout => Cause::UpstreamTimeout,
            Kind::RetryBudget => Cause::RetryBudget,
            Kind::BadRequest | Kind::Invalid(_) => Cause::BadRequest,
            Kind::Internal => Cause::Internal,
            Kind::Tls => Cause::UpstreamTls,
            Kind::ClientTimeout => Cause::ClientTimeout,
            Kind::PeerFull => Cause::Overloaded,
            Kind::BodyTooLarge => Cause::BodyTooLarge,
            Kind::NoUpgrade => Cause::UpstreamNoUpgrade,
        }
    }

    /// Extra detail for the cause (the no_peers reason).
    pub fn detail(&self) -> Option<&'static str> {
        match self.0.kind {
            Kind::NoPeers(r) => Some(r.as_str()),
            Kind::ConnectTimeout => Some("connect_timeout"),
            Kind::Invalid(r) => Some(r),
            Kind::PeerFull => Some("max_connections_per_peer"),
            Kind::BadResponse => Some("invalid_response"),
            _ => None,
        }
    }

    /// The failure happened before the upstream could have seen any request byte.
    pub fn is_connect(&self) -> bool {
        matches!(self.0.kind, Kind::Connect | Kind::ConnectTimeout)
    }

    /// The failure is the client's or upkeep's own, never to be held against the peer.
    pub fn is_peer_blameless(&self) -> bool {
        matches!(
            self.0.kind,
            Kind::BadRequest
                | Kind::ClientTimeout
                | Kind::PeerFull
                | Kind::BodyTooLarge
                | Kind::NoUpgrade
        )
    }

    /// The peer can take no connection now: it refused or did not answer a connect, or it
    /// reset or closed a fresh connection before any response byte (what a peer whose listener
    /// just closed does to the connections still in its accept queue). A malformed answer is
    /// not one of these.
    pub fn is_peer_unreachable(&self) -> bool {
        self.is_connect()
            || (matches!(self.0.kind, Kind::Reset) && !self.0.reused && self.0.unanswered)
    }

    /// The failure happened on a connection taken from the pool.
    pub fn is_reused(&self) -> bool {
        self.0.reused
    }

    /// Some request bytes reached the socket before the failure.
    pub fn is_written(&self) -> bool {
        self.0.written
    }

    /// The peer the failure happened on, if any.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.0.peer
    }
}

impl fmt::Debug for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyError")
            .field("kind", &self.0.kind)
            .field("peer", &self.0.peer)
            .field("reused", &self.0.reused)
            .field("written", &self.0.written)
            .field("source", &self.0.source)
            .finish()
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.cause().as_str())?;
        if let Some(d) = self.detail() {
            write!(f, " ({d})")?;
        }
        if let Some(p) = self.0.peer {
            write!(f, " peer {p}")?;
        }
        if let Some(s) = &self.0.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ProxyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source.as_deref().map(|e| e as _)
    }
}
