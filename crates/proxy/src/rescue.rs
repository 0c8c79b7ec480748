//! The one place where a typed failure becomes a response: status, cause header, short body;
//! for a gRPC request, a gRPC error (HTTP 200, `grpc-status`, the cause in `grpc-message`).

use http::{HeaderValue, Response};

use crate::body::RespBody;
use crate::error::{Cause, ProxyError};

/// Response header carrying the cause code of a response upkeep generated.
pub const CAUSE_HEADER: &str = "upkeep-error";

/// The response for a failure.
pub fn response(err: &ProxyError) -> Response<RespBody> {
    generated(err.cause(), err.detail())
}

/// The response for a failure of a request that was gRPC (`grpc`) or not.
pub fn response_for(err: &ProxyError, grpc: bool) -> Response<RespBody> {
    if grpc {
        generated_grpc(err.cause(), err.detail())
    } else {
        response(err)
    }
}

/// A generated gRPC error: a Trailers-Only response (HTTP 200, `grpc-status` and
/// `grpc-message` in the head, no body), carrying the cause header like every other.
pub fn generated_grpc(cause: Cause, detail: Option<&str>) -> Response<RespBody> {
    let mut resp = generated(cause, detail);
    let text = match detail {
        Some(d) => format!("upkeep: {} ({d})", cause.as_str()),
        None => format!("upkeep: {}", cause.as_str()),
    };
    *resp.status_mut() = http::StatusCode::OK;
    *resp.body_mut() = RespBody::empty();
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(
        crate::grpc::GRPC_STATUS,
        HeaderValue::from(crate::grpc::code(cause) as u16),
    );
    if let Ok(v) = HeaderValue::from_str(&crate::grpc::encode_message(&text)) {
        h.insert(crate::grpc::GRPC_MESSAGE, v);
    }
    resp
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
        let r = response_for(&ProxyError::new(Kind::Timeout), true);
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "application/grpc");
        assert_eq!(r.headers()["grpc-status"], "4");
        assert_eq!(r.headers()["grpc-message"], "upkeep: upstream_timeout");
        assert_eq!(r.headers()[CAUSE_HEADER], "upstream_timeout");
        let r = response_for(&ProxyError::new(Kind::Connect), true);
        assert_eq!(r.headers()["grpc-status"], "14");
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
