//! One access-log line per request (JSON or nginx's combined format, see `record`), written
//! by a background thread so the request path never blocks on the log's destination. The
//! writer reopens its file on request (reload, SIGUSR1), writes out every queued line before
//! the process exits, and counts the lines it had to drop under overload.

mod record;

pub use record::{Field, Record, Text};

use record::Lines;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use crate::config::AccessLog;

/// Sends records to the writer thread.
#[derive(Clone)]
pub struct AccessLogger {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    tx: mpsc::Sender<Record>,
    ctl: std::sync::mpsc::Sender<Ctl>,
    /// Records are built and sent only while a destination is set.
    on: AtomicBool,
    /// Lines dropped because the writer was too far behind (`upkeep_access_log_dropped_total`).
    dropped: Counter,
}

/// Requests to the writer thread; each is acknowledged once done.
enum Ctl {
    /// Write out everything queued so far, then acknowledge.
    Flush(std::sync::mpsc::SyncSender<()>),
    /// Write out everything queued so far to the current destination, then switch.
    Switch(
        Option<Box<dyn Write + Send>>,
        std::sync::mpsc::SyncSender<()>,
    ),
}

/// Lines that may wait for the writer; past this a line is dropped (and counted) rather
/// than slowing requests down.
const QUEUE: usize = 16 * 1024;

impl AccessLogger {
    /// Starts the writer for `dest`.
    pub fn start(dest: &AccessLog) -> std::io::Result<Self> {
        Self::with_writer(open(dest)?, QUEUE)
    }

    fn with_writer(out: Option<Box<dyn Write + Send>>, queue: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel(queue);
        let (ctl, ctl_rx) = std::sync::mpsc::channel();
        let on = AtomicBool::new(out.is_some());
        std::thread::Builder::new()
            .name("upkeep-access-log".into())
            .spawn(move || write_loop(rx, ctl_rx, out))?;
        Ok(Self {
            inner: Some(Arc::new(Inner {
                tx,
                ctl,
                on,
                dropped: Counter::default(),
            })),
        })
    }

    /// Whether records are written at all.
    pub fn is_on(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.on.load(Ordering::Relaxed))
    }

    /// A logger that drops everything, and cannot be switched on.
    pub fn off() -> Self {
        Self { inner: None }
    }

    /// The counter of lines dropped under overload, for `/metrics`.
    pub fn dropped_counter(&self) -> Counter {
        self.inner
            .as_ref()
            .map(|i| i.dropped.clone())
            .unwrap_or_default()
    }

    /// Queues a record; if the writer is far behind, the line is dropped and counted rather
    /// than slowing requests down.
    pub fn log(&self, rec: Record) {
        if let Some(i) = &self.inner {
            if i.tx.try_send(rec).is_err() {
                i.dropped.inc();
            }
        }
    }

    /// Opens `dest` anew (a reload, or SIGUSR1 after logrotate moved the file) and switches
    /// to it: every line queued before the switch is written to the old file first, none is
    /// lost. On an error the current destination stays.
    pub fn reopen(&self, dest: &AccessLog) -> std::io::Result<()> {
        let Some(i) = &self.inner else {
            return Ok(());
        };
        let out = open(dest)?;
        let on = out.is_some();
        let (ack, done) = std::sync::mpsc::sync_channel(1);
        if i.ctl.send(Ctl::Switch(out, ack)).is_ok() {
            let _ = done.recv_timeout(Duration::from_secs(5));
        }
        i.on.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Writes out every line queued so far and waits (at most `timeout`) until it is in the
    /// destination: called at exit, after the last request has finished.
    pub fn flush(&self, timeout: Duration) -> bool {
        let Some(i) = &self.inner else {
            return true;
        };
        let (ack, done) = std::sync::mpsc::sync_channel(1);
        i.ctl.send(Ctl::Flush(ack)).is_ok() && done.recv_timeout(timeout).is_ok()
    }
}

fn open(dest: &AccessLog) -> std::io::Result<Option<Box<dyn Write + Send>>> {
    Ok(match dest {
        AccessLog::Off => None,
        AccessLog::Stdout => Some(Box::new(std::io::stdout())),
        AccessLog::File(p) => Some(Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        )),
    })
}

