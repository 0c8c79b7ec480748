//! `upkeep lab kube`: a fake Kubernetes API server for EndpointSlice discovery. Real HTTP
//! list and watch on the wire (EndpointSlice JSON as the API server sends it, watch events as
//! JSON lines, bookmarks, 410 Gone as an ERROR event), with faults switched over the lab's
//! control endpoint: unreachable, 5xx, slow, watch cut, history compacted (410), slices
//! emptied, endpoints terminating, Service deleted. With a certificate it serves HTTPS, and
//! with a token it answers 401 to requests without `Authorization: Bearer TOKEN`, as an API
//! server does for a service account.

pub mod store;

#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

use crate::control::{self, Handler};
pub use store::{Endpoint, Event, Store};

type Body = BoxBody<Bytes, Infallible>;

/// A fault of the fake API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answers normally.
    None,
    /// The listener is closed: connections are refused, open ones cut.
    Unreachable,
    /// Every API request gets 503 with a Status object.
    Error,
    /// Every API request waits this long before its answer.
    Slow(Duration),
}

struct Inner {
    addr: SocketAddr,
    store: Mutex<Store>,
    events: broadcast::Sender<Event>,
    cut: watch::Sender<u64>,
    fault: Mutex<Fault>,
    bookmark_every: Duration,
    requests: Mutex<Vec<String>>,
    accept: Mutex<Option<JoinHandle<()>>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    token: Option<String>,
}

/// How the fake API server authenticates itself and its clients.
#[derive(Clone, Default)]
pub struct Security {
    /// Serve HTTPS with this certificate (and key).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Require `Authorization: Bearer TOKEN` on every API request (401 otherwise).
    pub token: Option<String>,
}

impl Security {
    /// HTTPS from a PEM certificate chain and a PEM private key.
    pub fn tls_from_pem(
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> std::io::Result<Arc<rustls::ServerConfig>> {
        let bad = |what: &str, p: &std::path::Path, e: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{what} {}: {e}", p.display()),
            )
        };
        let certs: Vec<_> =
            rustls_pemfile::certs(&mut std::io::BufReader::new(std::fs::File::open(cert)?))
                .collect::<Result<_, _>>()
                .map_err(|e| bad("certificate", cert, e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("certificate", cert, "no CERTIFICATE block".into()));
        }
        let key_der =
            rustls_pemfile::private_key(&mut std::io::BufReader::new(std::fs::File::open(key)?))
                .map_err(|e| bad("key", key, e.to_string()))?
                .ok_or_else(|| bad("key", key, "no PRIVATE KEY block".into()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("certificate", cert, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key_der)
            .map_err(|e| bad("certificate", cert, e.to_string()))?;
        Ok(Arc::new(cfg))
    }
}

/// A running fake API server.
#[derive(Clone)]
pub struct FakeKube {
    inner: Arc<Inner>,
}

impl FakeKube {
    /// Binds `addr` and serves; watches that ask for bookmarks get one every `bookmark_every`.
    pub async fn start(addr: SocketAddr, bookmark_every: Duration) -> std::io::Result<Self> {
        Self::start_secured(addr, bookmark_every, Security::default()).await
    }

    /// As [`FakeKube::start`], over HTTPS and/or with a bearer token when `security` says so.
    pub async fn start_secured(
        addr: SocketAddr,
        bookmark_every: Duration,
        security: Security,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let inner = Arc::new(Inner {
            addr: listener.local_addr()?,
            store: Mutex::new(Store::default()),
            events: broadcast::channel(1024).0,
            cut: watch::channel(0).0,
            fault: Mutex::new(Fault::None),
            bookmark_every,
            requests: Mutex::new(Vec::new()),
            accept: Mutex::new(None),
            tls: security.tls.map(tokio_rustls::TlsAcceptor::from),
            token: security.token,
        });
        let kube = Self { inner };
        kube.serve(listener);
        Ok(kube)
    }

    /// The API server's URL: `http://ADDR`, or `https://ADDR` with a certificate.
    pub fn url(&self) -> String {
        let scheme = if self.inner.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.inner.addr)
    }

    /// The API server's address (`http://ADDR` as a kubeconfig server).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Changes the objects and streams the resulting events to open watches.
    pub fn update(&self, f: impl FnOnce(&mut Store) -> Vec<Event>) {
        let mut store = self.inner.store.lock().unwrap();
        // Sent under the lock, so a watch that subscribes and reads history under it too
        // sees each event exactly once.
        for e in f(&mut store) {
            let _ = self.inner.events.send(e);
        }
    }

