//! Per-VM CPU quota (`--cpu-quota quota=MS,period=MS[,phase=random|aligned]`): in each period
//! the VM's vCPUs together may run `quota` of guest time; once it is used up they are parked
//! until the period ends. With `phase=random` (the default) the periods of a VM start at a
//! random offset, so VMs started together do not throttle in lockstep.

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;

use crate::config::knobs::{CpuQuotaConfig, QuotaPhase};

#[derive(Debug, Default)]
struct QuotaState {
    period: u64,
    used_ns: u64,
    throttled_period: Option<u64>,
    throttled_periods: u64,
    throttled_ns: u64,
    intervals: Vec<(u64, u64)>,
}

pub use lull_schema::QuotaReport;

/// Most intervals kept for the report.
const MAX_INTERVALS: usize = 100_000;

/// The VM-wide CPU budget.
#[derive(Debug)]
pub struct CpuQuota {
    cfg: CpuQuotaConfig,
    phase_ns: u64,
    state: Mutex<QuotaState>,
}

impl CpuQuota {
    /// A budget for a VM whose clock reads 0 at CLOCK_MONOTONIC `epoch_mono_ns`; a random
    /// phase is drawn now.
    pub fn new(cfg: CpuQuotaConfig, epoch_mono_ns: u64) -> Self {
        let phase_ns = match cfg.phase {
            QuotaPhase::Aligned => (cfg.period_ns - epoch_mono_ns % cfg.period_ns) % cfg.period_ns,
            QuotaPhase::Random => {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u64(u64::from(std::process::id()));
                h.finish() % cfg.period_ns
            }
        };
        Self::with_phase(cfg, phase_ns)
    }

    /// A budget with a given phase (tests).
    pub fn with_phase(cfg: CpuQuotaConfig, phase_ns: u64) -> Self {
        Self {
            cfg,
            phase_ns: phase_ns % cfg.period_ns,
            state: Mutex::new(QuotaState::default()),
        }
    }

    /// Index and end of the period containing `t`.
    pub fn period(&self, t: u64) -> (u64, u64) {
        let p = self.cfg.period_ns;
        let shifted = t + (p - self.phase_ns);
        let index = shifted / p;
        (index, (index + 1) * p - (p - self.phase_ns))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QuotaState> {
        timer::lock(&self.state)
    }

    fn roll(&self, s: &mut QuotaState, now: u64) {
        let (index, _) = self.period(now);
        if index != s.period {
            s.period = index;
            s.used_ns = 0;
        }
    }

    /// Charges `ran_ns` of guest run time ending at `now`.
    pub fn charge(&self, now: u64, ran_ns: u64) {
        let mut s = self.lock();
        self.roll(&mut s, now);
        s.used_ns = s.used_ns.saturating_add(ran_ns);
    }

    /// Budget left in the current period.
    pub fn remaining(&self, now: u64) -> u64 {
        let mut s = self.lock();
        self.roll(&mut s, now);
        self.cfg.quota_ns.saturating_sub(s.used_ns)
    }

    /// If the budget of the current period is used up, the period's end (when to resume).
    /// Records the throttled interval (VM-wide, once per period); `mono` maps VM-clock to
    /// CLOCK_MONOTONIC for the report.
    pub fn throttled_until(&self, now: u64, mono: impl Fn(u64) -> u64) -> Option<u64> {
        let mut s = self.lock();
        self.roll(&mut s, now);
        if s.used_ns < self.cfg.quota_ns {
            return None;
        }
        let (index, end) = self.period(now);
        if s.throttled_period != Some(index) {
            s.throttled_period = Some(index);
            s.throttled_periods += 1;
            s.throttled_ns += end - now;
            if s.intervals.len() < MAX_INTERVALS {
                s.intervals.push((mono(now), mono(end)));
            }
        }
        Some(end)
    }

    /// The report.
    pub fn report(&self) -> QuotaReport {
        let s = self.lock();
        QuotaReport {
            config: self.cfg.to_string(),
            phase_ns: self.phase_ns,
            throttled_periods: s.throttled_periods,
            throttled_ns: s.throttled_ns,
            intervals: s.intervals.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_follow_the_phase() {
        let cfg: CpuQuotaConfig = "quota=10,period=100".parse().unwrap();
        let q = CpuQuota::with_phase(cfg, 30_000_000);
        let (a, end_a) = q.period(0);
        assert_eq!(end_a, 30_000_000);
        let (b, end_b) = q.period(30_000_000);
        assert_eq!((b, end_b), (a + 1, 130_000_000));
        let (_, end) = CpuQuota::with_phase(cfg, 0).period(5);
        assert_eq!(end, 100_000_000);
        // Aligned: boundaries where CLOCK_MONOTONIC is a multiple of the period.
        let aligned: CpuQuotaConfig = "quota=10,period=100,phase=aligned".parse().unwrap();
        let q = CpuQuota::new(aligned, 1_030_000_000);
        let (_, end) = q.period(0);
        assert_eq!((1_030_000_000 + end) % 100_000_000, 0);
    }

    #[test]
    fn budget_is_per_period_and_throttling_recorded_once() {
        let cfg: CpuQuotaConfig = "quota=10,period=100,phase=aligned".parse().unwrap();
        let q = CpuQuota::new(cfg, 0);
        q.charge(1_000_000, 6_000_000);
        assert_eq!(q.throttled_until(2_000_000, |t| t), None);
        q.charge(3_000_000, 6_000_000);
        assert_eq!(q.remaining(3_000_000), 0);
        assert_eq!(q.throttled_until(4_000_000, |t| t), Some(100_000_000));
        assert_eq!(q.throttled_until(5_000_000, |t| t), Some(100_000_000));
        // Next period: fresh budget.
        assert_eq!(q.throttled_until(100_000_000, |t| t), None);
        let r = q.report();
        assert_eq!((r.throttled_periods, r.throttled_ns), (1, 96_000_000));
        assert_eq!(r.intervals, vec![(4_000_000, 100_000_000)]);
    }
}
