//! The map from the guest TSC to the VM clock, which every TSC-deadline write is converted
//! with (and every TSC value lull reports, e.g. the PV deadline's).
//!
//! lull reads the guest TSC between two reads of the VM clock. The map says the TSC had the
//! value read at the *after* time: the TSC was read no later than that, so a converted
//! deadline is never early, and it is late by at most the window between the two clock reads
//! (the map's bias). That bias is added to every TSC deadline of the VM's life, and decides
//! whether a deadline the guest wrote just in the past is seen as past (an interrupt at once,
//! as the SDM asks) or as a deadline a few microseconds ahead.
//!
//! So the window must be short. `KVM_GET_MSRS(IA32_TSC)` takes 5-7 us on our hosts; where KVM
//! tells the vCPU's TSC offset (KVM_VCPU_TSC_OFFSET) and the guest TSC is the host TSC plus
//! that offset (checked with one `KVM_GET_MSRS` between two host TSC reads, see
//! [`is_host_tsc_plus`]: not so where KVM scales the guest TSC), the guest TSC is read in user
//! space as RDTSC plus the offset, in tens of nanoseconds. Either way a host that preempts lull
//! inside one window (a loaded CI host) would make it milliseconds: lull reads
//! [`TSC_SAMPLES`] times and keeps the read with the shortest window.

use devices::lapic::TscMap;
use timer::{Clock, Nanos};

/// How many times the guest TSC is read for the map; the shortest window wins.
pub const TSC_SAMPLES: usize = 8;

/// One read of the guest TSC, between two VM-clock reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscSample {
    /// The guest TSC read.
    pub tsc: u64,
    /// The VM clock just before the read.
    pub before: Nanos,
    /// The VM clock just after the read.
    pub after: Nanos,
}

impl TscSample {
    /// The most the map built from this sample delays a converted deadline.
    pub fn window(&self) -> Nanos {
        self.after.saturating_sub(self.before)
    }
}

/// Reads the guest TSC [`TSC_SAMPLES`] times with `read`, each between two reads of
/// `clock`, and returns the read with the shortest window (the first of equals).
pub fn sample_guest_tsc<E>(
    clock: &dyn Clock,
    mut read: impl FnMut() -> Result<u64, E>,
) -> Result<TscSample, E> {
    let mut sample = || -> Result<TscSample, E> {
        let before = clock.now();
        let tsc = read()?;
        let after = clock.now();
        Ok(TscSample { tsc, before, after })
    };
    let mut best = sample()?;
    for _ in 1..TSC_SAMPLES {
        let next = sample()?;
        if next.window() < best.window() {
            best = next;
        }
    }
    Ok(best)
}

/// Whether the guest TSC `guest`, read between host TSC reads `host_before` and
/// `host_after`, is the host TSC plus `offset` (wrapping): then RDTSC plus `offset` is the
/// guest TSC.
pub fn is_host_tsc_plus(offset: u64, host_before: u64, guest: u64, host_after: u64) -> bool {
    let since_before = guest.wrapping_sub(host_before.wrapping_add(offset));
    since_before <= host_after.wrapping_sub(host_before)
}

/// The map from a TSC `tsc` read before VM-clock time `after`, at `tsc_khz`: the guest TSC
/// at VM-clock time 0, biased so that converted deadlines are never early.
pub fn tsc_map(tsc: u64, after: Nanos, tsc_khz: u64) -> TscMap {
    let elapsed_ticks = u128::from(after) * u128::from(tsc_khz) / 1_000_000;
    let at0 = u128::from(tsc).saturating_sub(elapsed_ticks);
    TscMap {
        tsc_khz,
        tsc_at_ns0: u64::try_from(at0).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn the_tsc_map_is_never_early() {
        // 1 GHz: 1 tick per ns. TSC 5000 read before VM-clock time 3000: tick 2000 at 0.
        let m = tsc_map(5_000, 3_000, 1_000_000);
        assert_eq!((m.tsc_khz, m.tsc_at_ns0), (1_000_000, 2_000));
        // A TSC below the elapsed ticks clamps at zero instead of wrapping.
        assert_eq!(tsc_map(10, 3_000, 1_000_000).tsc_at_ns0, 0);
    }

    #[test]
    fn a_guest_tsc_is_the_host_tsc_plus_its_offset_only_between_the_host_reads() {
        let offset = 5_000u64.wrapping_neg(); // the guest TSC started 5000 ticks ago
        let cases = [
            (5_100, true, "between the host reads"),
            (5_000, true, "at the first read"),
            (5_200, true, "at the second read"),
            (4_999, false, "before the first read"),
            (5_201, false, "after the second read"),
        ];
        for (guest, plus, when) in cases {
            assert_eq!(
                is_host_tsc_plus(offset, 10_000, guest, 10_200),
                plus,
                "{when}"
            );
        }
        // A scaled guest TSC (half the host's rate) is not the host TSC plus the offset.
        assert!(!is_host_tsc_plus(0, 10_000, 5_100, 10_200));
    }

    /// A clock that advances by the next of `steps` at each read (then by 10 ns).
    struct SteppingClock {
        now: AtomicU64,
        reads: AtomicU64,
        steps: Vec<Nanos>,
    }

    impl Clock for SteppingClock {
        fn now(&self) -> Nanos {
            let i = self.reads.fetch_add(1, Ordering::Relaxed);
            let step = usize::try_from(i)
                .ok()
                .and_then(|i| self.steps.get(i))
                .copied()
                .unwrap_or(10);
            self.now.fetch_add(step, Ordering::Relaxed) + step
        }
    }

    #[test]
    fn a_read_preempted_inside_its_window_is_not_the_one_kept() {
        // Windows: read 0 5 ms (preempted), read 1 300 ns, read 2 40 ns, the others 500 ns.
        let mut steps = vec![100, 5_000_000, 100, 300, 100, 40];
        steps.extend([100, 500].repeat(TSC_SAMPLES));
        let clock = SteppingClock {
            now: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            steps,
        };
        let mut tsc = 0;
        let sample = sample_guest_tsc::<()>(&clock, || {
            tsc += 1_000;
            Ok(tsc)
        })
        .unwrap();
        assert_eq!(sample.tsc, 3_000, "the third read had the shortest window");
        assert_eq!(sample.window(), 40);
        assert_eq!(sample.after, 100 + 5_000_000 + 100 + 300 + 100 + 40);
    }

    #[test]
    fn a_failed_read_is_an_error() {
        let clock = timer::FakeClock::new(0);
        let mut reads = 0;
        let got = sample_guest_tsc(&clock, || {
            reads += 1;
            if reads == 3 {
                Err("EIO")
            } else {
                Ok(1)
            }
        });
        assert_eq!(got, Err("EIO"));
    }
}