    /// Ends every open connection (watches included); clients must reconnect and resume.
    pub fn cut(&self) {
        self.inner.cut.send_modify(|g| *g += 1);
    }

    /// Compacts the history and cuts the watches: resuming gets 410 Gone, a re-list follows.
    pub fn gone(&self) {
        self.inner.store.lock().unwrap().compact();
        self.cut();
    }

    /// Switches the fault.
    pub fn set_fault(&self, fault: Fault) -> std::io::Result<()> {
        let was = std::mem::replace(&mut *self.inner.fault.lock().unwrap(), fault);
        if fault == Fault::Unreachable && was != Fault::Unreachable {
            if let Some(t) = self.inner.accept.lock().unwrap().take() {
                t.abort();
            }
            self.cut();
        } else if was == Fault::Unreachable && fault != Fault::Unreachable {
            let std = std::net::TcpListener::bind(self.inner.addr)?;
            std.set_nonblocking(true)?;
            self.serve(TcpListener::from_std(std)?);
        }
        Ok(())
    }

    /// One line per API request: `METHOD PATH?QUERY STATUS`.
    pub fn requests(&self) -> Vec<String> {
        self.inner.requests.lock().unwrap().clone()
    }

    fn serve(&self, listener: TcpListener) {
        let inner = self.inner.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let inner = inner.clone();
                let mut cut = inner.cut.subscribe();
                tokio::spawn(async move {
                    let tls = inner.tls.clone();
                    let svc = hyper::service::service_fn(move |req| {
                        let inner = inner.clone();
                        async move { Ok::<_, Infallible>(api(&inner, req).await) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    let served = async {
                        match tls {
                            // A handshake the client refuses (unknown CA) just ends here.
                            Some(acceptor) => {
                                if let Ok(s) = acceptor.accept(stream).await {
                                    let _ = http.serve_connection(TokioIo::new(s), svc).await;
                                }
                            }
                            None => {
                                let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                            }
                        }
                    };
                    tokio::select! {
                        _ = served => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        *self.inner.accept.lock().unwrap() = Some(task);
    }

    /// The control endpoint's handler: `/endpoints` (optionally one `slice`), `/move`, `/terminate`, `/empty`, `/delete`,
    /// `/fault`, `/cut`, `/gone`, `/requests`, `/state`.
    pub fn control_handler(&self) -> Handler {
        let kube = self.clone();
        Arc::new(move |path, q| kube.control(path, q))
    }

    fn control(&self, path: &str, q: &std::collections::BTreeMap<String, String>) -> (u16, String) {
        let service = q.get("service").and_then(|s| s.split_once('/'));
        let addrs = |key: &str| -> Result<Vec<SocketAddr>, String> {
            q.get(key)
                .map_or("", String::as_str)
                .split(',')
                .filter(|a| !a.is_empty())
                .map(|a| {
                    a.parse()
                        .map_err(|_| format!("{key}: {a:?} is not IP:PORT\n"))
                })
                .collect()
        };
        match (path, service) {
            ("/endpoints", Some((ns, name))) => {
                let (ready, term) = match (addrs("ready"), addrs("terminating")) {
                    (Ok(r), Ok(t)) => (r, t),
                    (Err(e), _) | (_, Err(e)) => return (400, e),
                };
                let zone = q.get("zone").cloned();
                let eps = ready
                    .into_iter()
                    .map(Endpoint::ready)
                    .chain(term.into_iter().map(Endpoint::terminating))
                    .map(|e| Endpoint { zone: zone.clone(), ..e })
                    .collect();
                let port = q.get("port_name").map_or("http", String::as_str);
                match q.get("slice") {
                    // One slice group only: the others keep their endpoints.
                    Some(g) => self.update(|s| s.set_slice(ns, name, port, g, eps)),
                    None => self.update(|s| s.set_endpoints(ns, name, port, eps)),
                }
                (200, format!("{ns}/{name} set\n"))
            }
            ("/move", Some((ns, name))) => match addrs("addrs") {
                Ok(a) => {
                    let from = q.get("from").map_or("", String::as_str);
                    let to = q.get("to").map_or("", String::as_str);
                    self.update(|s| s.move_endpoints(ns, name, from, to, &a));
                    (200, format!("{ns}/{name}: {} moved from {from:?} to {to:?}\n", a.len()))
                }
                Err(e) => (400, e),
            },
            ("/terminate", Some((ns, name))) => match addrs("addrs") {
                Ok(a) => {
                    self.update(|s| s.terminate(ns, name, &a));
                    (200, format!("{ns}/{name}: {} terminating\n", a.len()))
                }
                Err(e) => (400, e),
            },
            ("/empty", Some((ns, name))) => {
                self.update(|s| {
                    let port = "http";
                    s.set_endpoints(ns, name, port, Vec::new())
                });
                (200, format!("{ns}/{name} emptied\n"))
            }
            ("/delete", Some((ns, name))) => {
                self.update(|s| s.delete_service(ns, name));
                (200, format!("{ns}/{name} deleted\n"))
            }
            ("/fault", _) => {
                let fault = match q.get("set").map(String::as_str) {
                    Some("none") => Fault::None,
                    Some("unreachable") => Fault::Unreachable,
                    Some("5xx") => Fault::Error,
                    Some("slow") => match q.get("delay").and_then(|d| crate::duration::parse(d).ok()) {
                        Some(d) => Fault::Slow(d),
                        None => return (400, "slow needs delay=DURATION\n".into()),
                    },
                    _ => return (400, "set=none|unreachable|5xx|slow\n".into()),
                };
                match self.set_fault(fault) {
                    Ok(()) => (200, format!("fault {fault:?}\n")),
                    Err(e) => (500, format!("{e}\n")),
                }
            }
            ("/cut", _) => {
                self.cut();
                (200, "watches cut\n".into())
            }
            ("/gone", _) => {
                self.gone();
                (200, "history compacted, watches cut\n".into())
            }
            ("/requests", _) => (200, self.requests().join("\n") + "\n"),
            ("/state", _) => {
                let s = self.inner.store.lock().unwrap();
                (200, json!({"resourceVersion": s.resource_version().to_string()}).to_string() + "\n")
            }
            _ => (
                404,
                "paths: /endpoints?service=NS/NAME&ready=IP:PORT,..&terminating=..&zone=, /terminate?service=&addrs=, /empty?service=, /delete?service=, /fault?set=none|unreachable|5xx|slow&delay=, /cut, /gone, /requests, /state\n".into(),
            ),
        }
    }
}

/// A kubeconfig whose current context is the fake API server at `addr` (plain HTTP, no
/// credentials), as a target reads it.
pub fn kubeconfig(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: lab\ncurrent-context: lab\nusers:\n- name: lab\n  user: {{}}\n"
    )
}

/// Starts the server and, if asked, its control endpoint.
pub async fn start(
    listen: SocketAddr,
    control_addr: Option<SocketAddr>,
    bookmark_every: Duration,
    security: Security,
) -> std::io::Result<(FakeKube, Option<SocketAddr>)> {
    let kube = FakeKube::start_secured(listen, bookmark_every, security).await?;
    let control = match control_addr {
        None => None,
        Some(a) => Some(control::serve(a, kube.control_handler()).await?),
    };
    Ok((kube, control))
}

fn full(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// A `Status` object, as the API server answers errors.
fn status(code: StatusCode, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    })
}

/// Percent-decoding of a query value (`kubernetes.io%2Fservice-name%3Dapp`).
fn decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn api(inner: &Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let q: std::collections::BTreeMap<String, String> = control::query_map(Some(&query))
        .into_iter()
        .map(|(k, v)| (k, decode(&v)))
        .collect();
    let fault = *inner.fault.lock().unwrap();
    if let Fault::Slow(d) = fault {
        tokio::time::sleep(d).await;
    }
    let authorized = inner.token.as_ref().is_none_or(|t| {
        req.headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            == Some(t.as_str())
    });
    let resp = if !authorized {
        let s = status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
        full(StatusCode::UNAUTHORIZED, s.to_string())
    } else if fault == Fault::Error {
        let s = status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
        full(StatusCode::SERVICE_UNAVAILABLE, s.to_string())
    } else {
        route(inner, &path, &q)
    };
    inner.requests.lock().unwrap().push(format!(
        "{} {path}?{query} {}",
        req.method(),
        resp.status().as_u16()
    ));
    resp
}

fn route(
    inner: &Arc<Inner>,
    path: &str,
    q: &std::collections::BTreeMap<String, String>,
) -> Response<Body> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", "v1", "namespaces", ns, "services", name] => {
            match inner.store.lock().unwrap().service(ns, name) {
                Some(s) => full(StatusCode::OK, s.to_string()),
                None => {
                    let msg = format!("services \"{name}\" not found");
                    full(
                        StatusCode::NOT_FOUND,
                        status(StatusCode::NOT_FOUND, "NotFound", &msg).to_string(),
                    )
                }
            }
        }
        ["apis", "discovery.k8s.io", "v1", "namespaces", ns, "endpointslices"] => {
            let selector = q.get("labelSelector").map(String::as_str).unwrap_or("");
            let service = match selector {
                "" => None,
                s => match s.strip_prefix("kubernetes.io/service-name=") {
                    Some(name) => Some(name.to_owned()),
                    None => {
                        let msg = format!(
                            "this fake selects by kubernetes.io/service-name only, not {s:?}"
                        );
                        return full(
                            StatusCode::BAD_REQUEST,
                            status(StatusCode::BAD_REQUEST, "BadRequest", &msg).to_string(),
                        );
                    }
                },
            };
            let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
            if watching {
                watch_slices(inner, ns, service, q)
            } else {
                let store = inner.store.lock().unwrap();
                let list = json!({
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSliceList",
                    "metadata": {"resourceVersion": store.resource_version().to_string()},
                    "items": store.list(ns, service.as_deref()),
                });
                full(StatusCode::OK, list.to_string())
            }
        }
        _ => full(
            StatusCode::NOT_FOUND,
            status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            )
            .to_string(),
        ),
    }
}

