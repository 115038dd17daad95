//! `--global-timers COUNT[,period=MS]`: the synthetic load of global timers (the load itself
//! is `idle::global_load`).

use std::fmt;
use std::str::FromStr;

use crate::config::knob::{format_duration_ns, parse_ms_or_duration, parse_pairs, KnobError};

/// `--global-timers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalTimersConfig {
    /// Timers per vCPU.
    pub count: u32,
    /// Mean interval.
    pub period_ns: u64,
}

impl FromStr for GlobalTimersConfig {
    type Err = KnobError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = || {
            KnobError(format!(
                "'{s}' is not a global-timer load: use COUNT[,period=MS], e.g. 4,period=10"
            ))
        };
        let mut pairs = parse_pairs(s).into_iter();
        let (count, _) = pairs.next().ok_or_else(usage)?;
        let count: u32 = count.parse().map_err(|_| usage())?;
        let mut period_ns = 10_000_000;
        for (k, v) in pairs {
            match k {
                "period" => period_ns = parse_ms_or_duration(v).map_err(|_| usage())?,
                _ => return Err(usage()),
            }
        }
        if count == 0 || count > 1024 || period_ns < 100_000 {
            return Err(KnobError(
                "global timers: COUNT from 1 to 1024, period at least 100us".into(),
            ));
        }
        Ok(Self { count, period_ns })
    }
}

impl fmt::Display for GlobalTimersConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{},period={}",
            self.count,
            format_duration_ns(self.period_ns)
        )
    }
}

crate::string_serde!(GlobalTimersConfig);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let c: GlobalTimersConfig = "4,period=20".parse().unwrap();
        assert_eq!(
            c,
            GlobalTimersConfig {
                count: 4,
                period_ns: 20_000_000
            }
        );
        assert_eq!(c.to_string().parse::<GlobalTimersConfig>().unwrap(), c);
        assert_eq!(
            "2".parse::<GlobalTimersConfig>().unwrap().period_ns,
            10_000_000
        );
        assert!("0".parse::<GlobalTimersConfig>().is_err());
        assert!("x".parse::<GlobalTimersConfig>().is_err());
    }
}
