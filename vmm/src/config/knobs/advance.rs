//! `--timer-advance`: how early a vCPU's host timer is armed for its LAPIC deadline (the
//! advance itself is `idle::advance`).

use std::fmt;
use std::str::FromStr;

use crate::config::knob::{format_duration_ns, parse_duration_ns, KnobError};

/// Default upper bound of the adaptive advance (and of one wait).
pub const DEFAULT_MAX_ADVANCE_NS: u64 = 100_000;

/// `--timer-advance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerAdvanceMode {
    /// Arm at the deadline.
    Off,
    /// Learn the advance, at most `max_ns`.
    Adaptive {
        /// Upper bound of the advance and of one wait.
        max_ns: u64,
    },
    /// Always this advance.
    Fixed(u64),
}

impl Default for TimerAdvanceMode {
    fn default() -> Self {
        Self::Adaptive {
            max_ns: DEFAULT_MAX_ADVANCE_NS,
        }
    }
}

impl FromStr for TimerAdvanceMode {
    type Err = KnobError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |s: &str| {
            KnobError(format!(
                "'{s}' is not a timer advance: use off, adaptive, adaptive=MAX (e.g. adaptive=50us) or a duration such as 20us"
            ))
        };
        match s {
            "off" => Ok(Self::Off),
            "adaptive" => Ok(Self::default()),
            other => match other.strip_prefix("adaptive=") {
                Some(max) => parse_duration_ns(max)
                    .map(|max_ns| Self::Adaptive { max_ns })
                    .map_err(|_| bad(other)),
                None => parse_duration_ns(other)
                    .map(Self::Fixed)
                    .map_err(|_| bad(other)),
            },
        }
    }
}

impl fmt::Display for TimerAdvanceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Adaptive {
                max_ns: DEFAULT_MAX_ADVANCE_NS,
            } => f.write_str("adaptive"),
            Self::Adaptive { max_ns } => write!(f, "adaptive={}", format_duration_ns(*max_ns)),
            Self::Fixed(ns) => f.write_str(&format_duration_ns(*ns)),
        }
    }
}

crate::string_serde!(TimerAdvanceMode);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for s in ["off", "adaptive", "adaptive=50us", "20us"] {
            let m: TimerAdvanceMode = s.parse().unwrap();
            assert_eq!(m.to_string(), s);
        }
        assert!("soon".parse::<TimerAdvanceMode>().is_err());
        assert!("adaptive=x".parse::<TimerAdvanceMode>().is_err());
    }
}
