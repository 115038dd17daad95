//! The kit's Linux guests' own figures (`lull.workload=` reports, `workload_output.rs`)
//! summed over the VMs of a `lull bench density --guest linux` run.

use super::guest_output::LatencySummary;
use super::workload_output::{self, WorkloadReport};

/// The median of `v` (the lower middle for an even count), 0 for none.
fn median_u64(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

/// The guests' own figures summed over the VMs that reported them.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct GuestRates {
    /// VMs with a `cpu=all` counters line.
    pub(crate) vms: u32,
    /// vCPUs they counted.
    pub(crate) cpus: u64,
    /// Per second of each VM's workload, summed over the VMs.
    pub(crate) loc_per_s: f64,
    pub(crate) idle_calls_per_s: f64,
    pub(crate) ipis_per_s: f64,
    pub(crate) timer_events_per_s: f64,
    pub(crate) idle_pct_sum: f64,
    /// `timers` totals: (events, late p50, p99, max, mean; wake p50, p99, max), per VM.
    pub(crate) timers: Vec<workload_output::TimerTotals>,
}

impl GuestRates {
    pub(crate) fn add(&mut self, r: &WorkloadReport) {
        let Some(c) = r.counters.filter(|c| c.run_us > 0) else {
            return;
        };
        let secs = c.run_us as f64 / 1e6;
        self.vms += 1;
        self.cpus += c.cpus;
        self.loc_per_s += c.loc as f64 / secs;
        self.idle_calls_per_s += c.wakeups as f64 / secs;
        self.ipis_per_s += (c.res + c.cal) as f64 / secs;
        self.idle_pct_sum += c.idle_pct;
        if let Some(t) = r.timers {
            self.timer_events_per_s += t.events as f64 / secs;
            self.timers.push(t);
        }
    }

    /// Combines the VMs' `timers` totals: `late` (callback) or the thread's wake.
    pub(crate) fn lateness(&self, thread: bool) -> Option<LatencySummary> {
        if self.timers.is_empty() {
            return None;
        }
        let pick = |t: &workload_output::TimerTotals| {
            if thread {
                (t.wake_p50_us, t.wake_p99_us, t.wake_max_us, None)
            } else {
                (
                    t.late_p50_us,
                    t.late_p99_us,
                    t.late_max_us,
                    Some(t.late_mean_us),
                )
            }
        };
        let n: u64 = self.timers.iter().map(|t| t.events).sum();
        let weighted: u64 = self
            .timers
            .iter()
            .filter_map(|t| Some(pick(t).3? * t.events))
            .sum();
        Some(LatencySummary {
            n,
            p50_ns: median_u64(self.timers.iter().map(|t| pick(t).0).collect()) * 1000,
            p99_ns: self.timers.iter().map(|t| pick(t).1).max().unwrap_or(0) * 1000,
            max_ns: self.timers.iter().map(|t| pick(t).2).max().unwrap_or(0) * 1000,
            mean_ns: if thread || n == 0 {
                0
            } else {
                weighted / n * 1000
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload_output::parse_workload;
    use crate::workload_output::tests::TIMERS_LOG;

    #[test]
    fn guest_rates_are_per_second_of_each_workload() {
        let mut g = GuestRates::default();
        let r = parse_workload(TIMERS_LOG);
        g.add(&r);
        g.add(&r);
        g.add(&WorkloadReport::default()); // a VM that never reported adds nothing
        assert_eq!((g.vms, g.cpus), (2, 4));
        // 418 loc over 10.025589 s, twice.
        assert!((g.loc_per_s - 2.0 * 418.0 / 10.025_589).abs() < 1e-9);
        assert!((g.ipis_per_s - 2.0 * 65.0 / 10.025_589).abs() < 1e-9);
        let late = g.lateness(false).unwrap();
        assert_eq!(late.n, 356);
        assert_eq!((late.p50_ns, late.p99_ns), (1_966_000, 19_922_000));
        assert_eq!((late.max_ns, late.mean_ns), (19_975_000, 3_197_000));
        let wake = g.lateness(true).unwrap();
        assert_eq!(
            (wake.p50_ns, wake.p99_ns, wake.max_ns),
            (8_126_000, 37_748_000, 40_075_000)
        );
    }

    #[test]
    fn vm_lateness_combines_as_documented() {
        let t = |p50, p99, max, mean, events| workload_output::TimerTotals {
            events,
            late_p50_us: p50,
            late_p99_us: p99,
            late_max_us: max,
            late_mean_us: mean,
            ..Default::default()
        };
        let g = GuestRates {
            timers: vec![
                t(100, 900, 1000, 200, 100),
                t(300, 5000, 7000, 600, 300),
                t(200, 800, 850, 100, 100),
            ],
            ..GuestRates::default()
        };
        let l = g.lateness(false).unwrap();
        // Median of the p50s, largest p99 and max, event-weighted mean.
        assert_eq!(
            (l.p50_ns, l.p99_ns, l.max_ns),
            (200_000, 5_000_000, 7_000_000)
        );
        assert_eq!(l.mean_ns, (200 * 100 + 600 * 300 + 100 * 100) / 500 * 1000);
        assert_eq!(GuestRates::default().lateness(false), None);
    }
}
