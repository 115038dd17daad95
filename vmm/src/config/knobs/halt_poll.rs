//! `--halt-poll`: how long a halted vCPU polls before it blocks (the poller is
//! `idle::halt_poll`).

use std::fmt;
use std::str::FromStr;

use crate::config::knob::{format_duration_ns, parse_duration_ns, KnobError};

/// `--halt-poll`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HaltPollMode {
    /// Block at once.
    #[default]
    Off,
    /// Poll for this many nanoseconds (never past the next pinned deadline).
    Fixed(u64),
    /// Timer-aware adaptive window.
    Adaptive,
}

impl FromStr for HaltPollMode {
    type Err = KnobError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" | "0" => Ok(Self::Off),
            "adaptive" => Ok(Self::Adaptive),
            other => parse_duration_ns(other).map(Self::Fixed).map_err(|_| {
                KnobError(format!("'{other}' is not a halt-poll mode: use off, adaptive or a duration such as 50us"))
            }),
        }
    }
}

impl fmt::Display for HaltPollMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Fixed(ns) => f.write_str(&format_duration_ns(*ns)),
            Self::Adaptive => f.write_str("adaptive"),
        }
    }
}

crate::string_serde!(HaltPollMode);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        assert_eq!("off".parse(), Ok(HaltPollMode::Off));
        assert_eq!("adaptive".parse(), Ok(HaltPollMode::Adaptive));
        assert_eq!("50us".parse(), Ok(HaltPollMode::Fixed(50_000)));
        assert!("sometimes".parse::<HaltPollMode>().is_err());
        assert_eq!(HaltPollMode::Fixed(50_000).to_string(), "50us");
        let j = serde_json::to_string(&HaltPollMode::Adaptive).unwrap();
        assert_eq!(
            serde_json::from_str::<HaltPollMode>(&j).unwrap(),
            HaltPollMode::Adaptive
        );
    }
}
