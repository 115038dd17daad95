//! One vCPU in the report (`vcpus`): its exits, its wake-ups by cause, wake placement's work;
//! and the live counters each is read from, declared with it (`counter_set!`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::counter_set::counter_set;

/// Buckets of the lateness histograms (the last one takes everything above ~0.5 s).
pub const LATENESS_BUCKETS: usize = 20;

counter_set! {
    /// One vCPU's counters, written by its thread (the exits, the chip, the idle manager), read
    /// by anyone; [`VcpuCounters::read`] gives the report's [`VcpuReadout`].
    #[derive(Debug, Default)]
    pub struct VcpuCounters;

    /// One vCPU's exits, wake-ups and idle work (the report's `vcpus`; its [`VcpuCounters`]
    /// read at one moment).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(default)]
    pub struct VcpuReadout {
        /// vCPU index (fixed when its counters are made).
        vcpu: u32 => u32,
        /// Port reads.
        io_in: AtomicU64 => u64,
        /// Port writes.
        io_out: AtomicU64 => u64,
        /// MMIO reads.
        mmio_read: AtomicU64 => u64,
        /// MMIO writes.
        mmio_write: AtomicU64 => u64,
        /// HLT exits (only without an in-kernel irqchip).
        hlt: AtomicU64 => u64,
        /// KVM_RUN returns with EINTR (signals, kicks).
        interrupted: AtomicU64 => u64,
        /// Any other exit.
        other: AtomicU64 => u64,
        /// MSR exits (user irqchip).
        msr: AtomicU64 => u64,
        /// Interrupt-window exits (user irqchip).
        irq_window: AtomicU64 => u64,
        /// Interrupts lull handed KVM to inject (user irqchip).
        injected: AtomicU64 => u64,
        /// EOIs the guest signalled through the PV EOI flag, without an exit (user irqchip).
        pv_eois: AtomicU64 => u64,
        /// TSC deadlines the guest stored in its PV deadline slot, taken at exits without a
        /// WRMSR exit (user irqchip).
        pv_deadlines: AtomicU64 => u64,
        /// Times the vCPU blocked in HLT (user irqchip).
        blocks: AtomicU64 => u64,
        /// Wake-ups from a block, by cause.
        wakeups: WakeupCounters => WakeupReadout,
        /// LAPIC timer expiries handled.
        lapic_timer_fires: AtomicU64 => u64,
        /// The learned timer advance, ns, as last updated.
        timer_advance_ns: AtomicU64 => u64,
        /// Time spent waiting for LAPIC deadlines after an early (advanced) host timer, ns.
        advance_wait_ns: AtomicU64 => u64,
        /// Short LAPIC deadlines armed with interrupts off whose host tick lull deferred to the
        /// guest's next exit (`vmm/src/irqchip/user/lapic_timer_host/tick_defer.rs`; user
        /// irqchip).
        ticks_deferred: AtomicU64 => u64,
        /// Deferred host ticks that fired because the guest ran on without an exit.
        ticks_deferred_missed: AtomicU64 => u64,
        /// Deferred host ticks that fired while the guest still had interrupts off, or had
        /// halted only after them: late, but the guest could not have taken the interrupt
        /// sooner (no back-off).
        ticks_deferred_late: AtomicU64 => u64,
        /// Wall time from each KVM_RUN's return to the next, less `blocked_ns`: what lull
        /// itself spends on the vCPU's exits (halt polling and advance waits included), ns.
        exit_handling_ns: AtomicU64 => u64,
        /// Time the thread spent asleep waiting for a wake-up (halted, held; user irqchip): the
        /// wait system call itself, not the timer model's passes around it, ns.
        blocked_ns: AtomicU64 => u64,
        /// Global timers this vCPU's thread expired (its own and, as a migrator, others').
        global_timer_fires: AtomicU64 => u64,
        /// Wake-ups from a block on another host CPU than the block began on (user irqchip).
        wake_migrations: AtomicU64 => u64,
        /// Wake placement: blocks bound to their host CPU, bound wake-ups that moved anyway,
        /// and back-offs after a late bound wake-up.
        placement: PlacementCounters => PlacementReadout,
        /// Halt polls started.
        polls: AtomicU64 => u64,
        /// Halt polls that saw the wake-up.
        polls_won: AtomicU64 => u64,
        /// Halt polls that did not (the started ones less the won ones; not counted apart).
        polls_lost: u64 = polls.saturating_sub(polls_won),
        /// Time spent polling, ns.
        poll_ns: AtomicU64 => u64,
        /// Time held idle by idle injection, ns.
        injected_idle_ns: AtomicU64 => u64,
        /// Time held by the CPU quota, ns.
        throttled_ns: AtomicU64 => u64,
        /// Host-side lateness of LAPIC timer expiries: bucket i counts lateness in
        /// [2^i, 2^(i+1)) us (bucket 0 also takes under 1 us).
        lateness_us_log2: [AtomicU64; LATENESS_BUCKETS] => Vec<u64>,
        /// The part of each lateness past the end of its wake-up's range (`--timer-slack`;
        /// with slack off, all of it): the host's delay, in the buckets of `lateness_us_log2`
        /// (absent in reports of a lull before `--timer-slack`).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        late_past_range_us_log2: [AtomicU64; LATENESS_BUCKETS] => Vec<u64>,
        /// Wake-ups from a block that served more than one timer expiry (own or global;
        /// absent in reports of a lull before `--timer-slack`).
        #[serde(skip_serializing_if = "Option::is_none")]
        wake_multi_expiry: AtomicU64 => Option<u64>,
        /// Expiries served by a wake-up from a block beyond its first (k expiries count
        /// k - 1): the host wake-ups the VM's coalescing saved (absent in reports of a lull
        /// before it).
        #[serde(skip_serializing_if = "Option::is_none")]
        wake_coalesced: AtomicU64 => Option<u64>,
    }
}

