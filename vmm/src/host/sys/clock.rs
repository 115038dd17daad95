//! CLOCK_MONOTONIC in nanoseconds, the `timespec` of an absolute time, and the host TSC.

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

/// The host's TSC (RDTSC; lull runs on x86-64 hosts only).
pub fn host_tsc() -> u64 {
    // SAFETY: RDTSC reads a counter and touches no memory; every x86-64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// A `timespec` for an absolute CLOCK_MONOTONIC time in nanoseconds.
pub fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: libc::time_t::try_from(ns / 1_000_000_000).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::try_from(ns % 1_000_000_000).unwrap_or(0),
    }
}

/// A one-shot `itimerspec` for `value` (zero disarms).
pub fn one_shot(value: libc::timespec) -> libc::itimerspec {
    libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timespec_splits_seconds() {
        let ts = timespec(3_000_000_123);
        assert_eq!((ts.tv_sec, ts.tv_nsec), (3, 123));
        let a = monotonic_ns();
        assert!(monotonic_ns() >= a);
    }
}
