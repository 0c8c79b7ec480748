//! `doctor keepalive` against loopback servers started here: the announced hint and the
//! measured close are both reported, FIN and RST are told apart, and the wait is bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;
use upkeep_doctor::finding::Severity;
use upkeep_doctor::keepalive::{measure, verdict, Close, KeepaliveError};

/// Answers one request announcing `timeout=hint`, then closes after `idle` (RST if `reset`).
fn server(hint: u32, idle: Duration, reset: bool) -> (String, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/status", l.local_addr().unwrap());
    let h = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut s = s;
        let mut buf = [0u8; 2048];
        let _ = s.read(&mut buf);
        write!(s, "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout={hint}\r\nContent-Length: 2\r\n\r\nok").unwrap();
        std::thread::sleep(idle);
        if reset {
            // SO_LINGER 0 makes close() send RST instead of FIN.
            socket2::SockRef::from(&s)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
        }
        drop::<TcpStream>(s);
    });
    (url, h)
}

#[test]
fn measures_close_after_idle_and_reads_the_hint() {
    let (url, h) = server(1, Duration::from_millis(1500), false);
    let m = measure(&url, Duration::from_secs(10)).unwrap();
    h.join().unwrap();
    assert_eq!(m.status, 200);
    assert_eq!(m.hint, Some(1.0));
    let Close::Fin(d) = m.close else {
        panic!("{m:?}")
    };
    assert!(
        d >= Duration::from_millis(1400) && d < Duration::from_millis(2500),
        "{d:?}"
    );
    let f = verdict(&m, Duration::from_secs(300));
    assert_eq!(f.severity, Severity::Error);
    assert!(
        f.problem.contains("timeout=1") && f.problem.contains("after 1.5 s"),
        "{}",
        f.problem
    );
    assert_eq!(f.details["hint_s"], 1.0);
}

#[test]
fn a_reset_is_reported_as_a_reset() {
    let (url, h) = server(1, Duration::from_millis(300), true);
    let m = measure(&url, Duration::from_secs(10)).unwrap();
    h.join().unwrap();
    assert!(matches!(m.close, Close::Reset(_)), "{m:?}");
}

#[test]
fn the_wait_is_bounded_and_says_still_open() {
    let (url, h) = server(60, Duration::from_millis(1500), false);
    let m = measure(&url, Duration::from_millis(500)).unwrap();
    assert_eq!(m.close, Close::StillOpen(Duration::from_millis(500)));
    let f = verdict(&m, Duration::from_secs(300));
    assert_eq!(f.severity, Severity::Info);
    assert!(f.problem.contains("still open at 0.5 s"), "{}", f.problem);
    assert!(
        f.consequence.contains("Cannot conclude"),
        "{}",
        f.consequence
    );
    h.join().unwrap();
}

#[test]
fn outlasting_the_hop_by_less_than_the_margin_is_a_warning() {
    // Closes at 1.5 s; a hop idle for 0.1 s is outlasted, but by less than the 5 s minimum.
    let (url, h) = server(1, Duration::from_millis(1500), false);
    let m = measure(&url, Duration::from_secs(10)).unwrap();
    h.join().unwrap();
    let f = verdict(&m, Duration::from_millis(100));
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.consequence.contains("margin"), "{}", f.consequence);
}

#[test]
fn a_refused_connection_is_an_error() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = measure(&format!("http://127.0.0.1:{port}/"), Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, KeepaliveError::Io { .. }), "{e:?}");
    assert!(matches!(
        measure("https://127.0.0.1/", Duration::from_secs(1)),
        Err(KeepaliveError::Url(_))
    ));
}

#[test]
fn node_announces_five_seconds_and_closes_later_when_node_is_installed() {
    let script = "require('http').createServer((q,s)=>s.end('ok')).listen(0,'127.0.0.1',function(){console.log(this.address().port)})";
    let child = Command::new("node")
        .arg("-e")
        .arg(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        // CI machines have Node; there a missing node is a failure, not a skip.
        assert!(std::env::var_os("CI").is_none(), "node is required in CI");
        eprintln!("skipped: node is not installed");
        return;
    };
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().unwrap();
    let m = measure(
        &format!("http://127.0.0.1:{port}/"),
        Duration::from_secs(10),
    );
    let _ = child.kill();
    let _ = child.wait();
    let m = m.unwrap();
    assert_eq!(m.hint, Some(5.0));
    let Close::Fin(d) = m.close else {
        panic!("{m:?}")
    };
    eprintln!(
        "node: announces timeout=5, closed after {:.2} s",
        d.as_secs_f64()
    );
    assert!(
        d >= Duration::from_secs(5) && d < Duration::from_secs(8),
        "{d:?}"
    );
}
