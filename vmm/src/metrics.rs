//! Counters lull keeps while a VM runs; the JSON it writes at exit (`--metrics`) is
//! `lull_schema`'s [`RunReport`], re-exported here.

use std::sync::atomic::{AtomicU64, Ordering};

pub use lull_schema::{
    GlobalTimersReport, IdleInjectReport, PlacementSnapshot, RunReport, VcpuSnapshot,
    WakeupSnapshot,
};

use crate::ratelimit::LogLimiter;

pub use crate::state::counters::{VcpuCounters, LATENESS_BUCKETS};

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
            ticks_deferred: g(&self.ticks_deferred),
            ticks_deferred_missed: g(&self.ticks_deferred_missed),
            ticks_deferred_late: g(&self.ticks_deferred_late),
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
            late_past_range_us_log2: self.late_past_range_us_log2.iter().map(g).collect(),
            wake_multi_expiry: Some(g(&self.wake_multi_expiry)),
            wake_coalesced: Some(g(&self.wake_coalesced)),
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
        c.record_late_past_range(3_000);
        let s = c.snapshot(0);
        assert_eq!(s.late_past_range_us_log2[1], 1);
        assert_eq!(s.late_past_range_us_log2.iter().sum::<u64>(), 1);
    }
}
