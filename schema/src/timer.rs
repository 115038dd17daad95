//! The timer model's counters in the report (`timers`).

use serde::{Deserialize, Serialize};

/// A read-out of a timer model's counters at one moment (the report's `timers`; the `timer`
/// crate keeps them live and reads them with `Metrics::read`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TimerMetrics {
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
