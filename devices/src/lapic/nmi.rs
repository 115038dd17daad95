//! NMIs on their way from a LAPIC to its CPU, and what they hold back.
//!
//! The rules, as the SDM gives them (vol. 3, 6.7.1 "Handling Multiple NMIs", 6.9 "Priority
//! Among Concurrent Exceptions and Interrupts") and KVM models them (`arch/x86/kvm/x86.c`:
//! `kvm_inject_nmi` counts in `nmi_queued`, `process_nmi` folds that into `nmi_pending`):
//! - While an NMI is in service (NMI blocking, until the handler's IRET) one more is latched;
//!   further ones merge into it. With none in service two may be pending: one is delivered at
//!   once and the other waits behind it. So at most two are outstanding, and none is lost
//!   while fewer than two are ([`MAX_PENDING_NMIS`]).
//! - An NMI is taken before a maskable interrupt: a fixed interrupt sent after an NMI, by the
//!   same sender or any other, runs its handler after the NMI's (which starts with IF clear).
//!
//! A VMM without an in-kernel LAPIC hands NMIs to KVM (`KVM_NMI`), which then keeps NMI
//! blocking and the second NMI itself. But an external interrupt the VMM hands KVM is queued
//! as already injected, ahead of anything KVM has pending, NMIs included: so the VMM must not
//! hand one over while KVM still has an NMI to deliver. [`NmiQueue`] keeps that state:
//! accepted NMIs not yet handed over, and what the CPU last said it holds; it allows a fixed
//! interrupt only when no NMI is waiting for delivery ([`NmiQueue::holds_interrupts`]). An NMI
//! held behind NMI blocking does not hold interrupts back (a handler that sets IF takes them
//! on hardware too).

/// How many NMIs a LAPIC holds for its vCPU between two [`NmiQueue::take`] calls: one the
/// vCPU may take at once and one latched behind it, as on hardware (KVM keeps the same
/// limit in `process_nmi`).
pub const MAX_PENDING_NMIS: u32 = 2;

/// The NMIs the CPU (KVM) holds of those it was handed, as it reports them
/// (`KVM_GET_VCPU_EVENTS`: `nmi.injected`, `nmi.pending`, `nmi.masked`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CpuNmi {
    /// None pending or being injected.
    None,
    /// One is pending and NMIs are not blocked (or one is being injected): the next entry
    /// delivers it.
    Deliverable,
    /// One is pending behind NMI blocking (the guest is in its NMI handler): it waits for the
    /// handler's IRET.
    Blocked,
}

/// A vCPU's NMIs between its LAPIC and its CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NmiQueue {
    /// Accepted and not yet handed to the CPU, at most [`MAX_PENDING_NMIS`].
    pub(super) accepted: u32,
    /// What the CPU holds of the NMIs it was handed: as it last reported, or `Deliverable`
    /// from a hand-over until it reports again.
    pub(super) in_cpu: CpuNmi,
}

impl Default for NmiQueue {
    fn default() -> Self {
        Self {
            accepted: 0,
            in_cpu: CpuNmi::None,
        }
    }
}

impl NmiQueue {
    /// Accepts an NMI. Up to [`MAX_PENDING_NMIS`] wait for [`NmiQueue::take`]; more are
    /// merged, as a CPU latches only one NMI behind the one it is taking.
    pub fn accept(&mut self) {
        self.accepted = (self.accepted + 1).min(MAX_PENDING_NMIS);
    }

    /// NMIs accepted and not yet handed to the CPU.
    pub fn pending(&self) -> u32 {
        self.accepted
    }

    /// Hands the accepted NMIs to the CPU: how many to inject, 0 to [`MAX_PENDING_NMIS`]
    /// (`KVM_NMI` each; KVM applies the limit of one in service plus one pending itself).
    /// Until the CPU reports otherwise they count as deliverable.
    pub fn take(&mut self) -> u32 {
        let n = std::mem::take(&mut self.accepted);
        if n > 0 {
            self.in_cpu = CpuNmi::Deliverable;
        }
        n
    }

    /// Whether the CPU may still hold an NMI it was handed: ask it ([`NmiQueue::cpu_reports`])
    /// before a fixed interrupt goes in, and at a halt.
    pub fn in_cpu(&self) -> bool {
        self.in_cpu != CpuNmi::None
    }

    /// Records what the CPU says it holds.
    pub fn cpu_reports(&mut self, held: CpuNmi) {
        self.in_cpu = held;
    }

    /// Whether a fixed interrupt must wait: an NMI is accepted and not handed over, or the
    /// CPU may deliver one at its next entry. Ask the CPU first while [`NmiQueue::in_cpu`].
    pub fn holds_interrupts(&self) -> bool {
        self.accepted > 0 || self.in_cpu == CpuNmi::Deliverable
    }

    /// Whether the CPU has an NMI to deliver at its next entry whatever IF is: a halted vCPU
    /// must run for it (one behind NMI blocking waits for an IRET the halted vCPU cannot do).
    pub fn wakes_cpu(&self) -> bool {
        self.in_cpu == CpuNmi::Deliverable
    }

    /// INIT or RESET: no NMI is left, here or in the CPU (the VMM clears the CPU's too).
    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
#[path = "nmi_proptests.rs"]
mod proptests;
