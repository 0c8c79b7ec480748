//! The admin listeners: probes that answer from memory (no I/O when asked, so a slow
//! dependency cannot make a probe time out), metrics, the upstreams view, and reload. The
//! control listener serves all of it; the optional probe listener serves only GET probes, so
//! kubelet can reach a pod-IP port that cannot reload anything.

mod accept;
mod token;

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use crate::config::AdminConfig;
use crate::state::Shared;

/// Re-reads and applies the config file; the error lists every problem.
pub type Reload = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Starts a binary upgrade and answers once the new process is ready, or why it is not.
pub type Upgrade = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
        + Send
        + Sync,
>;

/// What an admin listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Probes, metrics, upstreams and reload.
    Control,
    /// GET probes only.
    Probes,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Control => "control",
            Role::Probes => "probes",
        }
    }
}

/// One named check of a probe.
struct Check {
    name: String,
    ok: bool,
    note: String,
}

/// The admin listeners, bound and not yet serving.
pub struct Bound {
    control: TcpListener,
    probes: Option<TcpListener>,
    config: AdminConfig,
}

/// Binds the control listener and, when configured, the probe listener; on failure, the
/// address that could not be bound.
pub async fn bind(config: &AdminConfig) -> Result<Bound, (SocketAddr, std::io::Error)> {
    bind_or_take(config, None).await
}

/// Like `bind`, taking the listeners handed over by the process this one upgraded when
/// they are there.
pub(crate) async fn bind_or_take(
    config: &AdminConfig,
    inherited: Option<&crate::server::Inherited>,
) -> Result<Bound, (SocketAddr, std::io::Error)> {
    use crate::server::HandoverKind;
    let one = |kind, addr: SocketAddr| async move {
        match inherited.and_then(|i| i.take_admin(kind, addr)) {
            Some(l) => l.and_then(TcpListener::from_std).map_err(|e| (addr, e)),
            None => TcpListener::bind(addr).await.map_err(|e| (addr, e)),
        }
    };
    let control = one(HandoverKind::AdminControl, config.listen).await?;
    let probes = match config.probes {
        Some(a) => Some(one(HandoverKind::AdminProbes, a).await?),
        None => None,
    };
    Ok(Bound {
        control,
        probes,
        config: config.clone(),
    })
}

impl Bound {
    /// The bound control address.
    pub fn control_addr(&self) -> std::io::Result<SocketAddr> {
        self.control.local_addr()
    }

    /// The bound probe address, when there is a probe listener.
    pub fn probes_addr(&self) -> Option<SocketAddr> {
        self.probes.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Duplicates of the listening sockets, named by configured address, for a binary
    /// upgrade.
    pub(crate) fn handover(&self) -> std::io::Result<Vec<crate::server::Handed>> {
        use crate::server::{Handed, HandoverKind};
        use std::os::fd::AsFd;
        let mut out = vec![Handed {
            kind: HandoverKind::AdminControl,
            addr: self.config.listen,
            fd: self.control.as_fd().try_clone_to_owned()?,
        }];
        if let (Some(p), Some(addr)) = (&self.probes, self.config.probes) {
            out.push(Handed {
                kind: HandoverKind::AdminProbes,
                addr,
                fd: p.as_fd().try_clone_to_owned()?,
            });
        }
        Ok(out)
    }

    /// Serves every admin listener until the returned task is aborted.
    pub fn serve(self, shared: Arc<Shared>, reload: Reload) -> tokio::task::JoinHandle<()> {
        self.serve_with(shared, reload, None, TaskTracker::new())
    }

    /// Like `serve`, with `POST /upgrade` when `upgrade` is given; admin connections are
    /// tracked by `conns`, so an upgrade can let the answer reach its caller before exit.
    pub(crate) fn serve_with(
        self,
        shared: Arc<Shared>,
        reload: Reload,
        upgrade: Option<Upgrade>,
        conns: TaskTracker,
    ) -> tokio::task::JoinHandle<()> {
        let Bound {
            control,
            probes,
            config,
        } = self;
        tokio::spawn(async move {
            let limits = accept::Limits::from(&config);
            let hooks = accept::Hooks {
                reload,
                upgrade,
                conns,
            };
            let control = accept::serve(
                control,
                Role::Control,
                limits,
                shared.clone(),
                hooks.clone(),
            );
            match probes {
                Some(p) => {
                    let probes = accept::serve(p, Role::Probes, limits, shared, hooks);
                    tokio::join!(control, probes);
                }
                None => control.await,
            }
        })
    }
}

/// Serves the admin endpoints on one control listener until the process exits.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    reload: Arc<dyn Fn() -> Result<String, String> + Send + Sync>,
) {
    let limits = accept::Limits::from(&shared.state.load().config.admin);
    let hooks = accept::Hooks {
        reload,
        upgrade: None,
        conns: TaskTracker::new(),
    };
    accept::serve(listener, Role::Control, limits, shared, hooks).await
}

