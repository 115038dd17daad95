//! One vCPU of the `lapic` target: its irqchip half, its fake port, where its thread is, and
//! what the target expects of it.

use std::sync::Arc;

use devices::lapic::Lapic;
use vmm::irqchip::user::vcpu::UserVcpuIrq;
use vmm::metrics::LapicNoise;

use super::model;
use crate::chip::{FakePort, FuzzClock};

/// One vCPU's irqchip half.
pub(super) type Irq = UserVcpuIrq<Arc<LapicNoise>, FuzzClock>;

/// Where a vCPU's thread is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// In user space between an exit and the next entry.
    Out,
    /// In KVM_RUN (after `before_entry` said Enter).
    InGuest,
    /// In INIT, waiting for a SIPI.
    WaitingForSipi,
}

/// One vCPU: its irqchip half, its fake port, and what the target expects of it.
pub(super) struct Vcpu {
    pub(super) irq: Irq,
    pub(super) port: FakePort,
    pub(super) place: Place,
    /// Fixed IPIs sent to it since its last entry.
    pub(super) expected: Vec<u8>,
    /// NMIs sent to it since its last entry.
    pub(super) expected_nmis: u64,
    /// LAPIC writes (MMIO or MSR) its guest made: each may arm the timer once.
    pub(super) writes: u64,
    /// The PV EOI flag the guest enabled (accepted writes of the MSR).
    pub(super) pv_flag: Option<u64>,
    /// The PV deadline slot the guest enabled (accepted writes of the MSR).
    pub(super) pv_slot: Option<u64>,
    /// The vector lull offered through the flag at the last entry, when the target saw it
    /// offered (the flag went from 0 to 1).
    pub(super) offered: Option<u8>,
    /// What the target delivered to it and the guest ended, and the TPR the guest wrote.
    pub(super) model: model::Priority,
    /// When its last entry ended (what the chip charges the CPU quota from).
    pub(super) entered: u64,
}

/// A copy of `v`'s LAPIC, to read registers from.
pub(super) fn lapic_of(v: &Vcpu) -> Lapic<Arc<LapicNoise>> {
    // Reads go to a copy: looking must not change what is looked at.
    v.irq.lapic().clone()
}
