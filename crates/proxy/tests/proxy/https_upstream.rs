//! HTTPS upstreams end to end: nginx as the TLS backend on a loopback port, certificates from a
//! test CA made here, upkeep in-process in front of it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use upkeep_test_support::get;

use crate::support::{metric, upkeep};

/// The name on nginx's certificate and the SNI upkeep must send.
const NAME: &str = "backend.upkeep.test";

/// A scratch directory removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "upkeep-https-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA that signs leaf certificates, written as PEM files into `dir`.
struct Ca {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Ca {
    fn new(dir: &Dir, file: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("upkeep test CA {file}"));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        std::fs::write(dir.0.join(file), issuer.pem()).unwrap();
        Self { issuer }
    }

    /// A leaf for `name` as `<stem>.pem` and `<stem>.key`.
    fn leaf(&self, dir: &Dir, stem: &str, name: &str, client: bool) {
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![if client {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        }];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(dir.0.join(format!("{stem}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.0.join(format!("{stem}.key")), key.serialize_pem()).unwrap();
    }
}

fn nginx_binary() -> Option<PathBuf> {
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    candidates
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// nginx serving TLS on a loopback port with `server.pem`/`server.key` from `dir`; killed on drop.
struct Nginx {
    child: Child,
    addr: SocketAddr,
    error_log: String,
}

impl Nginx {
    /// `None` (after saying so) when nginx is not installed outside CI; in CI that fails.
    async fn start(dir: &Dir, server_extra: &str) -> Option<Self> {
        let Some(bin) = nginx_binary() else {
            // .ci/run installs nginx; there a missing nginx is a failure, not a skip.
            assert!(
                std::env::var_os("CI").is_none(),
                "nginx is installed by .ci/run"
            );
            eprintln!("skipped: nginx is not installed");
            return None;
        };
        // A free port from the OS; nginx binds it right after.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let d = dir.0.display();
        let temps: String = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
            .iter()
            .map(|t| format!("  {t}_temp_path {d}/{t}_temp;\n"))
            .collect();
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log info;\nevents {{ worker_connections 64; }}\nhttp {{\n\
             access_log {d}/access.log;\n{temps}\
             server {{\n\
               listen {addr} ssl;\n\
               ssl_certificate {d}/server.pem;\n\
               ssl_certificate_key {d}/server.key;\n\
               {server_extra}\n\
               location / {{ return 200 \"tls sni=$ssl_server_name alpn=$ssl_alpn_protocol client=$ssl_client_verify\\n\"; }}\n\
             }}\n}}\n"
        );
        let conf_path = dir.path("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let mut child = Command::new(bin)
            .arg("-p")
            .arg(&dir.0)
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.path("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts");
        let error_log = dir.path("error.log");
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                break;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "nginx exited with {status}:\n{}",
                    std::fs::read_to_string(&error_log).unwrap_or_default()
                );
            }
            assert!(
                tokio::time::Instant::now() < until,
                "nginx did not listen on {addr} within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some(Self {
            child,
            addr,
            error_log,
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.error_log).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One group `app` over nginx as `https://`, with a `[groups.app.tls]` table.
fn config(nginx: SocketAddr, tls: &str, extra: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\ngroup = \"app\"\n\n[groups.app]\nendpoints = [\"https://{nginx}\"]\n\
         connect_timeout = \"2s\"\n{extra}\n\n[groups.app.tls]\n{tls}\n"
    )
}

/// A CA, nginx's certificate for `NAME` signed by it, and a client certificate for mTLS.
fn pki(dir: &Dir) -> Ca {
    let ca = Ca::new(dir, "ca.pem");
    ca.leaf(dir, "server", NAME, false);
    ca.leaf(dir, "client", "client.upkeep.test", true);
    ca
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_https_upstream_gets_sni_and_alpn_http11() {
    let dir = Dir::new("ok");
    pki(&dir);
    let Some(nginx) = Nginx::start(&dir, "").await else {
        return;
    };
    let tls = format!("server_name = \"{NAME}\"\nca = \"{}\"", dir.path("ca.pem"));
    let up = upkeep(&config(nginx.addr, &tls, "")).await;
    let r = get(up.listeners[0], "app.test", "/").await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), nginx.log());
    assert_eq!(
        r.text(),
        format!("tls sni={NAME} alpn=http/1.1 client=NONE\n")
    );
    assert!(r.header("upkeep-error").is_none());
}

#[tokio::test]
async fn second_request_reuses_the_pooled_tls_connection() {
    let dir = Dir::new("reuse");
    pki(&dir);
    let Some(nginx) = Nginx::start(&dir, "keepalive_timeout 30s;").await else {
        return;
    };
    let tls = format!("server_name = \"{NAME}\"\nca = \"{}\"", dir.path("ca.pem"));
    let up = upkeep(&config(nginx.addr, &tls, "")).await;
    for _ in 0..3 {
        let r = get(up.listeners[0], "app.test", "/").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let new = metric(&up, "upkeep_pool_connections_total{event=\"new\"}").await;
    let reused = metric(&up, "upkeep_pool_connections_total{event=\"reused\"}").await;
    let all = get(up.admin, "admin", "/metrics").await.text();
    assert_eq!(
        (new, reused),
        (1.0, 2.0),
        "one TLS handshake, two reuses\n{}",
        all.lines()
            .filter(|l| l.contains("pool"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// nginx closes an idle keep-alive connection (close_notify, FIN) long before upkeep's idle
/// timeout: the liveness check under TLS must keep upkeep from sending on it.
#[tokio::test]
async fn tls_connection_closed_by_nginx_while_idle_is_not_reused() {
    let dir = Dir::new("idle");
    pki(&dir);
    let Some(nginx) = Nginx::start(&dir, "keepalive_timeout 1s;").await else {
        return;
    };
    let tls = format!("server_name = \"{NAME}\"\nca = \"{}\"", dir.path("ca.pem"));
    let up = upkeep(&config(
        nginx.addr,
        &tls,
        "[groups.app.pool]\nidle_timeout = \"30s\"",
    ))
    .await;
    let r = get(up.listeners[0], "app.test", "/").await;
    assert_eq!(r.status, 200, "{}", r.text());
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let r = get(up.listeners[0], "app.test", "/").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let new = metric(&up, "upkeep_pool_connections_total{event=\"new\"}").await;
    let reused = metric(&up, "upkeep_pool_connections_total{event=\"reused\"}").await;
    assert_eq!(
        (new, reused),
        (2.0, 0.0),
        "the closed connection was reused"
    );
    // The first connection was pooled, then dropped as closed (by the sweeper or at checkout).
    let dropped = metric(&up, "upkeep_pool_connections_total{event=\"expired\"}").await
        + metric(
            &up,
            "upkeep_pool_connections_total{event=\"stale_discarded\"}",
        )
        .await;
    assert_eq!(dropped, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_from_another_ca_is_refused_with_upstream_tls() {
    let dir = Dir::new("wrongca");
    pki(&dir);
    let _other = Ca::new(&dir, "other-ca.pem");
    let Some(nginx) = Nginx::start(&dir, "").await else {
        return;
    };
    let tls = format!(
        "server_name = \"{NAME}\"\nca = \"{}\"",
        dir.path("other-ca.pem")
    );
    let up = upkeep(&config(nginx.addr, &tls, "")).await;
    let r = get(up.listeners[0], "app.test", "/").await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("upkeep-error"), Some("upstream_tls"));
    // Counted against the peer like a failed connect.
    let view: serde_json::Value =
        serde_json::from_str(&get(up.admin, "admin", "/upstreams").await.text()).unwrap();
    assert_eq!(
        view["groups"]["app"]["peers"][0]["consecutive_failures"], 1,
        "{view:#}"
    );
    // A name the certificate does not carry is refused the same way.
    let tls = format!(
        "server_name = \"other.upkeep.test\"\nca = \"{}\"",
        dir.path("ca.pem")
    );
    let up = upkeep(&config(nginx.addr, &tls, "")).await;
    let r = get(up.listeners[0], "app.test", "/").await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("upkeep-error"), Some("upstream_tls"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_false_accepts_a_certificate_from_an_unknown_ca() {
    let dir = Dir::new("noverify");
    pki(&dir);
    let Some(nginx) = Nginx::start(&dir, "").await else {
        return;
    };
    let up = upkeep(&config(
        nginx.addr,
        &format!("server_name = \"{NAME}\"\nverify = false"),
        "",
    ))
    .await;
    let r = get(up.listeners[0], "app.test", "/").await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_is_presented_for_mtls() {
    let dir = Dir::new("mtls");
    pki(&dir);
    let verify_client = format!(
        "ssl_client_certificate {};\nssl_verify_client on;",
        dir.path("ca.pem")
    );
    let Some(nginx) = Nginx::start(&dir, &verify_client).await else {
        return;
    };
    let base = format!("server_name = \"{NAME}\"\nca = \"{}\"", dir.path("ca.pem"));
    let with_cert = format!(
        "{base}\ncert = \"{}\"\nkey = \"{}\"",
        dir.path("client.pem"),
        dir.path("client.key")
    );
    let up = upkeep(&config(nginx.addr, &with_cert, "")).await;
    let r = get(up.listeners[0], "app.test", "/").await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), nginx.log());
    assert_eq!(
        r.text(),
        format!("tls sni={NAME} alpn=http/1.1 client=SUCCESS\n")
    );
    // Without the certificate nginx refuses the request itself (400), and upkeep passes that on.
    let up = upkeep(&config(nginx.addr, &base, "")).await;
    let r = get(up.listeners[0], "app.test", "/").await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("No required SSL certificate was sent"),
        "{}",
        r.text()
    );
    assert!(r.header("upkeep-error").is_none());
}

fn parse_err(toml: &str) -> String {
    match upkeep_proxy::config::parse(Path::new("t.toml"), toml) {
        Ok(_) => panic!("accepted:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tls_settings_are_checked_with_positions() {
    let head = "[[listener]]\nlisten = \"127.0.0.1:0\"\n[[route]]\ngroup = \"app\"\n";
    let e = parse_err(&format!(
        "{head}[groups.app]\nendpoints = [\"https://127.0.0.1:1\", \"http://127.0.0.1:2\"]\n"
    ));
    assert!(
        e.contains("t.toml:6:") && e.contains("mixes http:// and https://"),
        "{e}"
    );
    let e = parse_err(&format!(
        "{head}[groups.app]\nendpoints = [\"127.0.0.1:1\"]\n[groups.app.tls]\nverify = false\n"
    ));
    assert!(
        e.contains("t.toml:8:") && e.contains("needs https:// endpoints"),
        "{e}"
    );
    let e = parse_err(&format!(
        "{head}[groups.app]\nendpoints = [\"https://a.test\", \"https://b.test\"]\n"
    ));
    assert!(e.contains("set [groups.app.tls] server_name"), "{e}");
    let e = parse_err(&format!(
        "{head}[groups.app]\nendpoints = [\"https://a.test\"]\n[groups.app.tls]\ncert = \"/nonexistent/c.pem\"\n"
    ));
    assert!(
        e.contains("t.toml:8:") && e.contains("does not exist") && e.contains("tls cert needs key"),
        "{e}"
    );
}

/// A reload keeps a group (its peers' health and its pool) when its settings are unchanged;
/// a rotated PEM file under the same path makes the TLS settings differ, so the group is rebuilt
/// with the new certificate.
#[test]
fn tls_settings_compare_by_file_contents_for_reload() {
    let dir = Dir::new("reload");
    pki(&dir);
    let toml = config(
        "127.0.0.1:1".parse().unwrap(),
        &format!(
            "server_name = \"{NAME}\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"",
            dir.path("ca.pem"),
            dir.path("client.pem"),
            dir.path("client.key")
        ),
        "",
    );
    let load = || upkeep_proxy::config::parse(Path::new("t.toml"), &toml).unwrap();
    let (a, b) = (load(), load());
    assert_eq!(a.groups["app"], b.groups["app"]);
    // Rotate the client certificate in place.
    let ca = Ca::new(&dir, "ca.pem");
    ca.leaf(&dir, "client", "client.upkeep.test", true);
    assert_ne!(a.groups["app"], load().groups["app"]);
}

/// `upkeep check --print` writes https:// endpoints and the tls table back so that they parse
/// to the same config.
#[test]
fn printed_config_keeps_https_endpoints_and_tls_settings() {
    let dir = Dir::new("print");
    pki(&dir);
    let toml = config(
        "127.0.0.1:1".parse().unwrap(),
        &format!(
            "server_name = \"{NAME}\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"",
            dir.path("ca.pem"),
            dir.path("client.pem"),
            dir.path("client.key")
        ),
        "",
    );
    let cfg = upkeep_proxy::config::parse(Path::new("t.toml"), &toml).unwrap();
    let printed = upkeep_proxy::config::to_toml(&cfg).unwrap();
    assert!(printed.contains("\"https://127.0.0.1:1\""), "{printed}");
    let again = upkeep_proxy::config::parse(Path::new("/nonexistent/p.toml"), &printed)
        .unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(again, cfg, "{printed}");
}
