//! The VM's clock: CLOCK_MONOTONIC in nanoseconds since the VM was built, shared by the timer
//! models, the LAPIC model and the host timers (which arm absolute CLOCK_MONOTONIC deadlines).

use timer::{Clock, Nanos};

use crate::host::sys::clock::monotonic_ns;
use crate::idle::halt::VmTime;

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

impl VmTime for VmClock {
    fn to_monotonic(&self, t: Nanos) -> u64 {
        VmClock::to_monotonic(self, t)
    }
}

impl Clock for VmClock {
    fn now(&self) -> Nanos {
        monotonic_ns().saturating_sub(self.epoch_ns)
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
    }
}
