//! Reload never empties a group: a changed group starts from the old one's addresses, peers,
//! health and panic state; only what the new config removes goes away (docs/config.md,
//! "Reload").

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::server::{reload, start_with, Running};
use upkeep_test_support::fakedns::{FakeDns, Mode, Zone};
use upkeep_test_support::{free_port, get, TestBackend};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn temp_file(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("upkeep-reload-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join("up.toml")
}

/// Starts upkeep in-process from a config file, so that `reload` re-reads it.
async fn upkeep_from(path: &Path, toml: &str) -> Running {
    upkeep_test_support::init_tracing();
    std::fs::write(path, toml).unwrap();
    let cfg = upkeep_proxy::config::load(path).unwrap_or_else(|e| panic!("test config: {e}"));
    start_with(cfg, Some(path.to_owned()), AccessLogger::off())
        .await
        .expect("upkeep starts")
}

fn reload_to(up: &Running, path: &Path, toml: &str) {
    std::fs::write(path, toml).unwrap();
    reload(&up.shared).expect("reload applies");
}

async fn metrics(up: &Running) -> String {
    get(up.admin, "admin", "/metrics").await.text()
}

async fn wait_for(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

fn two_peers(a: SocketAddr, b: SocketAddr, try_timeout: &str) -> String {
    format!(
        "access_log = \"off\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{a}\", \"{b}\"]\ntry_timeout = \"{try_timeout}\"\n[groups.app.health.active]\npath = \"/status/500\"\ninterval = \"300ms\"\ntimeout = \"500ms\"\nrise = 1\nfall = 3\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_that_changes_a_group_keeps_peer_health_and_the_panic_gauge() {
    let (a, b) = (TestBackend::start("a").await, TestBackend::start("b").await);
    let path = temp_file("panic");
    let up = upkeep_from(&path, &two_peers(a.addr(), b.addr(), "5s")).await;
    let panic_series = "upkeep_group_panic_mode{group=\"app\"} 1";
    // Both peers fail their active check: the group routes to all of them (panic mode).
    wait_for("panic mode", async || {
        get(up.listeners[0], "x", "/").await.status == 200
            && metrics(&up).await.contains(panic_series)
    })
    .await;

    reload_to(&up, &path, &two_peers(a.addr(), b.addr(), "6s"));
    // Right after the swap: the new group is the old one's continuation.
    assert!(
        metrics(&up).await.contains(panic_series),
        "{}",
        metrics(&up).await
    );
    let view: serde_json::Value =
        serde_json::from_str(&get(up.admin, "admin", "/upstreams").await.text()).unwrap();
    let peers = view["groups"]["app"]["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 2, "{view}");
    for p in peers {
        assert_eq!(p["state"], "down", "health must survive the reload: {view}");
    }
    assert_eq!(get(up.listeners[0], "x", "/").await.status, 200);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_removing_a_group_removes_its_series_from_metrics() {
    let a = TestBackend::start("a").await;
    let dns = FakeDns::start(
        "127.0.0.1:0".parse().unwrap(),
        Zone::new().with("gone.upkeep.test", Mode::NxDomain, 1),
    )
    .await
    .unwrap();
    let base = format!(
        "access_log = \"off\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[dns]\nservers = [\"{}\"]\ntimeout = \"300ms\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{}\"]\n",
        dns.local_addr(),
        a.addr()
    );
    let with_opt = format!(
        "{base}[[route]]\npath = \"/opt\"\ngroup = \"opt\"\n[groups.opt]\nrequired = false\nendpoints = [\"gone.upkeep.test:80\"]\n"
    );
    let path = temp_file("forget");
    let up = upkeep_from(&path, &with_opt).await;
    // The degraded monitor writes the optional group's gauges within a second.
    wait_for("the optional group's degraded gauge", async || {
        metrics(&up)
            .await
            .contains("upkeep_group_degraded{group=\"opt\"} 1")
    })
    .await;

    reload_to(&up, &path, &base);
    let m = metrics(&up).await;
    assert!(!m.contains("group=\"opt\""), "{m}");
    // And it stays gone: nothing writes the removed group's series again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let m = metrics(&up).await;
    assert!(!m.contains("group=\"opt\""), "{m}");
    assert!(m.contains("upkeep_group_degraded{group=\"app\"} 0"), "{m}");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

fn named(dns: SocketAddr, endpoint: &str) -> String {
    format!(
        "access_log = \"off\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[dns]\nservers = [\"{dns}\"]\ntimeout = \"300ms\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{endpoint}\"]\n[groups.app.discovery]\nmin_refresh = \"200ms\"\nerror_backoff = \"200ms\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_endpoint_serves_the_old_addresses_until_its_first_answer() {
    let port = free_port();
    let old = TestBackend::start_on(SocketAddr::new(ip("127.0.0.2"), port), "old").await;
    let new = TestBackend::start_on(SocketAddr::new(ip("127.0.0.3"), port), "new").await;
    let dns = FakeDns::start(
        "127.0.0.1:0".parse().unwrap(),
        Zone::new()
            .with("old.upkeep.test", Mode::Fixed(vec![ip("127.0.0.2")]), 1)
            .with("new.upkeep.test", Mode::Silent, 1),
    )
    .await
    .unwrap();
    let path = temp_file("rename");
    let up = upkeep_from(
        &path,
        &named(dns.local_addr(), &format!("old.upkeep.test:{port}")),
    )
    .await;
    wait_for("the old name to resolve", async || {
        get(up.admin, "a", "/readyz").await.status == 200
    })
    .await;

    reload_to(
        &up,
        &path,
        &named(dns.local_addr(), &format!("new.upkeep.test:{port}")),
    );
    // The new name has not answered (its DNS is silent): the old addresses keep serving.
    for _ in 0..10 {
        assert_eq!(get(up.admin, "a", "/readyz").await.status, 200);
        assert_eq!(get(up.listeners[0], "x", "/r").await.text(), "old /r\n");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dns.set_mode("new.upkeep.test", Mode::Fixed(vec![ip("127.0.0.3")]));
    wait_for(
        "the new name's answer to replace the old addresses",
        async || get(up.listeners[0], "x", "/r").await.text() == "new /r\n",
    )
    .await;
    drop((old, new));
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_change_reaches_a_group_whose_own_settings_did_not_change() {
    let port = free_port();
    let one = TestBackend::start_on(SocketAddr::new(ip("127.0.0.2"), port), "one").await;
    let two = TestBackend::start_on(SocketAddr::new(ip("127.0.0.3"), port), "two").await;
    let zone = |to: &str| Zone::new().with("app.upkeep.test", Mode::Fixed(vec![ip(to)]), 1);
    let dns1 = FakeDns::start("127.0.0.1:0".parse().unwrap(), zone("127.0.0.2"))
        .await
        .unwrap();
    let dns2 = FakeDns::start("127.0.0.1:0".parse().unwrap(), zone("127.0.0.3"))
        .await
        .unwrap();
    let endpoint = format!("app.upkeep.test:{port}");
    let path = temp_file("dns");
    let up = upkeep_from(&path, &named(dns1.local_addr(), &endpoint)).await;
    wait_for("the first server's answer", async || {
        get(up.listeners[0], "x", "/").await.text() == "one /\n"
    })
    .await;

    reload_to(&up, &path, &named(dns2.local_addr(), &endpoint));
    wait_for("the second server's answer", async || {
        get(up.listeners[0], "x", "/").await.text() == "two /\n"
    })
    .await;
    drop((one, two));
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A self-signed certificate for `upkeep.test` written to `cert.pem` / `key.pem` in `dir`.
fn write_cert(dir: &Path) -> (Vec<u8>, String) {
    let c = rcgen::generate_simple_self_signed(vec!["upkeep.test".to_owned()]).unwrap();
    std::fs::write(dir.join("cert.pem"), c.cert.pem()).unwrap();
    let key = c.signing_key.serialize_pem();
    std::fs::write(dir.join("key.pem"), &key).unwrap();
    (c.cert.der().to_vec(), key)
}

/// The certificate a new TLS handshake with `addr` is given.
async fn served_cert(addr: SocketAddr, roots: &[Vec<u8>]) -> Vec<u8> {
    use std::sync::Arc;
    use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::ServerName};
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(CertificateDer::from(r.clone())).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("upkeep.test").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_rereads_the_certificate_and_refuses_a_mismatched_pair() {
    let a = TestBackend::start("a").await;
    let path = temp_file("cert");
    let dir = path.parent().unwrap().to_owned();
    let (first, first_key) = write_cert(&dir);
    let toml = format!(
        "access_log = \"off\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\ntls = {{ cert = \"{0}/cert.pem\", key = \"{0}/key.pem\" }}\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{1}\"]\n",
        dir.display(),
        a.addr()
    );
    let up = upkeep_from(&path, &toml).await;
    let tls = up.listeners[0];
    let (second, _) = write_cert(&dir);
    let roots = [first.clone(), second.clone()];
    assert_eq!(served_cert(tls, &roots).await, first, "before the reload");

    let report = reload(&up.shared).expect("reload applies");
    assert_eq!(report.listeners.certs_reloaded, vec![tls]);
    assert_eq!(served_cert(tls, &roots).await, second, "after the reload");

    // The first key with the second certificate: refused, the second pair keeps serving.
    std::fs::write(dir.join("key.pem"), first_key).unwrap();
    let err = reload(&up.shared).unwrap_err();
    assert!(
        err.contains(&format!("listener {}", "127.0.0.1:0")),
        "{err}"
    );
    assert_eq!(served_cert(tls, &roots).await, second);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A config with one listener in front of `backend`, and the same with a second listener on
/// a free port (returned first).
fn with_and_without_a_listener(backend: SocketAddr) -> (SocketAddr, String, String) {
    let extra = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let base = format!(
        "access_log = \"off\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{backend}\"]\n"
    );
    let with_extra = format!("{base}[[listener]]\nlisten = \"{extra}\"\nforwarded = \"none\"\n");
    (extra, base, with_extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_binds_an_added_listener_and_closes_a_removed_one() {
    let a = TestBackend::start("a").await;
    let path = temp_file("listeners");
    let (extra, base, with_extra) = with_and_without_a_listener(a.addr());
    let up = upkeep_from(&path, &base).await;
    assert!(tokio::net::TcpStream::connect(extra).await.is_err());

    std::fs::write(&path, &with_extra).unwrap();
    let report = reload(&up.shared).expect("reload applies");
    assert_eq!(report.listeners.bound, vec![extra]);
    assert_eq!(get(extra, "x", "/added").await.text(), "a /added\n");

    std::fs::write(&path, &base).unwrap();
    let report = reload(&up.shared).expect("reload applies");
    assert_eq!(report.listeners.closed, vec![extra]);
    wait_for("the removed listener to stop accepting", async || {
        tokio::net::TcpStream::connect(extra).await.is_err()
    })
    .await;
    assert_eq!(get(up.listeners[0], "x", "/kept").await.text(), "a /kept\n");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A connection of a listener a reload removed is told to close (shutdown has not begun):
/// the response to the request it was handling then says `connection: close`, and the
/// connection ends after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_on_a_removed_listener_is_answered_with_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = TestBackend::start("a").await;
    let path = temp_file("removed-in-flight");
    let (extra, base, with_extra) = with_and_without_a_listener(a.addr());
    let up = upkeep_from(&path, &with_extra).await;
    let mut s = tokio::net::TcpStream::connect(extra).await.unwrap();
    let read_until = async |s: &mut tokio::net::TcpStream, text: &str| {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&out).contains(text) {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        String::from_utf8_lossy(&out).into_owned()
    };
    s.write_all(b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let first = read_until(&mut s, "a /one\n").await;
    assert!(
        first.starts_with("HTTP/1.1 200 OK\r\n") && !first.contains("connection: close"),
        "{first}"
    );
    s.write_all(b"GET /sleep/800 HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    reload_to(&up, &path, &base);
    let second = read_until(&mut s, "a slept 800\n").await;
    assert!(second.starts_with("HTTP/1.1 200 OK\r\n"), "{second}");
    assert!(second.contains("connection: close\r\n"), "{second}");
    let mut buf = [0u8; 64];
    let end = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await;
    assert!(
        matches!(end, Ok(Ok(0)) | Ok(Err(_))),
        "the connection ends after the response: {end:?}"
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
