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

/// A copy of the counters at one moment (serialized with these field names in lull's
/// `--metrics` JSON).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetricsSnapshot {
    /// Host timers programmed (timerfd/POSIX timer syscalls, or fakes).
    pub host_timer_arms: u64,
    /// Host timer syscalls that failed.
    pub host_timer_errors: u64,
    /// Timers fired on their own CPU's thread.
    pub local_expiries: u64,
    /// Timers fired by another thread on the owner's behalf.
    pub remote_expiries: u64,
    /// Times a migrator (or the central thread) ran remote expiry.
    pub remote_runs: u64,
    /// Kicks requested through the `Waker` (owner notifications and migrator kicks).
    pub wakeups_requested: u64,
    /// Blocked CPUs' host wake-ups programmed (armed or disarmed; the arms are also counted
    /// in `host_timer_arms`), by the sleeper going idle or by another thread moving it.
    pub wake_timer_arms: u64,
    /// Host wake-ups re-armed by another thread while their CPU slept (its wake-up duty was
    /// taken over), without waking it.
    pub wake_retargets: u64,
    /// Wake-ups from idle at or after the deadline the CPU's host wake-up was armed for.
    pub timer_wakeups: u64,
    /// Of `timer_wakeups`, those that found nothing to do: no own timer due and no remote
    /// expiry due as migrator. The pull model's goal is 0.
    pub empty_wakeups: u64,
}

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
    pub fn snapshot(&self) -> MetricsSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
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
