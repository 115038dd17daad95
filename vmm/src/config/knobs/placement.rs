//! `--wake-placement`: where the host may wake a blocked vCPU thread (the placement itself,
//! and why, is `idle::placement`).

use std::fmt;
use std::str::FromStr;

use crate::config::knob::{format_duration_ns, parse_duration_ns, KnobError};

/// Longest expected sleep for which `cache-hot` binds a vCPU by default.
pub const DEFAULT_MAX_SLEEP_NS: u64 = 2_000_000;

/// `--wake-placement`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WakePlacementMode {
    /// The scheduler places every wake-up.
    #[default]
    Off,
    /// Bind a vCPU to its CPU for sleeps of at most `max_sleep_ns`.
    CacheHot {
        /// Longest expected sleep that binds.
        max_sleep_ns: u64,
    },
}

impl FromStr for WakePlacementMode {
    type Err = KnobError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |s: &str| {
            KnobError(format!(
                "'{s}' is not a wake placement: use off, cache-hot or cache-hot=MAX (e.g. cache-hot=1ms)"
            ))
        };
        match s {
            "off" => Ok(Self::Off),
            "cache-hot" => Ok(Self::CacheHot {
                max_sleep_ns: DEFAULT_MAX_SLEEP_NS,
            }),
            other => match other.strip_prefix("cache-hot=") {
                Some(max) => parse_duration_ns(max)
                    .map(|max_sleep_ns| Self::CacheHot { max_sleep_ns })
                    .map_err(|_| bad(other)),
                None => Err(bad(other)),
            },
        }
    }
}

impl fmt::Display for WakePlacementMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::CacheHot { max_sleep_ns } if *max_sleep_ns == DEFAULT_MAX_SLEEP_NS => {
                f.write_str("cache-hot")
            }
            Self::CacheHot { max_sleep_ns } => {
                write!(f, "cache-hot={}", format_duration_ns(*max_sleep_ns))
            }
        }
    }
}

crate::string_serde!(WakePlacementMode);

#[cfg(test)]
mod tests {
    use super::*;

    const HOT: WakePlacementMode = WakePlacementMode::CacheHot {
        max_sleep_ns: DEFAULT_MAX_SLEEP_NS,
    };

    #[test]
    fn modes_parse_and_print() {
        assert_eq!("off".parse(), Ok(WakePlacementMode::Off));
        assert_eq!("cache-hot".parse(), Ok(HOT));
        assert_eq!(
            "cache-hot=500us".parse(),
            Ok(WakePlacementMode::CacheHot {
                max_sleep_ns: 500_000
            })
        );
        assert!("cache-hot=500".parse::<WakePlacementMode>().is_err());
        assert!("pinned".parse::<WakePlacementMode>().is_err());
        assert_eq!(HOT.to_string(), "cache-hot");
        let m = WakePlacementMode::CacheHot {
            max_sleep_ns: 1_000_000,
        };
        assert_eq!(m.to_string(), "cache-hot=1ms");
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<WakePlacementMode>(&j).unwrap(), m);
    }
}
