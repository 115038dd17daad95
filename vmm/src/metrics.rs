//! Counters lull keeps while a VM runs; the JSON it writes at exit (`--metrics`) is
//! `lull_schema`'s [`RunReport`], re-exported here.

use std::sync::atomic::{AtomicU64, Ordering};

pub use lull_schema::{
    GlobalTimersReport, IdleInjectReport, PlacementSnapshot, RunReport, VcpuSnapshot,
    WakeupSnapshot,
};

use crate::ratelimit::LogLimiter;

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
    /// Wall time from each KVM_RUN's return to the next KVM_RUN, less `blocked_ns`: what lull
    /// itself spends on the vCPU's exits (halt polling and advance waits included).
    pub exit_handling_ns: AtomicU64,
    /// Time the thread spent asleep waiting for a wake-up (halted, held; user irqchip): the
    /// wait system call itself, not the timer model's passes around it.
    pub blocked_ns: AtomicU64,
    /// Host-side lateness of LAPIC timer expiries: bucket i counts lateness in
    /// [2^i, 2^(i+1)) microseconds (bucket 0 also takes under 1 us).
    pub lateness_us_log2: [AtomicU64; LATENESS_BUCKETS],
}

/// Buckets of the lateness histogram (the last one takes everything above ~0.5 s).
pub const LATENESS_BUCKETS: usize = 20;

impl VcpuCounters {
    /// Records a LAPIC timer expiry handled `late_ns` after its deadline.
    pub fn record_lateness(&self, late_ns: u64) {
        let us = late_ns / 1000;
        let bucket = if us == 0 {
            0
        } else {
            63 - us.leading_zeros() as usize
        };
        let bucket = bucket.min(LATENESS_BUCKETS - 1);
        self.lateness_us_log2[bucket].fetch_add(1, Ordering::Relaxed);
        self.lapic_timer_fires.fetch_add(1, Ordering::Relaxed);
    }
}

impl VcpuCounters {
    /// A snapshot for vCPU `vcpu`.
    pub fn snapshot(&self, vcpu: u32) -> VcpuSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        VcpuSnapshot {
            vcpu,
            io_in: g(&self.io_in),
            io_out: g(&self.io_out),
            mmio_read: g(&self.mmio_read),
            mmio_write: g(&self.mmio_write),
            hlt: g(&self.hlt),
            interrupted: g(&self.interrupted),
            other: g(&self.other),
            msr: g(&self.msr),
            irq_window: g(&self.irq_window),
            injected: g(&self.injected),
            pv_eois: g(&self.pv_eois),
            pv_deadlines: g(&self.pv_deadlines),
            blocks: g(&self.blocks),
            wakeups: WakeupSnapshot {
                timer: g(&self.wake_timer),
                interrupt: g(&self.wake_interrupt),
                control: g(&self.wake_control),
                other: g(&self.wake_other),
                global_timer: g(&self.wake_global_timer),
            },
            lapic_timer_fires: g(&self.lapic_timer_fires),
            timer_advance_ns: g(&self.timer_advance_ns),
            advance_wait_ns: g(&self.advance_wait_ns),
            exit_handling_ns: g(&self.exit_handling_ns),
            blocked_ns: g(&self.blocked_ns),
            global_timer_fires: g(&self.global_timer_fires),
            wake_migrations: g(&self.wake_migrations),
            placement: PlacementSnapshot {
                binds: g(&self.placement_binds),
                bound_migrations: g(&self.placement_bound_migrations),
                backoffs: g(&self.placement_backoffs),
                bound_wakes: g(&self.placement_bound_wakes),
                bound_late_ns: g(&self.placement_bound_late_ns),
                free_wakes: g(&self.placement_free_wakes),
                free_late_ns: g(&self.placement_free_late_ns),
            },
            polls: g(&self.polls),
            polls_won: g(&self.polls_won),
            polls_lost: g(&self.polls).saturating_sub(g(&self.polls_won)),
            poll_ns: g(&self.poll_ns),
            injected_idle_ns: g(&self.injected_idle_ns),
            throttled_ns: g(&self.throttled_ns),
            lateness_us_log2: self.lateness_us_log2.iter().map(g).collect(),
        }
    }
}

/// VM-wide counters of guest behaviour that lull ignores.
#[derive(Debug, Default)]
pub struct GuestNoise {
    /// Accesses to ports no device owns.
    pub unknown_port: LogLimiter,
    /// Accesses to MMIO addresses no device owns.
    pub unknown_mmio: LogLimiter,
}

/// Guest misbehaviour at its LAPICs, counted and logged rate-limited.
#[derive(Debug, Default)]
pub struct LapicNoise {
    /// Ignored or faulting accesses.
    pub invalid_access: LogLimiter,
    /// Vectors below 16.
    pub illegal_vector: LogLimiter,
    /// Timer deadlines pushed out to the minimum period.
    pub timer_clamped: LogLimiter,
    /// Delivery modes lull does not deliver.
    pub unsupported_delivery_mode: LogLimiter,
}

impl devices::lapic::LapicEvents for LapicNoise {
    fn invalid_access(&self, access: devices::lapic::InvalidAccess) {
        if let Some(n) = self.invalid_access.hit() {
            tracing::warn!("guest LAPIC access ignored or faulted: {access:?} ({n} so far)");
        }
    }
    fn illegal_vector(&self, vector: u8) {
        if let Some(n) = self.illegal_vector.hit() {
            tracing::warn!("guest used illegal interrupt vector {vector} ({n} so far)");
        }
    }
    fn timer_clamped(&self, requested_ns: u64, clamped_ns: u64) {
        if let Some(n) = self.timer_clamped.hit() {
            tracing::warn!(
                "guest LAPIC timer of {requested_ns} ns clamped to {clamped_ns} ns ({n} so far)"
            );
        }
    }
    fn unsupported_delivery_mode(&self, mode: u8) {
        if let Some(n) = self.unsupported_delivery_mode.hit() {
            tracing::warn!("guest IPI delivery mode {mode} not delivered ({n} so far)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_lands_in_log2_buckets() {
        let c = VcpuCounters::default();
        for ns in [0, 999, 1_000, 3_000, 1_000_000, u64::MAX] {
            c.record_lateness(ns);
        }
        let s = c.snapshot(0);
        assert_eq!(s.lateness_us_log2[0], 3); // 0, 999 ns, 1 us
        assert_eq!(s.lateness_us_log2[1], 1); // 3 us
        assert_eq!(s.lateness_us_log2[9], 1); // 1 ms = 1000 us, in [512, 1024)
        assert_eq!(s.lateness_us_log2[19], 1); // everything from ~0.5 s on
        assert_eq!(s.lapic_timer_fires, 6);
    }
}
