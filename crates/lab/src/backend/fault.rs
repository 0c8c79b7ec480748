//! The faults a backend can be switched to, and their text form (`slow:200ms`, `status:503`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::duration;

/// A fault applied to a backend's new requests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Fault {
    /// Healthy.
    #[default]
    None,
    /// Listener closed: connects get a RST. Cleared by re-opening the same port.
    Refuse,
    /// Headers and a first chunk, then a RST (SO_LINGER 0).
    ResetMidResponse,
    /// Accept and read the request, never answer.
    Stall,
    /// Answer after this delay.
    Slow(Duration),
    /// Answer with this status.
    Status(u16),
}

/// Keep-alive behaviour of a backend's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeepAlive {
    /// Close a connection this long after its last response (Node: 5 s by default).
    pub idle_close: Option<Duration>,
    /// Announce `Keep-Alive: timeout=N` on responses.
    pub hint: Option<u32>,
}

/// State of a simulated dependency behind `/readyz` and `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DepState {
    /// Answers at once.
    #[default]
    Up,
    /// Answers after two seconds.
    Slow,
    /// Fails.
    Down,
}

/// A fault or dependency state that could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FaultParseError {
    /// Not one of the known names.
    #[error(
        "unknown fault {0:?}: expected none, refuse, reset, stall, slow:DURATION or status:CODE"
    )]
    Unknown(String),
    /// `slow:` with a bad duration.
    #[error(transparent)]
    Duration(#[from] duration::DurationError),
    /// `status:` with a bad code.
    #[error("invalid status {0:?}: expected 100..=599")]
    Status(String),
    /// A dependency state other than up, slow, down.
    #[error("unknown dependency state {0:?}: expected up, slow or down")]
    Dep(String),
}

impl FromStr for Fault {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Some(d) = s.strip_prefix("slow:") {
            return Ok(Fault::Slow(duration::parse(d)?));
        }
        if let Some(code) = s.strip_prefix("status:") {
            return match code.trim().parse::<u16>() {
                Ok(c) if (100..=599).contains(&c) => Ok(Fault::Status(c)),
                _ => Err(FaultParseError::Status(code.to_owned())),
            };
        }
        match s {
            "none" => Ok(Fault::None),
            "refuse" => Ok(Fault::Refuse),
            "reset" => Ok(Fault::ResetMidResponse),
            "stall" => Ok(Fault::Stall),
            other => Err(FaultParseError::Unknown(other.to_owned())),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::None => f.write_str("none"),
            Fault::Refuse => f.write_str("refuse"),
            Fault::ResetMidResponse => f.write_str("reset"),
            Fault::Stall => f.write_str("stall"),
            Fault::Slow(d) => write!(f, "slow:{}", duration::format(*d)),
            Fault::Status(c) => write!(f, "status:{c}"),
        }
    }
}

impl FromStr for DepState {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "up" => Ok(DepState::Up),
            "slow" => Ok(DepState::Slow),
            "down" => Ok(DepState::Down),
            other => Err(FaultParseError::Dep(other.to_owned())),
        }
    }
}

impl fmt::Display for DepState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DepState::Up => "up",
            DepState::Slow => "slow",
            DepState::Down => "down",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_text_round_trips() {
        for f in [
            Fault::None,
            Fault::Refuse,
            Fault::ResetMidResponse,
            Fault::Stall,
            Fault::Slow(Duration::from_millis(200)),
            Fault::Status(503),
        ] {
            assert_eq!(f.to_string().parse::<Fault>().unwrap(), f);
        }
    }

    #[test]
    fn bad_fault_text_is_an_error() {
        assert!(matches!(
            "explode".parse::<Fault>(),
            Err(FaultParseError::Unknown(_))
        ));
        assert!(matches!(
            "status:99".parse::<Fault>(),
            Err(FaultParseError::Status(_))
        ));
        assert!("slow:soon".parse::<Fault>().is_err());
    }
}
