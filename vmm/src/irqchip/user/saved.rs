//! What a snapshot holds of one vCPU's user-space irqchip (`--irqchip user`): its LAPIC
//! (registers, pending and in-service interrupts, NMIs, INIT/SIPI state, the timer in guest
//! time: see `devices::lapic::LapicState`) and the guest's PV EOI and PV deadline
//! registrations. Saved on the vCPU's thread at the pause gate, restored before its thread
//! starts (`vcpu/saved.rs`). Not kept: the TSC map (made again from the restoring VM's guest
//! TSC), the learned timer advance, the timer model's queues (the LAPIC timer is armed again
//! through the normal path) and the synthetic `--global-timers` load (it starts afresh).

use devices::ioapic::IoApicStateError;
use devices::lapic::{LapicState, LapicStateError};
use serde::{Deserialize, Serialize};

use super::pv_deadline::PvDeadlineError;
use super::pv_eoi::PvEoiError;

/// Why a saved irqchip state (a vCPU's or the IOAPIC's) is refused.
#[derive(Debug, thiserror::Error)]
pub enum ChipStateError {
    /// The saved LAPIC (its error names the field).
    #[error(transparent)]
    Lapic(#[from] LapicStateError),
    /// The saved IOAPIC (its error names the field).
    #[error(transparent)]
    IoApic(#[from] IoApicStateError),
    /// The guest's PV EOI registration.
    #[error("its PV EOI registration: {0}")]
    PvEoi(#[from] PvEoiError),
    /// The guest's PV deadline registration.
    #[error("its PV deadline registration: {0}")]
    PvDeadline(#[from] PvDeadlineError),
    /// PV EOI was registered, but the restoring VM does not offer it.
    #[error("PV EOI is registered, but this VM does not offer it")]
    PvEoiNotOffered,
    /// A PV deadline was registered, but the restoring VM does not offer it.
    #[error("a PV deadline is registered, but this VM does not offer it")]
    PvDeadlineNotOffered,
    /// The VM's irqchip is KVM's, which holds its interrupt state itself.
    #[error("this VM's irqchip is KVM's, which holds its interrupt state itself")]
    KernelIrqchip,
}

/// One vCPU's user-space irqchip state in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserVcpuState {
    /// The LAPIC.
    pub lapic: LapicState,
    /// `MSR_KVM_PV_EOI_EN` as the guest wrote it (0: not registered).
    pub pv_eoi_msr: u64,
    /// `MSR_LULL_PV_DEADLINE` as the guest wrote it (0: not registered).
    pub pv_deadline_msr: u64,
    /// The vCPU was halted (HLT, waiting for an interrupt): it halts again when restored,
    /// rather than run on past its HLT with no interrupt.
    pub halted: bool,
}
