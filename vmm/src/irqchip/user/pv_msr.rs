//! The paravirtual MSRs lull answers itself with `--irqchip user`: KVM's `MSR_KVM_PV_EOI_EN`
//! (see `pv_eoi.rs`) and lull's `MSR_LULL_PV_DEADLINE` (see `pv_deadline.rs`). An MSR whose
//! feature the VM does not offer is left to the generic MSR path, which refuses it (#GP).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kvm_ioctls::VcpuExit;
use vm_memory::GuestMemoryMmap;

use super::pv_deadline::{PvDeadline, MSR_LULL_PV_DEADLINE};
use super::pv_eoi::{PvEoi, MSR_KVM_PV_EOI_EN};
use crate::metrics::VcpuCounters;

/// One vCPU's paravirtual state and the guest memory it lives in: `None` for a feature the
/// VM does not offer.
pub struct GuestPv {
    /// Guest memory (the PV EOI flag and the PV deadline slot live there).
    pub mem: Arc<GuestMemoryMmap>,
    /// PV EOI.
    pub eoi: Option<PvEoi>,
    /// PV TSC deadline.
    pub deadline: Option<PvDeadline>,
}

/// One vCPU's paravirtual MSR state: `None` for a feature the VM does not offer.
pub struct PvMsrs<'s> {
    /// PV EOI.
    pub eoi: Option<&'s mut PvEoi>,
    /// PV TSC deadline.
    pub deadline: Option<&'s mut PvDeadline>,
}

impl PvMsrs<'_> {
    /// Handles `exit` if it is an access to an offered PV MSR (a refused write sets the
    /// exit's error: #GP); gives any other exit back.
    pub fn handle<'a>(
        self,
        exit: VcpuExit<'a>,
        mem: &GuestMemoryMmap,
        counters: &VcpuCounters,
    ) -> Result<(), VcpuExit<'a>> {
        let (index, write) = match &exit {
            VcpuExit::X86Wrmsr(msr) => (msr.index, true),
            VcpuExit::X86Rdmsr(msr) => (msr.index, false),
            _ => return Err(exit),
        };
        let known = match index {
            MSR_KVM_PV_EOI_EN => self.eoi.is_some(),
            MSR_LULL_PV_DEADLINE => self.deadline.is_some(),
            _ => false,
        };
        if !known {
            return Err(exit);
        }
        counters.msr.fetch_add(1, Ordering::Relaxed);
        match exit {
            VcpuExit::X86Wrmsr(msr) if write => {
                let refused = match (index, self.eoi, self.deadline) {
                    (MSR_KVM_PV_EOI_EN, Some(pv), _) => pv.write_msr(msr.data, mem).is_err(),
                    (_, _, Some(pv)) => pv.write_msr(msr.data, mem).is_err(),
                    _ => true,
                };
                if refused {
                    *msr.error = 1;
                }
            }
            VcpuExit::X86Rdmsr(msr) => {
                *msr.data = match (index, self.eoi, self.deadline) {
                    (MSR_KVM_PV_EOI_EN, Some(pv), _) => pv.msr(),
                    (_, _, Some(pv)) => pv.msr(),
                    _ => 0,
                };
            }
            _ => {}
        }
        Ok(())
    }
}
