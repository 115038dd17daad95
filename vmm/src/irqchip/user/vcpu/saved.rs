//! A vCPU's chip to and from a snapshot ([`UserVcpuState`]): saved on its thread while the VM
//! is paused, restored before its thread starts; the LAPIC timer's host timer is armed at
//! `attach`, on the thread that owns it, through the normal path (the timer model's queue
//! and hierarchy, the advance, the VM clock's re-arm at a thaw).

use devices::lapic::LapicEvents;
use timer::VmTime;

use super::{UserVcpuIrq, VcpuChip};
use crate::irqchip::user::pv_deadline::PvDeadline;
use crate::irqchip::user::pv_eoi::PvEoi;
use crate::irqchip::user::saved::{ChipStateError, UserVcpuState};

impl<E: LapicEvents + Send, C: VmTime> VcpuChip<E, C> {
    /// The chip's state now; interrupts posted to the vCPU are taken into its LAPIC first, so
    /// that none is left behind in the mailbox.
    pub(super) fn save(&mut self, halted: bool) -> UserVcpuState {
        for ipi in self.wait.mailbox.take_mail() {
            self.lapic.receive(&ipi);
        }
        UserVcpuState {
            lapic: self.lapic.save(self.clock.now()),
            pv_eoi_msr: self.pv.eoi.as_ref().map_or(0, PvEoi::msr),
            pv_deadline_msr: self.pv.deadline.as_ref().map_or(0, PvDeadline::msr),
            halted,
        }
    }

    /// Takes `state`, all checked before anything changes: the LAPIC against its
    /// configuration, the PV registrations against guest memory and the VM's features.
    pub(super) fn restore(&mut self, state: &UserVcpuState) -> Result<(), ChipStateError> {
        let mut pv_eoi = self.pv.eoi.as_ref().map(|_| PvEoi::default());
        match (&mut pv_eoi, state.pv_eoi_msr) {
            (_, 0) => {}
            (Some(pv), msr) => pv.write_msr(msr, &self.pv.mem)?,
            (None, _) => return Err(ChipStateError::PvEoiNotOffered),
        }
        let mut pv_deadline = self.pv.deadline.as_ref().map(|_| PvDeadline::default());
        match (&mut pv_deadline, state.pv_deadline_msr) {
            (_, 0) => {}
            (Some(pv), msr) => pv.write_msr(msr, &self.pv.mem)?,
            (None, _) => return Err(ChipStateError::PvDeadlineNotOffered),
        }
        // The host timer is armed at `attach` (see the module's comment): the change is
        // the LAPIC's timer deadline, which that reads.
        let _ = self.lapic.restore(&state.lapic, self.clock.now())?;
        self.pv.eoi = pv_eoi;
        self.pv.deadline = pv_deadline;
        self.restored_halt = state.halted;
        if let Ok(index) = usize::try_from(self.id) {
            self.vm
                .router
                .update_destination(index, self.lapic.destination_info());
        }
        Ok(())
    }

    /// At `attach`: arms the host timer of a LAPIC timer a restore left running (nothing on
    /// a fresh LAPIC). KVM has the restored IA32_APIC_BASE already, from the special
    /// registers of the vCPU's KVM state.
    pub(super) fn arm_restored(&mut self) {
        if let Some(deadline) = self.lapic.timer_deadline() {
            self.lapic_timer.arm(self.timers.as_mut(), deadline);
        }
    }
}

impl<E: LapicEvents + Send, C: VmTime> UserVcpuIrq<E, C> {
    /// See [`crate::irqchip::VcpuIrq::save`].
    pub(super) fn save_chip(&mut self, halted: bool) -> UserVcpuState {
        self.chip.save(halted)
    }

    /// See [`crate::irqchip::VcpuIrq::restore`].
    pub(super) fn restore_chip(&mut self, state: &UserVcpuState) -> Result<(), ChipStateError> {
        self.chip.restore(state)
    }
}