impl VcpuCounters {
    /// The counters of vCPU `vcpu`, all zero.
    pub fn of(vcpu: u32) -> Self {
        Self {
            vcpu,
            ..Self::default()
        }
    }

    /// Records a LAPIC timer expiry handled `late_ns` after its deadline.
    pub fn record_lateness(&self, late_ns: u64) {
        self.lateness_us_log2[lateness_bucket(late_ns)].fetch_add(1, Ordering::Relaxed);
        self.lapic_timer_fires.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the part of an expiry's lateness past the end of its wake-up's range.
    pub fn record_late_past_range(&self, late_ns: u64) {
        self.late_past_range_us_log2[lateness_bucket(late_ns)].fetch_add(1, Ordering::Relaxed);
    }
}

/// The histogram bucket of a lateness: [2^i, 2^(i+1)) us, bucket 0 also under 1 us.
fn lateness_bucket(late_ns: u64) -> usize {
    let us = late_ns / 1000;
    let bucket = if us == 0 {
        0
    } else {
        63 - us.leading_zeros() as usize
    };
    bucket.min(LATENESS_BUCKETS - 1)
}

counter_set! {
    /// Wake placement's live counters of one vCPU.
    #[derive(Debug, Default)]
    pub struct PlacementCounters;

    /// Wake placement's counters of one vCPU.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(default)]
    pub struct PlacementReadout {
        /// Blocks for which wake placement bound the thread to its host CPU.
        binds: AtomicU64 => u64,
        /// Bound wake-ups that came on another host CPU anyway (the host ignored the binding).
        bound_migrations: AtomicU64 => u64,
        /// Back-offs after a late bound wake-up.
        backoffs: AtomicU64 => u64,
        /// Own-timer wake-ups while bound.
        bound_wakes: AtomicU64 => u64,
        /// Their summed lateness behind the expected wake-up, ns.
        bound_late_ns: AtomicU64 => u64,
        /// Own-timer wake-ups while not bound (either mode).
        free_wakes: AtomicU64 => u64,
        /// Their summed lateness, ns.
        free_late_ns: AtomicU64 => u64,
    }
}

counter_set! {
    /// Live wake-up counters of one vCPU, by cause.
    #[derive(Debug, Default)]
    pub struct WakeupCounters;

    /// Wake-ups of a blocked vCPU by cause.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(default)]
    pub struct WakeupReadout {
        /// Its own timer was due.
        timer: AtomicU64 => u64,
        /// An interrupt (IPI or device).
        interrupt: AtomicU64 => u64,
        /// VM control (stop).
        control: AtomicU64 => u64,
        /// Nothing to do (host tick of a migrator, spurious).
        other: AtomicU64 => u64,
        /// A global timer of its own base (never in `pull` while another vCPU runs).
        global_timer: AtomicU64 => u64,
    }
}

impl WakeupReadout {
    /// Each cause with its count, named as its JSON key.
    pub fn by_cause(&self) -> [(&'static str, u64); 5] {
        [
            ("timer", self.timer),
            ("interrupt", self.interrupt),
            ("control", self.control),
            ("other", self.other),
            ("global_timer", self.global_timer),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_lands_in_log2_buckets() {
        let c = VcpuCounters::of(3);
        for ns in [0, 999, 1_000, 3_000, 1_000_000, u64::MAX] {
            c.record_lateness(ns);
        }
        let s = c.read();
        assert_eq!(s.vcpu, 3);
        assert_eq!(s.lateness_us_log2[0], 3); // 0, 999 ns, 1 us
        assert_eq!(s.lateness_us_log2[1], 1); // 3 us
        assert_eq!(s.lateness_us_log2[9], 1); // 1 ms = 1000 us, in [512, 1024)
        assert_eq!(s.lateness_us_log2[19], 1); // everything from ~0.5 s on
        assert_eq!(s.lapic_timer_fires, 6);
        c.record_late_past_range(3_000);
        let s = c.read();
        assert_eq!(s.late_past_range_us_log2[1], 1);
        assert_eq!(s.late_past_range_us_log2.iter().sum::<u64>(), 1);
    }

    #[test]
    fn polls_lost_are_the_polls_not_won() {
        let c = VcpuCounters::default();
        c.polls.store(5, Ordering::Relaxed);
        c.polls_won.store(2, Ordering::Relaxed);
        c.wakeups.global_timer.store(7, Ordering::Relaxed);
        c.placement.free_late_ns.store(9, Ordering::Relaxed);
        let s = c.read();
        assert_eq!((s.polls, s.polls_won, s.polls_lost), (5, 2, 3));
        assert_eq!(s.wakeups.global_timer, 7);
        assert_eq!(s.placement.free_late_ns, 9);
    }

    #[test]
    fn causes_are_named_as_their_keys() {
        let w = WakeupReadout {
            timer: 1,
            interrupt: 2,
            control: 3,
            other: 4,
            global_timer: 5,
        };
        let json = serde_json::to_value(&w).expect("serializes");
        let keys: Vec<&str> = json
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut named: Vec<&str> = w.by_cause().iter().map(|(k, _)| *k).collect();
        named.sort_unstable();
        assert_eq!(keys, named);
        for (cause, n) in w.by_cause() {
            assert_eq!(json[cause], n, "{cause}");
        }
    }
}
