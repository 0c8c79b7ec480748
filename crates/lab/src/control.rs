//! A small HTTP control endpoint for `lab dns` and `lab backend`: switch modes and faults at
//! run time with `curl -X POST 'http://ADDR/fault?set=refuse'`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Handles `(path, query)` and returns `(status, body)`.
pub type Handler = Arc<dyn Fn(&str, &BTreeMap<String, String>) -> (u16, String) + Send + Sync>;

/// Splits `a=1&b=2` (no percent-decoding; values here are names, modes and durations).
pub fn query_map(query: Option<&str>) -> BTreeMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (p.to_owned(), String::new()),
        })
        .collect()
}

/// Serves `handler` on `addr` until the task is dropped; returns the bound address.
pub async fn serve(addr: SocketAddr, handler: Handler) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let q = query_map(req.uri().query());
                        let (status, body) = handler(req.uri().path(), &q);
                        let mut resp = http::Response::new(Full::new(Bytes::from(body)));
                        *resp.status_mut() =
                            http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
                        async move { Ok::<_, Infallible>(resp) }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_pairs_are_split() {
        let q = query_map(Some("name=app.upkeep.test&mode=nxdomain&flag"));
        assert_eq!(q["name"], "app.upkeep.test");
        assert_eq!(q["mode"], "nxdomain");
        assert_eq!(q["flag"], "");
        assert!(query_map(None).is_empty());
    }
}
