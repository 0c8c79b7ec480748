//! The one place where a typed failure becomes a response: status, cause header, short body.

use http::{HeaderValue, Response};

use crate::body::RespBody;
use crate::error::{Cause, ProxyError};

/// Response header carrying the cause code of a response upkeep generated.
pub const CAUSE_HEADER: &str = "upkeep-error";

/// The response for a failure.
pub fn response(err: &ProxyError) -> Response<RespBody> {
    generated(err.cause(), err.detail())
}

/// A generated response with a cause (and optional detail such as the no_peers reason).
pub fn generated(cause: Cause, detail: Option<&str>) -> Response<RespBody> {
    let value = match detail {
        Some(d) => format!("{}; reason={d}", cause.as_str()),
        None => cause.as_str().to_owned(),
    };
    let body = match detail {
        Some(d) => format!("upkeep: {} ({d})\n", cause.as_str()),
        None => format!("upkeep: {}\n", cause.as_str()),
    };
    let mut resp = Response::new(RespBody::full(body));
    *resp.status_mut() = cause.status();
    let h = resp.headers_mut();
    h.insert(
        CAUSE_HEADER,
        HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("internal")),
    );
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Kind, NoPeersReason};

    #[test]
    fn every_cause_maps_to_status_and_header() {
        let r = response(&ProxyError::new(Kind::NoPeers(
            NoPeersReason::NeverResolved,
        )));
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[CAUSE_HEADER], "no_peers; reason=never_resolved");
        let r = response(&ProxyError::new(Kind::Connect));
        assert_eq!(
            (
                r.status().as_u16(),
                r.headers()[CAUSE_HEADER].to_str().unwrap()
            ),
            (502, "connect_failed")
        );
        let r = response(&ProxyError::new(Kind::Tls));
        assert_eq!(
            (
                r.status().as_u16(),
                r.headers()[CAUSE_HEADER].to_str().unwrap()
            ),
            (502, "upstream_tls")
        );
        let r = response(&ProxyError::new(Kind::Timeout));
        assert_eq!(
            (
                r.status().as_u16(),
                r.headers()[CAUSE_HEADER].to_str().unwrap()
            ),
            (504, "upstream_timeout")
        );
        let r = response(&ProxyError::new(Kind::NoRoute));
        assert_eq!(r.status(), 404);
        let r = response(&ProxyError::new(Kind::RetryBudget));
        assert_eq!(
            (
                r.status().as_u16(),
                r.headers()[CAUSE_HEADER].to_str().unwrap()
            ),
            (503, "retry_budget")
        );
    }
}
