//! Guest misbehaviour reported by a [`Lapic`](super::Lapic) to whoever keeps the metrics.

use std::sync::Arc;

/// What went wrong in a guest access that the LAPIC ignored or answered with #GP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidAccess {
    /// An xAPIC MMIO access that is not a 4-byte access to a 16-byte aligned register.
    BadWidth {
        /// Offset from the APIC base.
        offset: u64,
        /// Access size in bytes.
        len: usize,
    },
    /// An xAPIC access to a reserved offset (ESR "illegal register address" is set).
    ReservedRegister {
        /// Offset from the APIC base.
        offset: u64,
    },
    /// An xAPIC write to a read-only register (ignored).
    ReadOnlyRegister {
        /// Offset from the APIC base.
        offset: u64,
    },
    /// An xAPIC MMIO access while the APIC is disabled or in x2APIC mode.
    MmioWhileDisabled {
        /// Offset from the APIC base.
        offset: u64,
    },
    /// An MSR access that faults (#GP).
    MsrFault {
        /// The MSR.
        msr: u32,
    },
    /// A write with reserved bits set; the bits were dropped.
    ReservedBits {
        /// Register offset.
        offset: u32,
        /// The value written.
        value: u64,
    },
}

/// Callbacks for guest behaviour worth counting; every method has an empty default.
///
/// Methods take `&self` so a metrics implementation can use atomics and be shared (`Arc`).
pub trait LapicEvents {
    /// The guest made an access the hardware ignores or faults on.
    fn invalid_access(&self, _access: InvalidAccess) {}
    /// A vector below 16 was sent or received (ESR records it too).
    fn illegal_vector(&self, _vector: u8) {}
    /// A timer deadline was pushed out to the minimum period or delay.
    fn timer_clamped(&self, _requested_ns: u64, _clamped_ns: u64) {}
    /// The guest used a delivery mode lull does not deliver (SMI, ExtINT, reserved encodings).
    fn unsupported_delivery_mode(&self, _mode: u8) {}
}

/// Events sink that ignores everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoopLapicEvents;

impl LapicEvents for NoopLapicEvents {}

impl<E: LapicEvents> LapicEvents for Arc<E> {
    fn invalid_access(&self, access: InvalidAccess) {
        self.as_ref().invalid_access(access);
    }
    fn illegal_vector(&self, vector: u8) {
        self.as_ref().illegal_vector(vector);
    }
    fn timer_clamped(&self, requested_ns: u64, clamped_ns: u64) {
        self.as_ref().timer_clamped(requested_ns, clamped_ns);
    }
    fn unsupported_delivery_mode(&self, mode: u8) {
        self.as_ref().unsupported_delivery_mode(mode);
    }
}
