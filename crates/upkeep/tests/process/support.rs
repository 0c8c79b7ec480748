//! What the process-level tests share: the binary, a child that is killed when its test ends,
//! a temp dir per test, free loopback addresses and the wait for readiness.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use upkeep_test_support::{answers_ok, free_port, free_ports};

/// The `upkeep` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_upkeep");

/// A running child (`upkeep serve`, or a shell that execs it), killed and reaped when the
/// test ends, also by a failed assertion.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An empty temp dir for one test: `upkeep-{area}-{name}-{pid}`.
pub fn temp_dir(area: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("upkeep-{area}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes `text` to `path`.
pub fn write(path: &Path, text: &str) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// A free port on 127.0.0.1.
pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// `N` distinct free ports on 127.0.0.1 (for addresses picked together: listener and admin).
pub fn loopbacks<const N: usize>() -> [SocketAddr; N] {
    free_ports().map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
}

/// Waits (20 s at most) until the admin listener `admin` answers `/readyz` with 200.
pub async fn wait_ready(admin: SocketAddr) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if answers_ok(admin, "admin", "/readyz").await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("upkeep did not become ready");
}
