//! The bearer token `POST /reload` and `POST /upgrade` require when `[admin] token_file` is set. The file is
//! read on each reload request, so a rotated Secret applies without a restart, and the
//! comparison takes the same time wherever the first differing byte is.

use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;

use super::text;
use crate::state::Shared;

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum Denied {
    /// No `Authorization: Bearer` header.
    #[error("no bearer token")]
    Missing,
    /// A token that is not the configured one.
    #[error("wrong bearer token")]
    Wrong,
    /// The token file could not be read: refuse rather than let anyone in.
    #[error("token file {file} cannot be read: {source}")]
    Unreadable {
        /// The file.
        file: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Denied {
    /// 401 with a `WWW-Authenticate` challenge.
    pub(super) fn response(self) -> Response<Full<Bytes>> {
        let mut r = text(
            StatusCode::UNAUTHORIZED,
            "POST /reload and POST /upgrade need Authorization: Bearer <the token in [admin] token_file>\n".into(),
            "text/plain",
        );
        r.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer realm=\"upkeep admin\""),
        );
        r
    }
}

/// Allows the request when no token is configured or when it carries the configured one.
pub(super) fn authorize(
    headers: &HeaderMap,
    shared: &Shared,
    peer: SocketAddr,
) -> Result<(), Denied> {
    let state = shared.state.load();
    let Some(file) = &state.config.admin.token_file else {
        return Ok(());
    };
    let result = check(headers, file);
    if let Err(e) = &result {
        tracing::warn!(admin.peer = %peer, error = %e, "reload refused: not authorized");
    }
    result
}

fn check(headers: &HeaderMap, file: &Path) -> Result<(), Denied> {
    let expected = std::fs::read_to_string(file).map_err(|source| Denied::Unreadable {
        file: file.display().to_string(),
        source,
    })?;
    let expected = expected.trim();
    if expected.is_empty() {
        // `upkeep check` refuses an empty file; one emptied since must not open the door.
        return Err(Denied::Unreadable {
            file: file.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "empty"),
        });
    }
    let given = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .ok_or(Denied::Missing)?;
    if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(Denied::Wrong)
    }
}

/// Equality whose time depends on the lengths only, not on where the bytes differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(http::header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    #[test]
    fn constant_time_eq_compares_whole_values() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn only_the_configured_bearer_token_is_accepted() {
        let dir = std::env::temp_dir().join(format!("upkeep-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        assert!(check(&headers(Some("Bearer s3cret")), &file).is_ok());
        assert!(check(&headers(Some("bearer  s3cret ")), &file).is_ok());
        assert!(matches!(check(&headers(None), &file), Err(Denied::Missing)));
        assert!(matches!(
            check(&headers(Some("Basic czNjcmV0")), &file),
            Err(Denied::Missing)
        ));
        assert!(matches!(
            check(&headers(Some("Bearer s3cre")), &file),
            Err(Denied::Wrong)
        ));
        std::fs::write(&file, "  \n").unwrap();
        assert!(matches!(
            check(&headers(Some("Bearer ")), &file),
            Err(Denied::Unreadable { .. })
        ));
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(
            check(&headers(Some("Bearer s3cret")), &file),
            Err(Denied::Unreadable { .. })
        ));
    }
}
