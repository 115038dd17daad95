//! A vCPU's state as KVM holds it, read by the vCPU's own thread while the VM is paused (the
//! part of a snapshot only KVM knows): registers, special registers, FPU/SSE/AVX through
//! XSAVE, XCRs, debug registers, pending events, MP state, the MSRs a guest changes, and with
//! `--irqchip kernel` KVM's LAPIC.
//! Order matters on the way back (`KVM_SET_*`): see [`VcpuKvmState`].

use kvm_bindings::{
    kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs,
    kvm_vcpu_events, kvm_xcrs, kvm_xsave, Msrs,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

use crate::irqchip::user::saved::UserVcpuState;

/// The MSRs a snapshot keeps (those KVM holds; lull's own, like IA32_APIC_BASE and the
/// TSC deadline with `--irqchip user`, are in lull's LAPIC state): the TSC, SYSENTER,
/// SYSCALL, the kernel GS base, TSC_AUX, PAT, MISC_ENABLE, the MTRR default type, kvmclock
/// and KVM's async-PF/steal-time/PV-EOI registrations, and the TSC deadline (`--irqchip
/// kernel`).
pub const SAVED_MSRS: [u32; 19] = [
    0x10,        // IA32_TSC
    0x174,       // SYSENTER_CS
    0x175,       // SYSENTER_ESP
    0x176,       // SYSENTER_EIP
    0x1a0,       // MISC_ENABLE
    0x277,       // PAT
    0x2ff,       // MTRR default type
    0x6e0,       // TSC_DEADLINE (KVM's LAPIC)
    0xc000_0081, // STAR
    0xc000_0082, // LSTAR
    0xc000_0083, // CSTAR
    0xc000_0084, // SFMASK
    0xc000_0102, // KERNEL_GS_BASE
    0xc000_0103, // TSC_AUX
    0x4b56_4d00, // kvmclock wall clock
    0x4b56_4d01, // kvmclock system time
    0x4b56_4d02, // async PF
    0x4b56_4d03, // steal time
    0x4b56_4d04, // PV EOI
];

/// One vCPU's KVM state. Restored in the order of the fields that matter to KVM: special
/// registers before registers (the mode decides how RIP is read), XSAVE and XCRs, then MSRs
/// (with `--irqchip kernel`, KVM's LAPIC must be restored before the MSRs, so that the TSC
/// deadline lands on a LAPIC in TSC-deadline mode), then events and MP state last.
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuKvmState {
    /// The vCPU.
    pub id: u32,
    /// General registers.
    pub regs: kvm_regs,
    /// Segment, control and descriptor-table registers, EFER, APIC base as KVM sees it.
    pub sregs: kvm_sregs,
    /// FPU, SSE and AVX state (the XSAVE area; its legacy part where XSAVE is not offered).
    pub xsave: kvm_xsave,
    /// Extended control registers (`None` where KVM has none: no XSAVE).
    pub xcrs: Option<kvm_xcrs>,
    /// Debug registers.
    pub debugregs: kvm_debugregs,
    /// Pending exceptions, interrupts, NMIs and SMM state.
    pub events: kvm_vcpu_events,
    /// Runnable, halted, INIT, SIPI (KVM's view; lull's own is in its vCPU state).
    pub mp_state: kvm_mp_state,
    /// The [`SAVED_MSRS`] KVM answered for, as (index, value).
    pub msrs: Vec<(u32, u64)>,
    /// KVM's LAPIC registers (`--irqchip kernel`; `None` without an in-kernel LAPIC). KVM
    /// stores the timer's current count in them, so a one-shot keeps what it had left.
    pub lapic: Option<kvm_lapic_state>,
    /// lull's LAPIC and PV registrations (`--irqchip user`; `None` with KVM's LAPIC). Not
    /// KVM's, but saved with it on the vCPU's thread; restored before the thread starts.
    pub user_irqchip: Option<UserVcpuState>,
}

/// Why a vCPU's state could not be read.
#[derive(Debug, thiserror::Error)]
#[error("KVM call {call} on vCPU {id} failed: {source}")]
pub struct VcpuStateError {
    /// The vCPU.
    pub id: u32,
    /// Which call.
    pub call: &'static str,
    /// Why.
    pub source: kvm_ioctls::Error,
}

impl From<VcpuStateError> for crate::state::pause_gate::SaveError {
    fn from(e: VcpuStateError) -> Self {
        Self::Kvm {
            call: e.call,
            source: e.source,
        }
    }
}

impl VcpuKvmState {
    /// Reads vCPU `id`'s state (on its own thread, while the VM is paused).
    pub fn capture(id: u32, fd: &VcpuFd) -> Result<Self, VcpuStateError> {
        let kvm = |call| move |source| VcpuStateError { id, call, source };
        Ok(Self {
            id,
            regs: fd.get_regs().map_err(kvm("KVM_GET_REGS"))?,
            sregs: fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?,
            xsave: fd.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?,
            xcrs: fd.get_xcrs().ok(),
            debugregs: fd.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?,
            events: fd.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?,
            mp_state: fd.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?,
            msrs: read_msrs(fd),
            lapic: fd.get_lapic().ok(),
            user_irqchip: None,
        })
    }
}

impl VcpuKvmState {
    /// Sets MSR `index` to `data` in this state.
    pub fn set_msr(&mut self, index: u32, data: u64) {
        match self.msrs.iter_mut().find(|(i, _)| *i == index) {
            Some(entry) => entry.1 = data,
            None => self.msrs.push((index, data)),
        }
    }

    /// Gives vCPU `fd` this state, in the order KVM needs (see [`VcpuKvmState`]).
    pub fn restore(&self, fd: &VcpuFd) -> Result<(), VcpuStateError> {
        let id = self.id;
        let kvm = |call| move |source| VcpuStateError { id, call, source };
        fd.set_sregs(&self.sregs).map_err(kvm("KVM_SET_SREGS"))?;
        fd.set_regs(&self.regs).map_err(kvm("KVM_SET_REGS"))?;
        crate::host::sys::kvm::set_xsave(fd, &self.xsave).map_err(kvm("KVM_SET_XSAVE"))?;
        if let Some(xcrs) = &self.xcrs {
            fd.set_xcrs(xcrs).map_err(kvm("KVM_SET_XCRS"))?;
        }
        fd.set_debug_regs(&self.debugregs)
            .map_err(kvm("KVM_SET_DEBUGREGS"))?;
        if let Some(lapic) = &self.lapic {
            fd.set_lapic(lapic).map_err(kvm("KVM_SET_LAPIC"))?;
        }
        for &(index, data) in &self.msrs {
            let entry = kvm_msr_entry {
                index,
                data,
                ..Default::default()
            };
            let msrs = Msrs::from_entries(&[entry])
                .map_err(|_| kvm("KVM_SET_MSRS")(kvm_ioctls::Error::new(libc::E2BIG)))?;
            fd.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
        }
        fd.set_vcpu_events(&self.events)
            .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
        fd.set_mp_state(self.mp_state)
            .map_err(kvm("KVM_SET_MP_STATE"))
    }
}

/// The [`SAVED_MSRS`] KVM answers for (each asked alone: KVM stops a list at the first MSR it
/// does not know).
fn read_msrs(fd: &VcpuFd) -> Vec<(u32, u64)> {
    SAVED_MSRS
        .iter()
        .filter_map(|&index| {
            let entry = kvm_msr_entry {
                index,
                ..Default::default()
            };
            let mut msrs = Msrs::from_entries(&[entry]).ok()?;
            match fd.get_msrs(&mut msrs) {
                Ok(1) => msrs.as_slice().first().map(|e| (index, e.data)),
                _ => None,
            }
        })
        .collect()
}

/// Test helpers: a state with every register zero.
#[cfg(test)]
pub mod tests_support {
    use super::*;

    /// vCPU `id`'s state, all zero.
    pub fn blank(id: u32) -> VcpuKvmState {
        VcpuKvmState {
            id,
            regs: kvm_regs::default(),
            sregs: kvm_sregs::default(),
            xsave: kvm_xsave::default(),
            xcrs: None,
            debugregs: kvm_debugregs::default(),
            events: kvm_vcpu_events::default(),
            mp_state: kvm_mp_state::default(),
            msrs: Vec::new(),
            lapic: None,
            user_irqchip: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_goes_through_json_unchanged() {
        let mut state = tests_support::blank(1);
        state.msrs = vec![(0x10, 12345), (0x6e0, 0)];
        state.regs.rip = 0x10_0000;
        state.sregs.cr0 = 0x11;
        state.xsave.region[0] = 0x37f;
        let text = serde_json::to_vec(&state).unwrap();
        let back: VcpuKvmState = serde_json::from_slice(&text).unwrap();
        assert_eq!(back.regs.rip, 0x10_0000);
        assert_eq!(back.sregs.cr0, 0x11);
        assert_eq!(back.xsave.region[0], 0x37f);
        assert_eq!(back.msrs, state.msrs);
    }
}
