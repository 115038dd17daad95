//! The VM's clock: CLOCK_MONOTONIC in nanoseconds since the VM was built, less the time the VM
//! spent paused. The timer models, the LAPIC model and the host timers (which arm absolute
//! CLOCK_MONOTONIC deadlines) share it.
//!
//! Pause and resume (`vm.pause`, `vm.resume`):
//!
//! ```text
//!  VM time ──────────/‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾\────────────  (flat while paused: no timer is due)
//!            running   freeze_at(m)    thaw(p)  running: epoch += p, so VM time goes on
//!                      now() = m - epoch        from where it stopped
//! ```
//!
//! Every timer lull keeps is a VM-clock deadline, so each resumes with the time it had left.
//! Host timers were armed at `epoch + deadline` in CLOCK_MONOTONIC: after a thaw that is `p`
//! too early, so [`VmClock::thaw`] re-arms every host timer registered with
//! [`VmClock::on_thaw`] for its deadline on the new epoch. While frozen, a deadline already
//! reached maps to the old epoch (it fires at once, as a past deadline should) and any later
//! one to "never": nothing becomes due while the VM is paused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use timer::{lock, Clock, Nanos, VmTime};

use crate::host::sys::clock::monotonic_ns;

/// CLOCK_MONOTONIC for a deadline that cannot come while the VM is paused (about 146 years:
/// still a valid `timespec`).
const FAR_FUTURE_NS: u64 = u64::MAX / 2;

/// A host timer armed for a VM-clock deadline, which must be armed again when the clock thaws.
pub trait Rearm: Send + Sync {
    /// Arms the host timer again for its deadline, converted with `clock` (just thawed).
    fn rearm(&self, clock: &VmClock);
}

#[derive(Default)]
struct ClockState {
    /// CLOCK_MONOTONIC at VM time 0, moved forward by every pause.
    epoch_ns: AtomicU64,
    /// While paused: the VM time it stopped at, plus 1; 0 while running.
    frozen: AtomicU64,
    /// The host timers to re-arm at a thaw.
    timers: Mutex<Vec<Weak<dyn Rearm>>>,
}

/// Nanoseconds since the VM's epoch, read from CLOCK_MONOTONIC; stopped while the VM is paused.
#[derive(Clone)]
pub struct VmClock {
    state: Arc<ClockState>,
}

impl std::fmt::Debug for VmClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmClock")
            .field("epoch_ns", &self.state.epoch_ns.load(Ordering::Relaxed))
            .field("frozen", &self.frozen())
            .finish()
    }
}

