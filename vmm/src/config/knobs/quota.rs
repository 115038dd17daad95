//! `--cpu-quota quota=MS,period=MS[,phase=random|aligned]`: the per-VM CPU quota (the budget
//! is `idle::quota`).

use std::fmt;
use std::str::FromStr;

use crate::config::knob::{format_duration_ns, parse_ms_or_duration, parse_pairs, KnobError};

/// Where periods start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaPhase {
    /// At a random offset.
    Random,
    /// At multiples of the period on the host's CLOCK_MONOTONIC: every VM on the host
    /// starts its periods at the same instants (the lockstep that `random` avoids).
    Aligned,
}

/// `--cpu-quota`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuQuotaConfig {
    /// Guest run time allowed per period, all vCPUs together.
    pub quota_ns: u64,
    /// Period length.
    pub period_ns: u64,
    /// Period phase.
    pub phase: QuotaPhase,
}

impl FromStr for CpuQuotaConfig {
    type Err = KnobError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = || {
            KnobError(format!("'{s}' is not a CPU quota: use quota=MS,period=MS[,phase=random|aligned], e.g. quota=50,period=100"))
        };
        let (mut quota, mut period, mut phase) = (None, 100_000_000, QuotaPhase::Random);
        for (k, v) in parse_pairs(s) {
            match k {
                "quota" => quota = Some(parse_ms_or_duration(v).map_err(|_| usage())?),
                "period" => period = parse_ms_or_duration(v).map_err(|_| usage())?,
                "phase" => {
                    phase = match v {
                        "random" => QuotaPhase::Random,
                        "aligned" => QuotaPhase::Aligned,
                        _ => return Err(usage()),
                    }
                }
                _ => return Err(usage()),
            }
        }
        let quota_ns = quota.ok_or_else(usage)?;
        if period < 1_000_000 || quota_ns == 0 {
            return Err(KnobError(
                "cpu-quota needs quota > 0 and period >= 1ms".into(),
            ));
        }
        Ok(Self {
            quota_ns,
            period_ns: period,
            phase,
        })
    }
}

impl fmt::Display for CpuQuotaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phase = match self.phase {
            QuotaPhase::Random => "random",
            QuotaPhase::Aligned => "aligned",
        };
        write!(
            f,
            "quota={},period={},phase={phase}",
            format_duration_ns(self.quota_ns),
            format_duration_ns(self.period_ns)
        )
    }
}

crate::string_serde!(CpuQuotaConfig);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let c: CpuQuotaConfig = "quota=50,period=100,phase=aligned".parse().unwrap();
        assert_eq!(c.quota_ns, 50_000_000);
        assert_eq!(c.phase, QuotaPhase::Aligned);
        assert_eq!(c.to_string().parse::<CpuQuotaConfig>().unwrap(), c);
        assert_eq!(
            "quota=5".parse::<CpuQuotaConfig>().unwrap().phase,
            QuotaPhase::Random
        );
        assert!("period=100".parse::<CpuQuotaConfig>().is_err());
        assert!("quota=5,phase=sometimes".parse::<CpuQuotaConfig>().is_err());
    }
}
