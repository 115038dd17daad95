//! The per-vCPU counters every layer of a vCPU thread counts in (exits, the chip, the idle
//! manager); `metrics` snapshots them into the report. A leaf: it depends on nothing of lull's.

use std::sync::atomic::{AtomicU64, Ordering};

/// Per-vCPU exit counters, written by the vCPU thread, read by anyone.
#[derive(Debug, Default)]
pub struct VcpuCounters {
    /// Port reads.
    pub io_in: AtomicU64,
    /// Port writes.
    pub io_out: AtomicU64,
    /// MMIO reads.
    pub mmio_read: AtomicU64,
    /// MMIO writes.
    pub mmio_write: AtomicU64,
    /// HLT exits (only without an in-kernel irqchip).
    pub hlt: AtomicU64,
    /// KVM_RUN returns with EINTR (signals).
    pub interrupted: AtomicU64,
    /// Any other exit.
    pub other: AtomicU64,
    /// MSR exits (user irqchip).
    pub msr: AtomicU64,
    /// Interrupt-window exits (user irqchip).
    pub irq_window: AtomicU64,
    /// Interrupts lull handed KVM to inject (user irqchip).
    pub injected: AtomicU64,
    /// EOIs the guest signalled through the PV EOI flag, without an exit (user irqchip).
    pub pv_eois: AtomicU64,
    /// TSC deadlines the guest stored in its PV deadline slot, taken at exits (user irqchip).
    pub pv_deadlines: AtomicU64,
    /// Times the vCPU blocked in HLT (user irqchip).
    pub blocks: AtomicU64,
    /// Wake-ups from a block because its own timer was due.
    pub wake_timer: AtomicU64,
    /// Wake-ups from a block by an interrupt (IPI or device).
    pub wake_interrupt: AtomicU64,
    /// Wake-ups from a block by VM control (stop).
    pub wake_control: AtomicU64,
    /// Wake-ups with nothing to do (host tick of a migrator, spurious).
    pub wake_other: AtomicU64,
    /// Wake-ups from a block caused by a global timer on its own base.
    pub wake_global_timer: AtomicU64,
    /// Global timers (of any vCPU) this vCPU's thread expired.
    pub global_timer_fires: AtomicU64,
    /// Wake-ups from a block on another host CPU than the block began on.
    pub wake_migrations: AtomicU64,
    /// Blocks for which wake placement bound the thread to its host CPU.
    pub placement_binds: AtomicU64,
    /// Bound wake-ups that still came on another host CPU (the host ignored the binding).
    pub placement_bound_migrations: AtomicU64,
    /// Times a late bound wake-up made wake placement back off.
    pub placement_backoffs: AtomicU64,
    /// Own-timer wake-ups of a bound thread, and their summed lateness behind the expected
    /// wake-up (ns).
    pub placement_bound_wakes: AtomicU64,
    /// See `placement_bound_wakes`.
    pub placement_bound_late_ns: AtomicU64,
    /// Own-timer wake-ups of an unbound thread (either mode), and their summed lateness (ns).
    pub placement_free_wakes: AtomicU64,
    /// See `placement_free_wakes`.
    pub placement_free_late_ns: AtomicU64,
    /// Halt polls started.
    pub polls: AtomicU64,
    /// Halt polls that saw the wake-up.
    pub polls_won: AtomicU64,
    /// Time spent polling.
    pub poll_ns: AtomicU64,
    /// Time held idle by idle injection.
    pub injected_idle_ns: AtomicU64,
    /// Time held by the CPU quota.
    pub throttled_ns: AtomicU64,
    /// LAPIC timer expiries handled.
    pub lapic_timer_fires: AtomicU64,
    /// The learned timer advance (ns), as last updated.
    pub timer_advance_ns: AtomicU64,
    /// Time spent waiting for LAPIC deadlines after an early (advanced) host timer.
    pub advance_wait_ns: AtomicU64,
    /// Short LAPIC deadlines armed with interrupts off whose host tick was deferred.
    pub ticks_deferred: AtomicU64,
    /// Deferred host ticks that fired: the guest ran on without an exit.
    pub ticks_deferred_missed: AtomicU64,
    /// Deferred host ticks that fired while the guest still had interrupts off or had
    /// halted after them (late, no back-off).
    pub ticks_deferred_late: AtomicU64,
    /// Wall time from each KVM_RUN's return to the next KVM_RUN, less `blocked_ns`: what lull
    /// itself spends on the vCPU's exits (halt polling and advance waits included).
    pub exit_handling_ns: AtomicU64,
    /// Time the thread spent asleep waiting for a wake-up (halted, held; user irqchip): the
    /// wait system call itself, not the timer model's passes around it.
    pub blocked_ns: AtomicU64,
    /// Host-side lateness of LAPIC timer expiries: bucket i counts lateness in
    /// [2^i, 2^(i+1)) microseconds (bucket 0 also takes under 1 us).
    pub lateness_us_log2: [AtomicU64; LATENESS_BUCKETS],
    /// The part of each LAPIC timer expiry's lateness past the end of its wake-up's range
    /// (`--timer-slack`; with slack off, all of it): the host's delay, in the buckets of
    /// `lateness_us_log2`.
    pub late_past_range_us_log2: [AtomicU64; LATENESS_BUCKETS],
    /// Wake-ups from a block that served more than one timer expiry (own or global).
    pub wake_multi_expiry: AtomicU64,
    /// Expiries served by a wake-up from a block beyond its first (k expiries count k - 1).
    pub wake_coalesced: AtomicU64,
}

/// Buckets of the lateness histogram (the last one takes everything above ~0.5 s).
pub const LATENESS_BUCKETS: usize = 20;

impl VcpuCounters {
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
