//! Binary upgrade (SIGUSR2 or `POST /upgrade`): start the binary at this process's path with
//! the same arguments, hand it every listening socket (see `handover`), and drain only once
//! it says it is ready. If it cannot start, exits, or is not ready in time, this process
//! keeps serving and says why. Unix only.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::handover::{self, Handed, HandoverError, Inherited, SOCKET_ENV};

/// How long a new process has to start, take the sockets and say it is ready.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an upgrade did not happen; the old process keeps serving in every case.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The Unix socket for the handover could not be made.
    #[error("cannot prepare the handover socket: {0}")]
    Socket(std::io::Error),
    /// This binary's path is unknown.
    #[error("cannot find this binary's path: {0}")]
    Exe(std::io::Error),
    /// The new binary could not be started.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The new process exited before it was ready.
    #[error("the new process (pid {pid}) exited before it was ready ({status}); its log says why")]
    Exited {
        /// Its pid.
        pid: u32,
        /// How it exited.
        status: std::process::ExitStatus,
    },
    /// The new process said it cannot serve.
    #[error("the new process (pid {pid}) is not ready: {reason}")]
    NotReady {
        /// Its pid.
        pid: u32,
        /// What it said.
        reason: String,
    },
    /// The new process was not ready in time and was stopped.
    #[error("the new process (pid {pid}) was not ready within {}s and was stopped", .after.as_secs())]
    Timeout {
        /// Its pid.
        pid: u32,
        /// The time it had.
        after: Duration,
    },
    /// The sockets could not be handed over.
    #[error("handing over the sockets to pid {pid}: {source}")]
    Handover {
        /// The new process.
        pid: u32,
        /// What failed.
        source: HandoverError,
    },
    /// Another upgrade or a shutdown is under way.
    #[error("{0}")]
    Busy(&'static str),
}

/// This binary as it was started. After the file was replaced on disk (the usual way to
/// install a new version), Linux names the running image `PATH (deleted)`: the new file at
/// PATH is the one to start.
fn binary() -> Result<PathBuf, UpgradeError> {
    let exe = std::env::current_exe().map_err(UpgradeError::Exe)?;
    let s = exe.to_string_lossy();
    Ok(match s.strip_suffix(" (deleted)") {
        Some(p) => PathBuf::from(p),
        None => exe,
    })
}

/// A private directory for the handover socket, removed when the upgrade is over: only this
/// user can connect, and only the new process is expected to.
struct SocketDir(PathBuf);

impl SocketDir {
    fn new() -> std::io::Result<SocketDir> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("upkeep-upgrade-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(SocketDir(dir))
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the new binary, hands it `socks` and waits (blocking, up to `timeout`) until it
/// is ready; returns its pid. On any failure the new process is stopped if still running.
pub(crate) fn start_new(socks: Vec<Handed>, timeout: Duration) -> Result<u32, UpgradeError> {
    let deadline = Instant::now() + timeout;
    let dir = SocketDir::new().map_err(UpgradeError::Socket)?;
    let path = dir.0.join("handover.sock");
    let listener = UnixListener::bind(&path).map_err(UpgradeError::Socket)?;
    listener
        .set_nonblocking(true)
        .map_err(UpgradeError::Socket)?;
    let exe = binary()?;
    let child = Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env(SOCKET_ENV, &path)
        .spawn()
        .map_err(|source| UpgradeError::Spawn { path: exe, source })?;
    let mut child = Reaper(Some(child));
    let pid = child.pid();
    tracing::info!(
        new.pid = pid,
        "upgrade: new process started, waiting for it to take the sockets"
    );
    let stream = loop {
        child.check_exited()?;
        match listener.accept() {
            Ok((s, _)) if is_from(&s, pid) => break s,
            Ok(_) => tracing::warn!("upgrade: a process other than the new one connected to the handover socket; ignored"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(UpgradeError::Socket(e)),
        }
        if Instant::now() >= deadline {
            return Err(child.stop(timeout));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let handover = |source| UpgradeError::Handover { pid, source };
    stream
        .set_nonblocking(false)
        .map_err(|e| handover(e.into()))?;
    handover::send(&stream, &socks).map_err(handover)?;
    drop(socks);
    // Its answer: `ready`, or `failed: why`; poll so that an exit is noticed at once.
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| handover(e.into()))?;
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    loop {
        match reader.read_line(&mut line) {
            Ok(0) => {
                // It closed without a word: it exited; give it a moment to be reaped.
                let until = Instant::now() + Duration::from_secs(2);
                while Instant::now() < until {
                    child.check_exited()?;
                    std::thread::sleep(Duration::from_millis(20));
                }
                return Err(child.stop(timeout));
            }
            Ok(_) if line.ends_with('\n') => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(handover(e.into())),
        }
        child.check_exited()?;
        if Instant::now() >= deadline {
            return Err(child.stop(timeout));
        }
    }
    match line.trim_end() {
        "ready" => {
            child.release();
            Ok(pid)
        }
        other => {
            let reason = other.strip_prefix("failed: ").unwrap_or(other).to_owned();
            let _ = child.stop(timeout);
            Err(UpgradeError::NotReady { pid, reason })
        }
    }
}

/// On Linux, checks that the peer is the process just started (the directory's mode keeps
/// other users out; this keeps out other processes of the same user).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn is_from(s: &UnixStream, pid: u32) -> bool {
    rustix::net::sockopt::socket_peercred(s)
        .is_ok_and(|c| c.pid.as_raw_nonzero().get() as u32 == pid)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn is_from(_s: &UnixStream, _pid: u32) -> bool {
    true
}

/// The new process until it is ready: stopped and reaped if the upgrade fails.
struct Reaper(Option<Child>);

impl Reaper {
    fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    fn check_exited(&mut self) -> Result<(), UpgradeError> {
        let pid = self.pid();
        if let Some(c) = &mut self.0 {
            if let Ok(Some(status)) = c.try_wait() {
                self.0 = None;
                return Err(UpgradeError::Exited { pid, status });
            }
        }
        Ok(())
    }

    fn stop(&mut self, after: Duration) -> UpgradeError {
        let pid = self.pid();
        if let Some(mut c) = self.0.take() {
            if let Ok(Some(status)) = c.try_wait() {
                return UpgradeError::Exited { pid, status };
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        UpgradeError::Timeout { pid, after }
    }

    /// The new process serves: it outlives this one.
    fn release(&mut self) {
        self.0 = None;
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The new process's side: connects to the old process and receives its sockets.
pub(crate) fn inherit(path: &Path) -> Result<(UnixStream, Inherited), HandoverError> {
    let stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(READY_TIMEOUT))?;
    let inherited = handover::receive(&stream)?;
    Ok((stream, inherited))
}

/// The new process's answer: ready (the old process drains), or why not (it keeps serving).
pub(crate) fn answer(mut stream: &UnixStream, result: Result<(), String>) {
    let line = match result {
        Ok(()) => "ready\n".to_owned(),
        Err(e) => format!("failed: {}\n", e.replace('\n', "; ")),
    };
    if let Err(e) = stream.write_all(line.as_bytes()) {
        tracing::error!(error = %e, "upgrade: could not answer the old process");
    }
}
