//! Counters lull keeps while a VM runs; the JSON it writes at exit (`--metrics`) is
//! `lull_schema`'s [`RunReport`], re-exported here.

pub use lull_schema::{
    GlobalTimersReport, IdleInjectReport, PlacementReadout, RunReport, VcpuReadout, WakeupReadout,
};

use crate::ratelimit::LogLimiter;

pub use crate::state::counters::{VcpuCounters, LATENESS_BUCKETS};

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
