//! The TLS listener's sessions (docs/protocols.md, "TLS listeners"): one server config shared
//! by every serving thread, so a session resumes on whichever thread the next connection
//! lands; stateless session tickets; the server's cipher-suite order.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::client::Resumption;
use rustls::crypto::ring::{cipher_suite, default_provider};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{HandshakeKind, SupportedProtocolVersion};
use tokio::net::TcpStream;
use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::server::{start_workers, Running};
use upkeep_test_support::TestBackend;

use crate::support::one_group;

struct Tls {
    up: Running,
    ca: CertificateDer<'static>,
    dir: std::path::PathBuf,
    _backend: TestBackend,
}

/// upkeep with a TLS listener and two serving threads, as `upkeep serve --workers 2` runs it.
async fn tls_upkeep(name: &str) -> Tls {
    upkeep_test_support::init_tracing();
    let b = TestBackend::start("b").await;
    let dir = std::env::temp_dir().join(format!("upkeep-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["upkeep.test".to_owned()]).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), cert.signing_key.serialize_pem()).unwrap();
    let toml = one_group(&[b.addr()], "").replace(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
        &format!(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\ntls = {{ cert = \"{0}/cert.pem\", key = \"{0}/key.pem\" }}\n",
            dir.display()
        ),
    );
    let cfg = upkeep_proxy::config::parse(Path::new("test.toml"), &toml)
        .unwrap_or_else(|e| panic!("test config: {e}"));
    let up = start_workers(cfg, None, AccessLogger::off(), 2)
        .await
        .expect("upkeep starts");
    Tls {
        up,
        ca: cert.cert.der().clone(),
        dir,
        _backend: b,
    }
}

fn client_config(
    ca: &CertificateDer<'static>,
    versions: &[&'static SupportedProtocolVersion],
    suites: Option<Vec<rustls::SupportedCipherSuite>>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let mut provider = default_provider();
    if let Some(s) = suites {
        provider.cipher_suites = s;
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    cfg.resumption = Resumption::in_memory_sessions(64);
    Arc::new(cfg)
}

/// One connection: handshake, one GET read to the end (which also reads the TLS 1.3
/// tickets the server sent after its handshake). Gives how the handshake went and the suite.
async fn one_exchange(
    addr: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
) -> (HandshakeKind, rustls::CipherSuite) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(ServerName::try_from("upkeep.test").unwrap(), tcp)
        .await
        .unwrap();
    let kind = tls.get_ref().1.handshake_kind().unwrap();
    let suite = tls.get_ref().1.negotiated_cipher_suite().unwrap().suite();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let req = Request::get("/")
        .header("host", "upkeep.test")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    drop(sender);
    let _ = tokio::time::timeout(Duration::from_secs(2), driver).await;
    (kind, suite)
}

/// 24 connections in a row with one client session store: the first is a full handshake,
/// every later one resumes. SO_REUSEPORT spreads them over both serving threads (all on one
/// thread: 1 in 2^23), so with a config per thread about half would not resume.
async fn resumes_on_every_connection(versions: &[&'static SupportedProtocolVersion]) {
    let t = tls_upkeep(&format!("tls-resume-{}", versions.len())).await;
    let cfg = client_config(&t.ca, versions, None);
    let addr = t.up.listeners[0];
    let (first, _) = one_exchange(addr, &cfg).await;
    assert_eq!(first, HandshakeKind::Full);
    for i in 1..24 {
        let (kind, _) = one_exchange(addr, &cfg).await;
        assert_eq!(kind, HandshakeKind::Resumed, "connection {i}");
    }
    let _ = std::fs::remove_dir_all(&t.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls13_sessions_resume_across_serving_threads() {
    resumes_on_every_connection(&[&rustls::version::TLS13]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_sessions_resume_across_serving_threads() {
    resumes_on_every_connection(&[&rustls::version::TLS12]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_cipher_suite_order_wins() {
    let t = tls_upkeep("tls-order").await;
    // The client prefers ChaCha20; the server's first choice is AES-256-GCM.
    let suites = vec![
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
    ];
    let cfg = client_config(&t.ca, &[&rustls::version::TLS13], Some(suites));
    let (_, suite) = one_exchange(t.up.listeners[0], &cfg).await;
    assert_eq!(suite, rustls::CipherSuite::TLS13_AES_256_GCM_SHA384);
    let _ = std::fs::remove_dir_all(&t.dir);
}

/// `openssl s_client` over TLS 1.2: the session it saves carries a session ticket (the
/// ticket extension, not only a session ID), and a second `s_client` resumes from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_session_tickets_are_issued_and_resumed_by_openssl() {
    let t = tls_upkeep("tls-ticket").await;
    let addr = t.up.listeners[0].to_string();
    let sess = t.dir.join("session.pem");
    let s_client = |extra: &[&str]| {
        let mut c = tokio::process::Command::new("openssl");
        c.args([
            "s_client",
            "-connect",
            &addr,
            "-tls1_2",
            "-servername",
            "upkeep.test",
        ])
        .args(extra)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
        c
    };
    let first = tokio::time::timeout(
        Duration::from_secs(5),
        s_client(&["-sess_out", sess.to_str().unwrap()]).output(),
    )
    .await
    .expect("openssl s_client finishes")
    .expect("openssl runs");
    let out = String::from_utf8_lossy(&first.stdout);
    assert!(out.contains("New, TLSv1.2"), "{out}");
    let text = std::process::Command::new("openssl")
        .args(["sess_id", "-noout", "-text", "-in", sess.to_str().unwrap()])
        .output()
        .expect("openssl sess_id runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("TLS session ticket:"), "{text}");
    for _ in 0..4 {
        let again = tokio::time::timeout(
            Duration::from_secs(5),
            s_client(&["-sess_in", sess.to_str().unwrap()]).output(),
        )
        .await
        .expect("openssl s_client finishes")
        .expect("openssl runs");
        let out = String::from_utf8_lossy(&again.stdout);
        assert!(out.contains("Reused, TLSv1.2"), "{out}");
    }
    let _ = std::fs::remove_dir_all(&t.dir);
}
