//! Counters every timer model keeps, for the VMM's metrics output.

use std::sync::atomic::Ordering;

use lull_schema::TimerCounters;

/// Live counters (relaxed atomics, shared by all CPUs of a model), bumped by event; the
/// counters themselves are declared once with their read-out in `lull_schema`.
#[derive(Debug, Default)]
pub struct Metrics(TimerCounters);

/// A read-out of the counters at one moment (the `timers` of lull's `--metrics` JSON).
pub use lull_schema::TimerMetrics;

impl Metrics {
    pub(crate) fn host_arm(&self, ok: bool) {
        self.0.host_timer_arms.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.0.host_timer_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn local(&self, n: usize) {
        if n > 0 {
            self.0.local_expiries.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    pub(crate) fn remote(&self, n: usize) {
        if n > 0 {
            self.0
                .remote_expiries
                .fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    pub(crate) fn remote_run(&self) {
        self.0.remote_runs.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn wakeup(&self) {
        self.0.wakeups_requested.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn wake_arm(&self, remote: bool) {
        self.0.wake_timer_arms.fetch_add(1, Ordering::Relaxed);
        if remote {
            self.0.wake_retargets.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A CPU woke from idle at or after its host wake-up's deadline; `busy`: it found
    /// something due.
    pub(crate) fn timer_wakeup(&self, busy: bool) {
        self.0.timer_wakeups.fetch_add(1, Ordering::Relaxed);
        if !busy {
            self.0.empty_wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads all counters.
    pub fn read(&self) -> TimerMetrics {
        self.0.read()
    }
}