impl VmClock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self::starting_at(monotonic_ns())
    }

    /// A clock whose zero is CLOCK_MONOTONIC time `epoch_ns`.
    fn starting_at(epoch_ns: u64) -> Self {
        let state = ClockState::default();
        state.epoch_ns.store(epoch_ns, Ordering::Relaxed);
        Self {
            state: Arc::new(state),
        }
    }

    /// The VM time the clock stopped at, while it is stopped.
    fn frozen(&self) -> Option<Nanos> {
        self.state.frozen.load(Ordering::Acquire).checked_sub(1)
    }

    /// The CLOCK_MONOTONIC value of a VM-clock time, for absolute host timers (while paused:
    /// a time already reached fires at once, a later one never).
    pub fn to_monotonic(&self, t: Nanos) -> u64 {
        match self.frozen() {
            Some(at) if t > at => FAR_FUTURE_NS,
            _ => self
                .state
                .epoch_ns
                .load(Ordering::Acquire)
                .saturating_add(t),
        }
    }

    /// Stops the clock at CLOCK_MONOTONIC time `monotonic` (the VM is paused).
    pub fn freeze_at(&self, monotonic: u64) {
        let at = monotonic.saturating_sub(self.state.epoch_ns.load(Ordering::Acquire));
        self.state
            .frozen
            .store(at.saturating_add(1), Ordering::Release);
    }

    /// Starts the clock again after a pause of `paused_ns` (CLOCK_MONOTONIC from the freeze to
    /// now), from the time it stopped at, and re-arms every registered host timer.
    pub fn thaw(&self, paused_ns: u64) {
        if self.frozen().is_none() {
            return;
        }
        self.state.epoch_ns.fetch_add(paused_ns, Ordering::AcqRel);
        self.state.frozen.store(0, Ordering::Release);
        let timers: Vec<_> = {
            let mut list = lock(&self.state.timers);
            list.retain(|t| t.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for t in timers {
            t.rearm(self);
        }
    }

    /// Registers a host timer to re-arm at every thaw (held weakly: dropping it unregisters).
    pub fn on_thaw(&self, timer: Weak<dyn Rearm>) {
        lock(&self.state.timers).push(timer);
    }
}

impl Default for VmClock {
    fn default() -> Self {
        Self::new()
    }
}

impl VmTime for VmClock {
    fn to_monotonic(&self, t: Nanos) -> u64 {
        VmClock::to_monotonic(self, t)
    }

    fn freeze_at(&self, monotonic: u64) {
        VmClock::freeze_at(self, monotonic);
    }

    fn thaw(&self, paused_ns: u64) {
        VmClock::thaw(self, paused_ns);
    }
}

impl Clock for VmClock {
    fn now(&self) -> Nanos {
        match self.frozen() {
            Some(at) => at,
            None => monotonic_ns().saturating_sub(self.state.epoch_ns.load(Ordering::Acquire)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn clock_starts_near_zero_and_advances() {
        let c = VmClock::new();
        let a = c.now();
        let b = c.now();
        assert!(a < 1_000_000_000);
        assert!(b >= a);
        assert!(c.to_monotonic(5) >= 5);
    }

    #[test]
    fn a_frozen_clock_stands_still_and_thaws_where_it_stopped() {
        let start = monotonic_ns();
        let c = VmClock::starting_at(start);
        c.freeze_at(start + 1_000);
        assert_eq!(c.now(), 1_000);
        assert_eq!(c.now(), 1_000, "no time passes while frozen");
        assert_eq!(
            c.to_monotonic(900),
            start + 900,
            "a reached deadline fires at once"
        );
        assert_eq!(c.to_monotonic(1_001), FAR_FUTURE_NS, "a later one never");
        // Thawed after a pause as long as everything since the freeze: VM time goes on from
        // 1000 (the clock's later reads are at least that, and CLOCK_MONOTONIC moved on).
        let paused = monotonic_ns() - (start + 1_000);
        c.thaw(paused);
        let after = c.now();
        assert!(after >= 1_000, "{after}");
        assert_eq!(c.to_monotonic(2_000), start + paused + 2_000);
    }

    struct Counted(AtomicU32, AtomicU64);

    impl Rearm for Counted {
        fn rearm(&self, clock: &VmClock) {
            self.0.fetch_add(1, Ordering::Relaxed);
            self.1.store(clock.to_monotonic(10), Ordering::Relaxed);
        }
    }

    #[test]
    fn a_thaw_rearms_the_live_timers_on_the_new_epoch() {
        let c = VmClock::starting_at(100);
        let kept = Arc::new(Counted(AtomicU32::new(0), AtomicU64::new(0)));
        let dropped = Arc::new(Counted(AtomicU32::new(0), AtomicU64::new(0)));
        let weak = |t: &Arc<Counted>| Arc::downgrade(&(t.clone() as Arc<dyn Rearm>));
        c.on_thaw(weak(&kept));
        c.on_thaw(weak(&dropped));
        drop(dropped);
        c.thaw(50);
        assert_eq!(
            kept.0.load(Ordering::Relaxed),
            0,
            "a clock that ran is not thawed"
        );
        let clone = c.clone();
        clone.freeze_at(200);
        c.thaw(50);
        assert_eq!(kept.0.load(Ordering::Relaxed), 1);
        assert_eq!(kept.1.load(Ordering::Relaxed), 100 + 50 + 10);
        assert_eq!(
            lock(&c.state.timers).len(),
            1,
            "the dropped timer is forgotten"
        );
    }
}
