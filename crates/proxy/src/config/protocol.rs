//! `protocol` of a group: which HTTP version upkeep speaks to its peers.

use std::ops::Range;

use serde::Serialize;

use super::surface::S;

/// The HTTP version spoken to a group's peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with a pool of idle connections (the default).
    #[default]
    Http1,
    /// HTTP/2: prior knowledge over `http://` (h2c), ALPN `h2` over `https://`; one connection
    /// carries many requests.
    Http2,
    /// ALPN picks per connection (`h2` or `http/1.1`); `https://` endpoints only.
    Auto,
}

impl UpstreamProtocol {
    /// The ALPN protocols offered in the TLS handshake.
    pub fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            UpstreamProtocol::Http1 => vec![b"http/1.1".to_vec()],
            UpstreamProtocol::Http2 => vec![b"h2".to_vec()],
            UpstreamProtocol::Auto => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }
}

/// Reads `protocol`; `auto` needs TLS, since only ALPN can choose (there is no h2c upgrade).
pub(super) fn validate(
    value: Option<&S<String>>,
    https: bool,
) -> Result<UpstreamProtocol, (Range<usize>, String)> {
    let Some(v) = value else {
        return Ok(UpstreamProtocol::Http1);
    };
    let p = match v.get_ref().as_str() {
        "http1" => UpstreamProtocol::Http1,
        "http2" => UpstreamProtocol::Http2,
        "auto" => UpstreamProtocol::Auto,
        other => {
            return Err((
                v.span(),
                format!("protocol {other:?}: expected \"http1\", \"http2\" or \"auto\""),
            ))
        }
    };
    if p == UpstreamProtocol::Auto && !https {
        return Err((
            v.span(),
            "protocol \"auto\" chooses by ALPN and needs https:// endpoints; use \"http2\" for h2c (prior knowledge)".into(),
        ));
    }
    Ok(p)
}
