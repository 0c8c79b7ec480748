//! Connections spread evenly over the serving threads (docs/benchmarks.md, "How the design
//! scales"): the kernel picks a thread's SO_REUSEPORT socket by a hash, blind to how busy the
//! thread is; a thread that accepts a connection while it serves more than another (by more
//! than one in eight of that one's connections) hands it over, and the connection is served
//! there like any other (plain HTTP/1.1, h2c, TLS).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::server::{start_workers, Running};
use upkeep_test_support::TestBackend;

use crate::support::{metric, TempDir};

/// Connections held open at once in a round; rounds in the test.
const CONNECTIONS: usize = 24;
const ROUNDS: usize = 4;

/// One client connection, kept open between its requests.
enum Client {
    H1(http1::SendRequest<Empty<Bytes>>),
    H2(http2::SendRequest<Empty<Bytes>>),
}

impl Client {
    /// Connection `i` of a round: plain HTTP/1.1, h2c (prior knowledge) or HTTP/1.1 over TLS
    /// in turn.
    async fn open(
        i: usize,
        plain: SocketAddr,
        tls: SocketAddr,
        ca: &CertificateDer<'static>,
    ) -> Client {
        match i % 3 {
            0 => {
                let io = TokioIo::new(TcpStream::connect(plain).await.unwrap());
                let (s, conn) = http1::handshake(io).await.unwrap();
                tokio::spawn(conn);
                Client::H1(s)
            }
            1 => {
                let io = TokioIo::new(TcpStream::connect(plain).await.unwrap());
                let (s, conn) = http2::handshake(TokioExecutor::new(), io).await.unwrap();
                tokio::spawn(conn);
                Client::H2(s)
            }
            _ => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca.clone()).unwrap();
                let cfg = rustls::ClientConfig::builder()
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                let tcp = TcpStream::connect(tls).await.unwrap();
                let stream = tokio_rustls::TlsConnector::from(Arc::new(cfg))
                    .connect(ServerName::try_from("upkeep.test").unwrap(), tcp)
                    .await
                    .unwrap();
                let (s, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
                tokio::spawn(conn);
                Client::H1(s)
            }
        }
    }

    async fn get(&mut self) -> StatusCode {
        let req = Request::get("http://upkeep.test/")
            .header("host", "upkeep.test")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = match self {
            Client::H1(s) => {
                s.ready().await.unwrap();
                s.send_request(req).await.unwrap()
            }
            Client::H2(s) => {
                s.ready().await.unwrap();
                s.send_request(req).await.unwrap()
            }
        };
        let status = resp.status();
        resp.into_body().collect().await.unwrap();
        status
    }
}

/// upkeep with two serving threads, a plain and a TLS listener; the certificate's CA.
async fn two_threads(dir: &TempDir, backend: SocketAddr) -> (Running, CertificateDer<'static>) {
    upkeep_test_support::init_tracing();
    let cert = rcgen::generate_simple_self_signed(vec!["upkeep.test".to_owned()]).unwrap();
    std::fs::write(dir.path("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path("key.pem"), cert.signing_key.serialize_pem()).unwrap();
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [[listener]]\nlisten = \"127.0.0.1:0\"\n\n\
         [[listener]]\nlisten = \"127.0.0.1:0\"\ntls = {{ cert = \"{0}\", key = \"{1}\" }}\n\n\
         [[route]]\ngroup = \"app\"\n\n[groups.app]\nendpoints = [\"{2}\"]\n",
        dir.path("cert.pem").display(),
        dir.path("key.pem").display(),
        backend
    );
    let cfg = upkeep_proxy::config::parse(Path::new("test.toml"), &toml)
        .unwrap_or_else(|e| panic!("test config: {e}"));
    let up = start_workers(cfg, None, AccessLogger::off(), 2)
        .await
        .expect("upkeep starts");
    (up, cert.cert.der().clone())
}

/// Open connections of serving thread `w` (1 or 2).
async fn open_on(up: &Running, w: u32) -> f64 {
    metric(
        up,
        &format!("upkeep_worker_connections_open{{worker=\"{w}\"}}"),
    )
    .await
}

/// Until every connection of both threads is closed and uncounted (10 s at most).
async fn all_closed(up: &Running, what: &str) {
    let mut waited = Duration::ZERO;
    while open_on(up, 1).await + open_on(up, 2).await > 0.0 {
        assert!(
            waited < Duration::from_secs(10),
            "{what}: closed connections still counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_http2_clients_are_always_served_by_two_threads() {
    let b = TestBackend::start("b").await;
    let dir = TempDir::new("worker-balance-two");
    let (up, ca) = two_threads(&dir, b.addr()).await;
    // Left to the kernel's hash, the second connection joins the first one's thread half of
    // the time: eight rounds in a row split one and one about once in 256.
    for round in 1..=8 {
        let mut clients = Vec::new();
        for _ in 0..2 {
            let mut c = Client::open(1, up.listeners[0], up.listeners[1], &ca).await;
            assert_eq!(c.get().await, StatusCode::OK, "round {round}");
            clients.push(c);
        }
        assert_eq!(
            (open_on(&up, 1).await, open_on(&up, 2).await),
            (1.0, 1.0),
            "round {round}: one connection per serving thread"
        );
        drop(clients);
        all_closed(&up, &format!("round {round}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_held_open_are_spread_evenly_over_the_serving_threads() {
    let b = TestBackend::start("b").await;
    let dir = TempDir::new("worker-balance");
    let (up, ca) = two_threads(&dir, b.addr()).await;
    let (plain, tls) = (up.listeners[0], up.listeners[1]);

    // Left to the kernel's hash, 24 connections split within two of even in fewer than half
    // of the rounds (C(24,11..13) / 2^24 = 0.46), so four rounds in a row in about 1 of 23.
    for round in 1..=ROUNDS {
        let opened = (0..CONNECTIONS).map(|i| Client::open(i, plain, tls, &ca));
        let mut clients = futures_util::future::join_all(opened).await;
        for (i, c) in clients.iter_mut().enumerate() {
            assert_eq!(
                c.get().await,
                StatusCode::OK,
                "round {round}, connection {i}"
            );
        }
        let (one, two) = (open_on(&up, 1).await, open_on(&up, 2).await);
        assert_eq!(
            one + two,
            CONNECTIONS as f64,
            "round {round}: every open connection counted once"
        );
        assert!(
            (one - two).abs() <= 2.0,
            "round {round}: {one} and {two} connections on the two serving threads"
        );
        // Served where they were moved to, for as long as they stay open.
        for (i, c) in clients.iter_mut().enumerate() {
            assert_eq!(
                c.get().await,
                StatusCode::OK,
                "round {round}, connection {i}, again"
            );
        }
        drop(clients);
        all_closed(&up, &format!("round {round}")).await;
    }
    // As the connections of a round arrive, the difference between the threads walks up and
    // down by one; below eight connections a thread one ahead of the other hands the next one
    // over, and the kernel sends the second connection of a round to the first one's thread
    // half of the time: connections were handed over, and the requests above went over them.
    let moved = metric(&up, "upkeep_worker_connections_moved_total").await;
    assert!(
        moved > 0.0,
        "no connection was handed to the other serving thread"
    );
}