fn write_loop(
    mut rx: mpsc::Receiver<Record>,
    ctl: std::sync::mpsc::Receiver<Ctl>,
    out: Option<Box<dyn Write + Send>>,
) {
    use std::sync::mpsc::RecvTimeoutError;
    use tokio::sync::mpsc::error::TryRecvError;
    let buffered = |w| std::io::BufWriter::with_capacity(64 * 1024, w);
    let mut out = out.map(buffered);
    let mut lines = Lines::default();
    // Drained in batches on a timer rather than woken per record: a sender never has to
    // wake this thread, which keeps logging off the request path's critical costs. A
    // control request (flush, reopen) cuts the wait short. With no destination no record
    // is sent (the senders look at `on`), so the thread sleeps until the next control
    // request instead of waking 50 times a second; the few records of requests that were
    // under way when the log was switched off are drained (and dropped) then.
    loop {
        let req = if out.is_some() {
            ctl.recv_timeout(Duration::from_millis(20))
        } else {
            ctl.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        let mut closed = false;
        loop {
            match rx.try_recv() {
                Ok(r) => {
                    if let Some(out) = out.as_mut() {
                        let _ = lines.write(&r, out);
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if let Some(out) = out.as_mut() {
            let _ = out.flush();
        }
        match req {
            Ok(Ctl::Flush(ack)) => {
                let _ = ack.send(());
            }
            Ok(Ctl::Switch(next, ack)) => {
                out = next.map(buffered);
                let _ = ack.send(());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if closed {
            return;
        }
    }
}

/// RFC 3339 UTC with milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Condvar, Mutex};
    use std::time::UNIX_EPOCH;

    fn rec(path: &str) -> Record {
        let mut text = Text::default();
        text.set(Field::Method, "GET");
        text.set(Field::Host, "h");
        text.set(Field::Path, path);
        text.set(Field::RequestId, "r");
        Record {
            time: SystemTime::now(),
            client: "127.0.0.1".parse().unwrap(),
            text,
            proto: "HTTP/1.1",
            status: 200,
            duration_ms: 1.0,
            peer: None,
            attempts: 1,
            upstream_status: Some(200),
            upstream_header_ms: None,
            bytes_in: 0,
            bytes_out: 0,
            origin: "upstream",
            cause: None,
            reason: None,
            incomplete: false,
            format: crate::config::AccessLogFormat::Json,
        }
    }

    /// A destination in memory that blocks every write until the gate opens.
    #[derive(Clone, Default)]
    struct Sink {
        buf: Arc<Mutex<Vec<u8>>>,
        gate: Arc<(Mutex<bool>, Condvar)>,
    }

    impl Sink {
        fn open_gate(&self) {
            *self.gate.0.lock().unwrap() = true;
            self.gate.1.notify_all();
        }

        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.buf.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let open = self.gate.1.wait_while(self.gate.0.lock().unwrap(), |o| !*o);
            drop(open);
            self.buf.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn flush_writes_every_queued_line_before_it_returns() {
        let sink = Sink::default();
        sink.open_gate();
        let log = AccessLogger::with_writer(Some(Box::new(sink.clone())), 1024).unwrap();
        for i in 0..300 {
            log.log(rec(&format!("/{i}")));
        }
        assert!(log.flush(Duration::from_secs(5)));
        assert_eq!(sink.lines().len(), 300);
        assert!(sink.lines()[299].contains("\"path\":\"/299\""));
    }

    #[test]
    fn a_line_dropped_under_overload_is_counted() {
        let sink = Sink::default();
        let log = AccessLogger::with_writer(Some(Box::new(sink.clone())), 8).unwrap();
        // The writer is stuck on its destination: the queue of 8 fills, the rest is dropped.
        for i in 0..100 {
            log.log(rec(&format!("/{i}")));
        }
        std::thread::sleep(Duration::from_millis(100));
        for i in 100..200 {
            log.log(rec(&format!("/{i}")));
        }
        sink.open_gate();
        assert!(log.flush(Duration::from_secs(5)));
        let written = sink.lines().len() as u64;
        let dropped = log.dropped_counter().get();
        assert!(dropped > 0);
        assert_eq!(written + dropped, 200, "every line written or counted");
    }

    /// Switches `log`'s destination to `sink` and waits until its writer has.
    fn switch(log: &AccessLogger, sink: &Sink) {
        let (ack, done) = std::sync::mpsc::sync_channel(1);
        log.inner
            .as_ref()
            .unwrap()
            .ctl
            .send(Ctl::Switch(Some(Box::new(sink.clone())), ack))
            .unwrap();
        done.recv().unwrap();
    }

    #[test]
    fn reopen_switches_destination_without_losing_a_line() {
        let (a, b) = (Sink::default(), Sink::default());
        a.open_gate();
        b.open_gate();
        let log = AccessLogger::with_writer(Some(Box::new(a.clone())), 1024).unwrap();
        for i in 0..50 {
            log.log(rec(&format!("/{i}")));
        }
        switch(&log, &b);
        for i in 50..80 {
            log.log(rec(&format!("/{i}")));
        }
        assert!(log.flush(Duration::from_secs(5)));
        assert_eq!(a.lines().len(), 50, "queued before the switch: old file");
        assert_eq!(b.lines().len(), 30);
    }

    #[test]
    fn a_log_that_is_off_drops_its_stragglers_and_writes_once_switched_on() {
        let b = Sink::default();
        b.open_gate();
        let log = AccessLogger::with_writer(None, 1024).unwrap();
        assert!(!log.is_on());
        // A record of a request that was under way when the log went off: never written.
        log.log(rec("/while-off"));
        // The writer sleeps while off; a flush still wakes it and is answered.
        assert!(log.flush(Duration::from_secs(5)));
        switch(&log, &b);
        for i in 0..20 {
            log.log(rec(&format!("/{i}")));
        }
        assert!(log.flush(Duration::from_secs(5)));
        let lines = b.lines();
        assert_eq!(lines.len(), 20, "{lines:?}");
        assert!(lines.iter().all(|l| !l.contains("/while-off")));
    }

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
