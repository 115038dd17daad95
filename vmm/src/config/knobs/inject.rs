//! `--idle-inject percent=P,period=MS`: synchronized idle injection (the injector is
//! `idle::inject`).

use std::fmt;
use std::str::FromStr;

use crate::config::knob::{format_duration_ns, parse_ms_or_duration, parse_pairs, KnobError};

/// `--idle-inject`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleInjectConfig {
    /// Share of each period held idle, 1 to 90.
    pub percent: u8,
    /// Period length.
    pub period_ns: u64,
}

impl FromStr for IdleInjectConfig {
    type Err = KnobError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = || {
            KnobError(format!("'{s}' is not an idle-injection setting: use percent=P,period=MS, e.g. percent=25,period=100"))
        };
        let (mut percent, mut period_ns) = (None, 100_000_000);
        for (k, v) in parse_pairs(s) {
            match k {
                "percent" => percent = Some(v.parse::<u8>().map_err(|_| usage())?),
                "period" => period_ns = parse_ms_or_duration(v).map_err(|_| usage())?,
                _ => return Err(usage()),
            }
        }
        let percent = percent.ok_or_else(usage)?;
        if !(1..=90).contains(&percent) {
            return Err(KnobError(format!(
                "idle-inject percent={percent} is out of range: use 1 to 90"
            )));
        }
        if period_ns < 1_000_000 {
            return Err(KnobError("idle-inject period must be at least 1ms".into()));
        }
        Ok(Self { percent, period_ns })
    }
}

impl fmt::Display for IdleInjectConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "percent={},period={}",
            self.percent,
            format_duration_ns(self.period_ns)
        )
    }
}

crate::string_serde!(IdleInjectConfig);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let c: IdleInjectConfig = "percent=25,period=100".parse().unwrap();
        assert_eq!(
            c,
            IdleInjectConfig {
                percent: 25,
                period_ns: 100_000_000
            }
        );
        assert_eq!(c.to_string(), "percent=25,period=100ms");
        assert_eq!(c.to_string().parse::<IdleInjectConfig>().unwrap(), c);
        assert!("percent=95".parse::<IdleInjectConfig>().is_err());
        assert!("period=100".parse::<IdleInjectConfig>().is_err());
        assert!("percent=10,period=100us"
            .parse::<IdleInjectConfig>()
            .is_err());
        assert!("percent=10,color=red".parse::<IdleInjectConfig>().is_err());
    }
}
