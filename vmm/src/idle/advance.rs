//! Timer advance, after KVM's adaptive `lapic_timer_advance`: a vCPU's host timer for its
//! LAPIC deadline is armed early by the wake-up latency the vCPU has been seeing, and when it
//! fires early the vCPU waits (spins) until the deadline before the interrupt is made pending,
//! so the guest gets its interrupt as soon after the deadline as the host allows and never
//! before it.
//!
//! The advance is learned per vCPU: after each expiry, the latency (time from the host timer's
//! armed instant to the vCPU handling it) moves the advance an eighth of the way towards it,
//! within `[0, max]`; `max` also bounds how long one wait may burn.

use std::fmt;
use std::str::FromStr;

use crate::config::knob::{format_duration_ns, parse_duration_ns, KnobError};

/// Default upper bound of the adaptive advance (and of one wait).
pub const DEFAULT_MAX_ADVANCE_NS: u64 = 100_000;
/// The advance moves by 1/ADJUST_DIVISOR of its error per expiry.
const ADJUST_DIVISOR: u64 = 8;

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

impl TimerAdvanceMode {
    fn max(self) -> u64 {
        match self {
            Self::Off => 0,
            Self::Adaptive { max_ns } | Self::Fixed(max_ns) => max_ns,
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

/// One vCPU's timer advance.
#[derive(Debug, Clone)]
pub struct TimerAdvance {
    mode: TimerAdvanceMode,
    advance_ns: u64,
}

impl TimerAdvance {
    /// The advance of a vCPU in `mode` (adaptive starts at 0).
    pub fn new(mode: TimerAdvanceMode) -> Self {
        let advance_ns = match mode {
            TimerAdvanceMode::Fixed(ns) => ns,
            _ => 0,
        };
        Self { mode, advance_ns }
    }

    /// The current advance.
    pub fn advance_ns(&self) -> u64 {
        self.advance_ns
    }

    /// When to arm the host timer for a LAPIC deadline.
    pub fn arm_at(&self, deadline: u64) -> u64 {
        deadline.saturating_sub(self.advance_ns)
    }

    /// The timer armed at `armed_at` was handled at `now`: learn from the latency.
    pub fn learn(&mut self, armed_at: u64, now: u64) {
        let TimerAdvanceMode::Adaptive { max_ns: max } = self.mode else {
            return;
        };
        let latency = now.saturating_sub(armed_at).min(max);
        let a = self.advance_ns;
        self.advance_ns = if latency > a {
            a + (latency - a) / ADJUST_DIVISOR
        } else {
            a - (a - latency) / ADJUST_DIVISOR
        }
        .min(max);
    }

    /// Handled at `now` before `deadline`: wait until the deadline (`Some`), or re-arm for it
    /// (`None`) if that is further away than an advance may burn.
    pub fn wait_until(&self, deadline: u64, now: u64) -> Option<u64> {
        (deadline > now && deadline - now <= self.mode.max()).then_some(deadline)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

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

    #[test]
    fn off_never_advances_and_fixed_stays() {
        let mut off = TimerAdvance::new(TimerAdvanceMode::Off);
        off.learn(0, 80_000);
        assert_eq!(off.arm_at(1_000_000), 1_000_000);
        assert_eq!(off.wait_until(1_000_000, 999_999), None);
        let mut fixed = TimerAdvance::new(TimerAdvanceMode::Fixed(20_000));
        fixed.learn(0, 80_000);
        assert_eq!(fixed.arm_at(1_000_000), 980_000);
    }

    proptest! {
        /// The advance converges towards a steady latency, never past `max`, and a wait never
        /// burns more than `max` nor ends before the deadline.
        #[test]
        fn adaptive_converges_within_its_bound(
            max in 1_000u64..500_000,
            latency in 0u64..1_000_000,
            deadline in 1_000_000u64..1_000_000_000,
            now_before in 0u64..1_000_000,
        ) {
            let mut a = TimerAdvance::new(TimerAdvanceMode::Adaptive { max_ns: max });
            for _ in 0..200 {
                let armed = a.arm_at(deadline);
                a.learn(armed, armed + latency);
                prop_assert!(a.advance_ns() <= max);
            }
            let target = latency.min(max);
            prop_assert!(a.advance_ns().abs_diff(target) <= ADJUST_DIVISOR, "{} vs {target}", a.advance_ns());
            let now = deadline - now_before.min(deadline);
            if let Some(until) = a.wait_until(deadline, now) {
                prop_assert_eq!(until, deadline);
                prop_assert!(deadline - now <= max);
            }
        }
    }
}
