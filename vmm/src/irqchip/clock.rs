//! The VM's clock: CLOCK_MONOTONIC in nanoseconds since the VM was built, shared by the timer
//! models, the LAPIC model and the host timers (which arm absolute CLOCK_MONOTONIC deadlines).

use timer::{Clock, Nanos};

/// Raw CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for clock_gettime to fill; CLOCK_MONOTONIC exists on
    // every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs * 1_000_000_000 + nanos
}

/// Nanoseconds since the VM's epoch, read from CLOCK_MONOTONIC.
#[derive(Debug, Clone, Copy)]
pub struct VmClock {
    epoch_ns: u64,
}

impl VmClock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self {
            epoch_ns: monotonic_ns(),
        }
    }

    /// The CLOCK_MONOTONIC value of a VM-clock time, for absolute host timers.
    pub fn to_monotonic(&self, t: Nanos) -> u64 {
        self.epoch_ns.saturating_add(t)
    }
}

impl Default for VmClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for VmClock {
    fn now(&self) -> Nanos {
        monotonic_ns().saturating_sub(self.epoch_ns)
    }
}

/// A `timespec` for an absolute CLOCK_MONOTONIC time in nanoseconds.
pub fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: libc::time_t::try_from(ns / 1_000_000_000).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::try_from(ns % 1_000_000_000).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_starts_near_zero_and_advances() {
        let c = VmClock::new();
        let a = c.now();
        let b = c.now();
        assert!(a < 1_000_000_000);
        assert!(b >= a);
        assert!(c.to_monotonic(5) >= 5);
        let ts = timespec(3_000_000_123);
        assert_eq!((ts.tv_sec, ts.tv_nsec), (3, 123));
    }
}