fn line(kind: &str, object: &Value) -> Bytes {
    Bytes::from(json!({"type": kind, "object": object}).to_string() + "\n")
}

fn watch_slices(
    inner: &Arc<Inner>,
    ns: &str,
    service: Option<String>,
    q: &std::collections::BTreeMap<String, String>,
) -> Response<Body> {
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(Duration::from_secs(3600), Duration::from_secs);
    let from = q
        .get("resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| *v > 0);
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let (mut events, backlog, mut seen) = {
        let store = inner.store.lock().unwrap();
        let events = inner.events.subscribe();
        let now = store.resource_version();
        let backlog = match from {
            // No resourceVersion: the current objects as ADDED, then changes.
            None => Ok(store
                .list(ns, service.as_deref())
                .into_iter()
                .map(|o| line("ADDED", &o))
                .collect::<Vec<_>>()),
            Some(v) => store
                .since(v, ns, service.as_deref())
                .map(|evs| evs.iter().map(|e| line(e.kind, &e.object)).collect()),
        };
        (events, backlog, now)
    };
    let backlog = match backlog {
        Ok(b) => b,
        Err(e) => {
            // As the API server does: 200, one ERROR event carrying a 410 Status, end.
            let msg = format!(
                "too old resource version: {} ({})",
                from.unwrap_or(0),
                e.oldest
            );
            let body = line("ERROR", &status(StatusCode::GONE, "Expired", &msg));
            return full(StatusCode::OK, String::from_utf8_lossy(&body).into_owned());
        }
    };
    let (ns, bookmark_every) = (ns.to_owned(), inner.bookmark_every);
    tokio::spawn(async move {
        for b in backlog {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let mut tick = tokio::time::interval(bookmark_every);
        tick.tick().await;
        let end = tokio::time::sleep(timeout);
        tokio::pin!(end);
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Ok(e) => {
                        seen = seen.max(e.rv);
                        let mine = e.namespace == ns && service.as_deref().is_none_or(|s| {
                            e.object["metadata"]["labels"]["kubernetes.io/service-name"].as_str() == Some(s)
                        });
                        if mine && tx.send(line(e.kind, &e.object)).await.is_err() {
                            return;
                        }
                    }
                    // A watcher that fell behind is ended; it resumes or re-lists.
                    Err(_) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    let obj = json!({
                        "kind": "EndpointSlice",
                        "apiVersion": "discovery.k8s.io/v1",
                        "metadata": {"resourceVersion": seen.to_string()},
                    });
                    if tx.send(line("BOOKMARK", &obj)).await.is_err() {
                        return;
                    }
                }
                _ = &mut end => return,
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}
