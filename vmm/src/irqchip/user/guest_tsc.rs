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
//!
//! The map runs at KVM's nominal `tsc_khz`, but the VM clock is CLOCK_MONOTONIC, which NTP
//! disciplines, and the TSC's real rate against it is off by a few ppm (measured on our
//! hosts: 2,300,000.7-2,300,003.2 kHz against KVM's 2,300,000, i.e. +0.3 to +1.4 ppm). A map
//! made once at start-up is therefore off by that rate times the VM's age: here late by
//! 0.3-1.4 us per second of the VM's life (~100 us after a Linux guest's boot and workload),
//! and on a host whose TSC runs slow against its clock, *early* by as much, which a guest
//! finds in its handler and re-arms for. KVM converts each deadline relative to the guest
//! TSC at the write, so its error stays a few ppm of the timer's length. Where the guest TSC
//! is cheap to read (RDTSC plus KVM's offset) each vCPU re-anchors its map with a
//! [`TscAnchor`] every [`REANCHOR_NS`], which bounds the drift the same way.
//! Not where a pause may move the guest TSC (`vcpu::park`, a KVM that can): the anchor's
//! offset would then be stale after a resume; there the start-up map stays (left to do: an
//! anchor that follows the moved offset).

use std::sync::Arc;

use devices::lapic::TscMap;
use timer::{Clock, Nanos};

/// How often a vCPU re-anchors its TSC map: the drift between two anchors is then a few
/// nanoseconds at a few ppm.
pub const REANCHOR_NS: Nanos = 1_000_000_000;

/// Reads the guest TSC from any vCPU thread, cheaply (RDTSC plus KVM's TSC offset).
pub type GuestTscRead = Arc<dyn Fn() -> u64 + Send + Sync>;

/// One vCPU's re-anchoring of its TSC map (see the module's comment).
#[derive(Clone)]
pub struct TscAnchor {
    read: GuestTscRead,
    tsc_khz: u64,
    anchored_at: Nanos,
}

impl TscAnchor {
    /// Re-anchors with `read` at `tsc_khz`; the first anchor is the chip's, made at `at`.
    pub fn new(read: GuestTscRead, tsc_khz: u64, at: Nanos) -> Self {
        Self {
            read,
            tsc_khz,
            anchored_at: at,
        }
    }

    /// A fresh map if the last one is [`REANCHOR_NS`] old at `now`, read between reads of
    /// `clock` as at start-up.
    pub fn refresh(&mut self, clock: &dyn Clock, now: Nanos) -> Option<TscMap> {
        if now.saturating_sub(self.anchored_at) < REANCHOR_NS {
            return None;
        }
        let read = &self.read;
        let sample = sample_guest_tsc::<()>(clock, || Ok(read())).ok()?;
        self.anchored_at = sample.after;
        Some(tsc_map(sample.tsc, sample.after, self.tsc_khz))
    }
}

impl std::fmt::Debug for TscAnchor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TscAnchor")
            .field("tsc_khz", &self.tsc_khz)
            .field("anchored_at", &self.anchored_at)
            .finish_non_exhaustive()
    }
}

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
    fn the_anchor_follows_a_tsc_that_runs_fast_of_its_nominal_rate() {
        // Nominal 1 GHz, but the TSC runs 10 ppm fast: 10 us ahead after 1 s.
        let clock = Arc::new(timer::FakeClock::new(0));
        let tsc_of = |ns: u64| ns + ns / 100_000;
        let c = clock.clone();
        let mut anchor = TscAnchor::new(Arc::new(move || tsc_of(c.now())), 1_000_000, 0);
        let start = tsc_map(0, 0, 1_000_000);
        assert_eq!(
            anchor.refresh(clock.as_ref(), REANCHOR_NS - 1),
            None,
            "too soon"
        );
        clock.set(REANCHOR_NS);
        let map = anchor.refresh(clock.as_ref(), REANCHOR_NS).unwrap();
        // A deadline 1 ms ahead: the start-up map puts it 10 us late, the new one on time.
        let deadline = tsc_of(REANCHOR_NS + 1_000_000);
        assert_eq!(start.ns_at(deadline), REANCHOR_NS + 1_000_000 + 10_010);
        assert_eq!(map.ns_at(deadline), REANCHOR_NS + 1_000_000 + 10);
        assert_eq!(
            anchor.refresh(clock.as_ref(), REANCHOR_NS + 1),
            None,
            "just anchored"
        );
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
