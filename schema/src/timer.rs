//! The timer model's counters in the report (`timers`), and the live counters they are read
//! from, declared with them (`counter_set!`).

use std::sync::atomic::AtomicU64;

use serde::{Deserialize, Serialize};

use crate::counter_set::counter_set;

counter_set! {
    /// A timer model's live counters (relaxed atomics, shared by all CPUs of a model); the
    /// `timer` crate's `Metrics` bumps them and reads them with `Metrics::read`.
    #[derive(Debug, Default)]
    pub struct TimerCounters;

    /// A read-out of a timer model's counters at one moment (the report's `timers`).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(default)]
    pub struct TimerMetrics {
        /// Host timers programmed (timerfd/POSIX timer syscalls, or fakes).
        host_timer_arms: AtomicU64 => u64,
        /// Host timer syscalls that failed.
        host_timer_errors: AtomicU64 => u64,
        /// Timers fired on their own CPU's thread.
        local_expiries: AtomicU64 => u64,
        /// Timers fired by another thread on the owner's behalf.
        remote_expiries: AtomicU64 => u64,
        /// Times a migrator (or the central thread) ran remote expiry.
        remote_runs: AtomicU64 => u64,
        /// Kicks requested through the `Waker` (owner notifications and migrator kicks).
        wakeups_requested: AtomicU64 => u64,
        /// Blocked CPUs' host wake-ups programmed (armed or disarmed; the arms are also
        /// counted in `host_timer_arms`), by the sleeper going idle or by another thread
        /// moving it.
        wake_timer_arms: AtomicU64 => u64,
        /// Host wake-ups re-armed by another thread while their CPU slept (its wake-up duty
        /// was taken over), without waking it.
        wake_retargets: AtomicU64 => u64,
        /// Wake-ups from idle at or after the deadline the CPU's host wake-up was armed for.
        timer_wakeups: AtomicU64 => u64,
        /// Of `timer_wakeups`, those that found nothing to do: no own timer due and no remote
        /// expiry due as migrator. The pull model's goal is 0.
        empty_wakeups: AtomicU64 => u64,
    }
}
