//! `--timer-slack`: how late a halted vCPU's wake-up (and the global timers it serves) may
//! come so that the host can serve several with one wake-up (the ranges themselves are
//! `idle::slack`).

use std::fmt;
use std::str::FromStr;

use crate::config::knob::{format_duration_ns, parse_duration_ns, KnobError};
use crate::config::limits::MAX_TIMER_SLACK_NS;

/// `--timer-slack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimerSlack {
    /// Hard wake-ups (1 ns thread slack, an absolute timerfd): today's behaviour.
    #[default]
    Off,
    /// A halted vCPU wakes anywhere in `[deadline, deadline + ns]` (less the timer advance):
    /// 1 ns to [`MAX_TIMER_SLACK_NS`].
    Range(u64),
}

impl TimerSlack {
    /// The slack in nanoseconds; 0 when off.
    pub fn ns(self) -> u64 {
        match self {
            Self::Off => 0,
            Self::Range(ns) => ns,
        }
    }

    /// True unless off.
    pub fn is_on(self) -> bool {
        self != Self::Off
    }
}

impl FromStr for TimerSlack {
    type Err = KnobError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "off" {
            return Ok(Self::Off);
        }
        let ns = parse_duration_ns(s).map_err(|_| {
            KnobError(format!(
                "'{s}' is not a timer slack: use off or a duration such as 100us or 1ms"
            ))
        })?;
        match ns {
            0 => Err(KnobError(format!(
                "'{s}' is no slack: write off for hard wake-ups"
            ))),
            ns if ns > MAX_TIMER_SLACK_NS => Err(KnobError(format!(
                "timer slack '{s}' is above the limit of {}: a guest timer may be late by the \
                 whole slack",
                format_duration_ns(MAX_TIMER_SLACK_NS)
            ))),
            ns => Ok(Self::Range(ns)),
        }
    }
}

impl fmt::Display for TimerSlack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Range(ns) => f.write_str(&format_duration_ns(*ns)),
        }
    }
}

crate::string_serde!(TimerSlack);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_parses_prints_and_keeps_to_its_bounds() {
        for s in ["off", "100us", "1ms", "10ms", "250ns"] {
            let v: TimerSlack = s.parse().unwrap();
            assert_eq!(v.to_string(), s);
        }
        assert_eq!(
            "1ms".parse::<TimerSlack>(),
            Ok(TimerSlack::Range(1_000_000))
        );
        assert_eq!(TimerSlack::default(), TimerSlack::Off);
        assert_eq!(TimerSlack::Off.ns(), 0);
        let too_much = "11ms".parse::<TimerSlack>().unwrap_err().0;
        assert!(too_much.contains("10ms"), "{too_much}");
        assert!("0ns".parse::<TimerSlack>().unwrap_err().0.contains("off"));
        assert!("100".parse::<TimerSlack>().is_err());
        assert!("lots".parse::<TimerSlack>().is_err());
    }
}
