//! One access-log line per request (JSON or nginx's combined format, see `record`), written
//! by a background task so the request path never blocks on the log's destination.

mod record;

pub use record::Record;

use std::io::Write;
use std::time::SystemTime;

use tokio::sync::mpsc;

use crate::config::AccessLog;

/// Sends records to the writer task.
#[derive(Clone)]
pub struct AccessLogger {
    tx: Option<mpsc::Sender<Record>>,
}

impl AccessLogger {
    /// Starts the writer for `dest`.
    pub fn start(dest: &AccessLog) -> std::io::Result<Self> {
        let out: Box<dyn Write + Send> = match dest {
            AccessLog::Off => return Ok(Self { tx: None }),
            AccessLog::Stdout => Box::new(std::io::stdout()),
            AccessLog::File(p) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            ),
        };
        let (tx, rx) = mpsc::channel(16 * 1024);
        std::thread::Builder::new()
            .name("upkeep-access-log".into())
            .spawn(move || write_loop(rx, out))?;
        Ok(Self { tx: Some(tx) })
    }

    /// Whether records are written at all.
    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }

    /// A logger that drops everything.
    pub fn off() -> Self {
        Self { tx: None }
    }

    /// Queues a record; if the writer is far behind, the line is dropped rather than
    /// slowing requests down.
    pub fn log(&self, rec: Record) {
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(rec);
        }
    }
}

fn write_loop(mut rx: mpsc::Receiver<Record>, out: Box<dyn Write + Send>) {
    use tokio::sync::mpsc::error::TryRecvError;
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    // Drained in batches on a timer rather than woken per record: a sender never has to
    // wake this thread, which keeps logging off the request path's critical costs.
    loop {
        std::thread::sleep(std::time::Duration::from_millis(20));
        loop {
            match rx.try_recv() {
                Ok(r) => {
                    let _ = r.write_line(&mut out);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    let _ = out.flush();
                    return;
                }
            }
        }
        let _ = out.flush();
    }
}

/// RFC 3339 UTC with milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_millis(1_764_489_600_123)),
            "2025-11-30T08:00:00.123Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
    }
}
