//! Counters every timer model keeps, for the VMM's metrics output.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters (relaxed atomics, shared by all CPUs of a model).
#[derive(Debug, Default)]
pub struct Metrics {
    host_timer_arms: AtomicU64,
    host_timer_errors: AtomicU64,
    local_expiries: AtomicU64,
    remote_expiries: AtomicU64,
    remote_runs: AtomicU64,
    wakeups_requested: AtomicU64,
    wake_timer_arms: AtomicU64,
    wake_retargets: AtomicU64,
    timer_wakeups: AtomicU64,
    empty_wakeups: AtomicU64,
}

/// A read-out of the counters at one moment (the `timers` of lull's `--metrics` JSON; the
/// type lives with the rest of the report in `lull_schema`).
pub use lull_schema::TimerMetrics;

impl Metrics {
    pub(crate) fn host_arm(&self, ok: bool) {
        self.host_timer_arms.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.host_timer_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn local(&self, n: usize) {
        if n > 0 {
            self.local_expiries.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    pub(crate) fn remote(&self, n: usize) {
        if n > 0 {
            self.remote_expiries.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    pub(crate) fn remote_run(&self) {
        self.remote_runs.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn wakeup(&self) {
        self.wakeups_requested.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn wake_arm(&self, remote: bool) {
        self.wake_timer_arms.fetch_add(1, Ordering::Relaxed);
        if remote {
            self.wake_retargets.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A CPU woke from idle at or after its host wake-up's deadline; `busy`: it found
    /// something due.
    pub(crate) fn timer_wakeup(&self, busy: bool) {
        self.timer_wakeups.fetch_add(1, Ordering::Relaxed);
        if !busy {
            self.empty_wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads all counters.
    pub fn read(&self) -> TimerMetrics {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TimerMetrics {
            host_timer_arms: r(&self.host_timer_arms),
            host_timer_errors: r(&self.host_timer_errors),
            local_expiries: r(&self.local_expiries),
            remote_expiries: r(&self.remote_expiries),
            remote_runs: r(&self.remote_runs),
            wakeups_requested: r(&self.wakeups_requested),
            wake_timer_arms: r(&self.wake_timer_arms),
            wake_retargets: r(&self.wake_retargets),
            timer_wakeups: r(&self.timer_wakeups),
            empty_wakeups: r(&self.empty_wakeups),
        }
    }
}