fn route(
    req: Request<Incoming>,
    role: Role,
    peer: SocketAddr,
    shared: &Shared,
    reload: &dyn Fn() -> Result<String, String>,
) -> Response<Full<Bytes>> {
    if role == Role::Probes {
        if let Some(refused) = probes_only(&req) {
            return refused;
        }
    }
    let verbose = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    });
    match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/livez") => probe(
            "livez",
            vec![Check {
                name: "ping".into(),
                ok: true,
                note: String::new(),
            }],
            verbose,
        ),
        (&Method::GET | &Method::HEAD, "/readyz") => probe("readyz", readiness(shared), verbose),
        (&Method::GET | &Method::HEAD, "/startupz") => probe("startupz", startup(shared), verbose),
        (&Method::GET, "/metrics") => metrics(&req, shared),
        (&Method::GET, "/upstreams") => {
            let state = shared.state.load();
            let groups: serde_json::Map<String, serde_json::Value> = state
                .groups
                .iter()
                .map(|(n, g)| (n.clone(), g.view()))
                .collect();
            let body = serde_json::to_string_pretty(
                &serde_json::json!({ "draining": shared.is_draining(), "groups": groups }),
            )
            .unwrap_or_default();
            text(StatusCode::OK, body, "application/json")
        }
        (&Method::POST, "/reload") => {
            if let Err(denied) = token::authorize(req.headers(), shared, peer) {
                return denied.response();
            }
            match reload() {
                Ok(report) => text(StatusCode::OK, format!("reloaded\n{report}"), "text/plain"),
                Err(e) => text(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("reload refused, old config kept:\n{e}\n"),
                    "text/plain",
                ),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
    }
}

/// `POST /upgrade`: authorized like `/reload`; answers once the new process is ready (200),
/// or why it is not (500, this process keeps serving).
async fn upgrade(
    req: &Request<Incoming>,
    peer: SocketAddr,
    shared: &Shared,
    upgrade: Option<&Upgrade>,
) -> Response<Full<Bytes>> {
    if let Err(denied) = token::authorize(req.headers(), shared, peer) {
        return denied.response();
    }
    let Some(upgrade) = upgrade else {
        return text(
            StatusCode::NOT_IMPLEMENTED,
            "this upkeep was not started by `upkeep serve`: it cannot upgrade\n".into(),
            "text/plain",
        );
    };
    match upgrade().await {
        Ok(report) => text(StatusCode::OK, format!("upgraded\n{report}"), "text/plain"),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("upgrade failed, this process keeps serving:\n{e}\n"),
            "text/plain",
        ),
    }
}

/// The Prometheus text format, or OpenMetrics when `Accept` asks for it.
fn metrics<B>(req: &Request<B>, shared: &Shared) -> Response<Full<Bytes>> {
    let accept = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let format = crate::metrics::Format::negotiate(accept);
    let state = shared.state.load();
    let body = crate::metrics::scrape(&shared.metrics, state.groups.iter(), format);
    let mut r = text(StatusCode::OK, body, format.content_type());
    r.headers_mut()
        .insert(http::header::VARY, http::HeaderValue::from_static("accept"));
    r
}

/// The probe listener: GET (and HEAD) on the three probe paths, nothing else.
fn probes_only(req: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "the probe listener answers GET /livez, /readyz and /startupz only\n".into(),
            "text/plain",
        );
        r.headers_mut().insert(
            http::header::ALLOW,
            http::HeaderValue::from_static("GET, HEAD"),
        );
        return Some(r);
    }
    match req.uri().path() {
        "/livez" | "/readyz" | "/startupz" => None,
        _ => Some(text(
            StatusCode::NOT_FOUND,
            "not found\n".into(),
            "text/plain",
        )),
    }
}

fn readiness(shared: &Shared) -> Vec<Check> {
    let mut checks = vec![Check {
        name: "draining".into(),
        ok: !shared.is_draining(),
        note: if shared.is_draining() {
            "shutting down".into()
        } else {
            String::new()
        },
    }];
    let state = shared.state.load();
    let mut names: Vec<_> = state.groups.keys().collect();
    names.sort();
    for name in names {
        let g = &state.groups[name];
        let reason = g.unusable_reason();
        let required = g.config().required;
        checks.push(Check {
            name: format!("group:{name}"),
            // An optional group that is down is degraded: reported, never failing readiness.
            ok: reason.is_none() || !required,
            note: match (reason, required) {
                (None, _) => String::new(),
                (Some(r), true) => format!("no_peers ({})", r.as_str()),
                (Some(r), false) => format!("degraded, optional: no_peers ({})", r.as_str()),
            },
        });
    }
    checks
}

fn startup(shared: &Shared) -> Vec<Check> {
    let state = shared.state.load();
    let settled = state.groups.values().all(|g| g.discovery_settled());
    vec![
        Check {
            name: "config".into(),
            ok: !state.groups.is_empty() || !state.config.routes.is_empty(),
            note: String::new(),
        },
        Check {
            name: "listeners".into(),
            ok: shared.listeners_bound(),
            note: String::new(),
        },
        Check {
            name: "discovery".into(),
            ok: settled,
            note: if settled {
                String::new()
            } else {
                "first lookups pending".into()
            },
        },
    ]
}

/// kube-apiserver style: `ok` or, with `?verbose`, one `[+]name ok` / `[-]name failed` line a check.
fn probe(name: &str, checks: Vec<Check>, verbose: bool) -> Response<Full<Bytes>> {
    let ok = checks.iter().all(|c| c.ok);
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = String::new();
    if verbose || !ok {
        for c in &checks {
            let _ = match (c.ok, c.note.is_empty()) {
                (true, true) => writeln!(body, "[+]{} ok", c.name),
                (true, false) => writeln!(body, "[+]{} ok: {}", c.name, c.note),
                (false, _) => writeln!(body, "[-]{} failed: {}", c.name, c.note),
            };
        }
        let _ = writeln!(
            body,
            "{name} check {}",
            if ok { "passed" } else { "failed" }
        );
    } else {
        body.push_str("ok\n");
    }
    text(status, body, "text/plain; charset=utf-8")
}

fn text(status: StatusCode, body: String, ctype: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(ctype),
    );
    r.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    r
}
