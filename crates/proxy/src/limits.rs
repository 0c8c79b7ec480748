//! Process limits: the file-descriptor limit, raised to its hard limit at start, and the
//! default connection limit derived from it.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Descriptors kept back from the connection limit for listeners, DNS, logs and the admin side.
const RESERVED_FDS: u64 = 128;

/// Raises the soft file-descriptor limit to the hard limit, so the connection limit (not the
/// kernel's `EMFILE`) is what refuses work; returns the limit now in force.
pub fn raise_nofile() -> u64 {
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!(error = %e, soft, hard, "could not raise the file-descriptor limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    }
}

/// The soft file-descriptor limit in force.
pub fn nofile() -> u64 {
    getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft)
}

/// The default `max_connections` of a listener: a proxied connection holds two descriptors
/// (client and upstream), so half of what the descriptor limit leaves after a reserve.
pub fn default_max_connections() -> usize {
    let fds = nofile().min(1 << 24);
    (fds.saturating_sub(RESERVED_FDS) / 2).max(64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_connection_limit_fits_under_the_descriptor_limit() {
        let n = default_max_connections() as u64;
        assert!(n >= 64);
        assert!(n * 2 <= nofile().max(2 * 64 + RESERVED_FDS), "{n}");
    }
}
