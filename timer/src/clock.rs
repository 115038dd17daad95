//! Monotonic time in nanoseconds: a real clock for production and a fake one for tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Nanoseconds on a monotonic time line. `NEVER` means "no deadline".
pub type Nanos = u64;

/// The deadline that never comes; used for "nothing pending".
pub const NEVER: Nanos = u64::MAX;

/// A source of monotonic time in nanoseconds.
pub trait Clock: Send + Sync {
    /// The current time in nanoseconds since the clock's epoch.
    fn now(&self) -> Nanos;
}

/// A VM's clock: one whose times can be turned into CLOCK_MONOTONIC ones (for absolute host
/// deadlines and reports), and which stands still while the VM is paused.
pub trait VmTime: Clock + Clone + 'static {
    /// The CLOCK_MONOTONIC value of VM-clock time `t`.
    fn to_monotonic(&self, t: Nanos) -> u64;
    /// The VM is paused at CLOCK_MONOTONIC time `monotonic`: stop (a fake clock stands still
    /// unless its test moves it).
    fn freeze_at(&self, _monotonic: u64) {}
    /// The VM resumes after `paused_ns`: go on from where the clock stopped.
    fn thaw(&self, _paused_ns: u64) {}
}

/// The host's monotonic clock, counted from the moment the clock was created.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    epoch: Instant,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        // u64 nanoseconds cover 584 years of uptime; saturate rather than wrap.
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(NEVER - 1)
    }
}

/// A clock that only moves when told to; clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    now: Arc<AtomicU64>,
}

impl FakeClock {
    /// A fake clock reading `start`.
    pub fn new(start: Nanos) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves the clock to `t`; time never goes backwards, so earlier values are ignored.
    pub fn set(&self, t: Nanos) {
        self.now.fetch_max(t, Ordering::SeqCst);
    }

    /// Moves the clock forward by `d` nanoseconds.
    pub fn advance(&self, d: Nanos) {
        self.now.fetch_add(d, Ordering::SeqCst);
    }
}

/// Tests: the fake clock's zero is CLOCK_MONOTONIC's.
impl VmTime for FakeClock {
    fn to_monotonic(&self, t: Nanos) -> u64 {
        t
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_is_shared_and_monotonic() {
        let c = FakeClock::new(10);
        let d = c.clone();
        c.advance(5);
        assert_eq!(d.now(), 15);
        d.set(3);
        assert_eq!(c.now(), 15);
        d.set(100);
        assert_eq!(c.now(), 100);
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let c = MonotonicClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
    }
}
