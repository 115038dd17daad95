//! The KVM adapter of a vCPU: [`CpuPort`] over a `VcpuFd`, and the register changes of INIT
//! and SIPI. The irqchip acts on its vCPU only through this.
//!
//! IA32_APIC_BASE: KVM answers CPUID in the kernel and derives CPUID.1:EDX[9] (APIC present)
//! from its own copy of the MSR (`kvm_update_cpuid_runtime`, also without an in-kernel LAPIC).
//! The guest's writes of the MSR reach lull instead (MSR filter), so KVM's copy is refreshed
//! with a host-initiated KVM_SET_MSRS, which KVM allows at any time; rewriting the CPUID table
//! is no way out (KVM refuses KVM_SET_CPUID2 with a different table after the first KVM_RUN).
//!
//! NMIs: KVM queues what `KVM_NMI` gives it and keeps a second NMI until the guest's IRET from
//! the first; `KVM_GET_VCPU_EVENTS` tells whether one is still held, and INIT drops any (as
//! KVM's own INIT does, `kvm_vcpu_reset`) with `KVM_SET_VCPU_EVENTS`.
//!
//! Injection: without an in-kernel irqchip KVM takes an external interrupt with `KVM_INTERRUPT`,
//! an ioctl of its own, for which KVM loads the vCPU (`vcpu_load`, ~5-8 us on our PVM hosts:
//! one per injected interrupt, on top of the `KVM_RUN` that follows). Where KVM offers the
//! synchronized vCPU events (`KVM_CAP_SYNC_REGS` with `KVM_SYNC_X86_EVENTS`), lull asks KVM to
//! store them in `kvm_run` at every exit and hands the interrupt back in them, marked dirty:
//! KVM applies them inside the next `KVM_RUN` (`sync_regs`, before it completes the exit and
//! before it checks `immediate_exit`), exactly as `KVM_INTERRUPT` would have queued it. The
//! events go back with no `flags`, so KVM leaves its NMI queue, the interrupt shadow and SMM
//! alone (lull may have queued an NMI with `KVM_NMI` since the exit); the exception and NMI
//! state it does write back are the ones it stored at that exit, unchanged since (lull's only
//! other change of them, INIT, refreshes the copy).

use kvm_bindings::{
    kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, Msrs, KVM_SYNC_X86_EVENTS,
    KVM_VCPUEVENT_VALID_NMI_PENDING,
};
use kvm_ioctls::{Cap, Kvm, SyncReg, VcpuFd};

use crate::host::sys;
use crate::irqchip::{CpuPort, KvmNmi};
use crate::ratelimit::LogLimiter;

/// IA32_APIC_BASE.
const MSR_IA32_APIC_BASE: u32 = 0x1b;

static APIC_BASE_SYNC_FAILED: LogLimiter = LogLimiter::new();

/// A KVM vCPU with its architectural reset state (for INIT).
pub struct KvmPort {
    /// The vCPU.
    pub fd: VcpuFd,
    /// Its index.
    pub id: u32,
    /// Registers at reset.
    pub reset_regs: kvm_regs,
    /// Special registers at reset.
    pub reset_sregs: kvm_sregs,
    /// How it hands KVM an interrupt.
    pub inject_path: InjectPath,
}

/// How lull hands KVM an external interrupt to inject (no in-kernel irqchip).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectPath {
    /// `KVM_INTERRUPT`, an ioctl of its own.
    Ioctl,
    /// The vCPU events `kvm_run` carries (`KVM_CAP_SYNC_REGS`), applied by the next `KVM_RUN`.
    SyncRegs,
}

impl InjectPath {
    /// The cheaper path this KVM offers.
    pub fn probe(kvm: &Kvm) -> Self {
        let fields = kvm.check_extension_int(Cap::SyncRegs);
        if u32::try_from(fields).is_ok_and(|f| f & KVM_SYNC_X86_EVENTS != 0) {
            Self::SyncRegs
        } else {
            Self::Ioctl
        }
    }
}

/// `events` as KVM stored them at the last exit, changed to inject external interrupt `vector`
/// at the next entry the way `KVM_INTERRUPT` queues it (not soft), with no `flags`: KVM then
/// leaves its NMI queue, the interrupt shadow, SMM, the SIPI vector and a triple fault alone.
pub fn events_with_interrupt(events: &kvm_vcpu_events, vector: u8) -> kvm_vcpu_events {
    let mut out = *events;
    out.interrupt.injected = 1;
    out.interrupt.nr = vector;
    out.interrupt.soft = 0;
    out.flags = 0;
    out
}

impl KvmPort {
    /// The adapter of vCPU `id`, created with `fd`; with [`InjectPath::SyncRegs`] KVM is asked
    /// to store the vCPU events in `kvm_run` at every exit.
    pub fn new(
        mut fd: VcpuFd,
        id: u32,
        inject_path: InjectPath,
    ) -> Result<Self, kvm_ioctls::Error> {
        let reset_regs = fd.get_regs()?;
        let reset_sregs = fd.get_sregs()?;
        if inject_path == InjectPath::SyncRegs {
            fd.set_sync_valid_reg(SyncReg::VcpuEvents);
        }
        Ok(Self {
            fd,
            id,
            reset_regs,
            reset_sregs,
            inject_path,
        })
    }

    /// INIT: back to the architectural reset state, with no NMI, interrupt or exception left
    /// queued in KVM.
    pub fn reset_to_init(&mut self) -> Result<(), kvm_ioctls::Error> {
        let mut events = self.fd.get_vcpu_events()?;
        events.nmi.pending = 0;
        events.nmi.injected = 0;
        events.nmi.masked = 0;
        events.interrupt.injected = 0;
        events.interrupt.shadow = 0;
        events.exception.injected = 0;
        events.exception.pending = 0;
        events.exception_has_payload = 0;
        events.flags |= KVM_VCPUEVENT_VALID_NMI_PENDING;
        self.fd.set_vcpu_events(&events)?;
        if self.inject_path == InjectPath::SyncRegs {
            // The copy an injection starts from must be KVM's state after INIT.
            self.fd.sync_regs_mut().events = events;
        }
        self.fd.set_regs(&self.reset_regs)?;
        self.fd.set_sregs(&self.reset_sregs)
    }

    /// SIPI with `vector`: real mode at CS = vector << 8, IP = 0.
    pub fn start_at_sipi(&mut self, vector: u8) -> Result<(), kvm_ioctls::Error> {
        let mut sregs = self.reset_sregs;
        sregs.cs.selector = u16::from(vector) << 8;
        sregs.cs.base = u64::from(vector) << 12;
        self.fd.set_sregs(&sregs)?;
        self.fd.set_regs(&kvm_regs {
            rip: 0,
            rflags: 2,
            ..self.reset_regs
        })
    }

    /// A vCPU restored halted (`--irqchip user`) has not exited yet: gives `kvm_run` what its
    /// last exit would have said, from the restored `regs` and `events` (IF, and whether an
    /// interrupt can go in), so that its halt wakes for an interrupt as before the snapshot.
    /// KVM overwrites both at the vCPU's first exit.
    pub fn seed_halted_exit(&mut self, regs: &kvm_regs, events: &kvm_vcpu_events) {
        const RFLAGS_IF: u64 = 1 << 9;
        let if_flag = regs.rflags & RFLAGS_IF != 0;
        let pending = events.interrupt.injected != 0
            || events.exception.injected != 0
            || events.nmi.injected != 0;
        let run = self.fd.get_kvm_run();
        run.if_flag = u8::from(if_flag);
        run.ready_for_interrupt_injection =
            u8::from(if_flag && events.interrupt.shadow == 0 && !pending);
    }
}

impl CpuPort for KvmPort {
    fn can_inject(&mut self) -> bool {
        let run = self.fd.get_kvm_run();
        run.ready_for_interrupt_injection != 0 && run.if_flag != 0
    }

    fn interrupts_enabled(&mut self) -> bool {
        self.fd.get_kvm_run().if_flag != 0
    }

    fn inject(&mut self, vector: u8) -> std::io::Result<()> {
        match self.inject_path {
            InjectPath::Ioctl => sys::kvm::inject_interrupt(&self.fd, vector),
            InjectPath::SyncRegs => {
                // In place: `sync_regs()` would copy all of regs, sregs and events first.
                let synced = self.fd.sync_regs_mut();
                synced.events = events_with_interrupt(&synced.events, vector);
                self.fd.set_sync_dirty_reg(SyncReg::VcpuEvents);
                Ok(())
            }
        }
    }

    fn request_interrupt_window(&mut self, on: bool) {
        self.fd.get_kvm_run().request_interrupt_window = u8::from(on);
    }

    fn clear_immediate_exit(&mut self) {
        self.fd.set_kvm_immediate_exit(0);
    }

    fn inject_nmi(&mut self) -> std::io::Result<()> {
        self.fd
            .nmi()
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    }

    fn kvm_nmi(&mut self) -> std::io::Result<KvmNmi> {
        let events = self
            .fd
            .get_vcpu_events()
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        Ok(if events.nmi.injected != 0 {
            KvmNmi::Deliverable
        } else if events.nmi.pending == 0 {
            KvmNmi::None
        } else if events.nmi.masked != 0 {
            KvmNmi::Blocked
        } else {
            KvmNmi::Deliverable
        })
    }

    fn set_cr8(&mut self, cr8: u64) {
        self.fd.get_kvm_run().cr8 = cr8;
    }

    fn set_apic_base(&mut self, value: u64) {
        let entry = kvm_msr_entry {
            index: MSR_IA32_APIC_BASE,
            data: value,
            ..Default::default()
        };
        let accepted = Msrs::from_entries(&[entry])
            .ok()
            .and_then(|msrs| self.fd.set_msrs(&msrs).ok());
        if accepted != Some(1) {
            if let Some(n) = APIC_BASE_SYNC_FAILED.hit() {
                tracing::warn!(
                    vcpu = self.id,
                    "KVM refused IA32_APIC_BASE = {value:#x}; CPUID.1:EDX[9] may not follow the APIC enable bit ({n} so far)"
                );
            }
        }
    }

    fn register_kick(&mut self) {
        sys::kick::register_vcpu_thread(self.fd.get_kvm_run());
    }

    fn unregister_kick(&mut self) {
        sys::kick::unregister_vcpu_thread();
    }
}

#[cfg(test)]
mod tests {
    use kvm_bindings::{
        KVM_VCPUEVENT_VALID_NMI_PENDING, KVM_VCPUEVENT_VALID_SHADOW, KVM_VCPUEVENT_VALID_SMM,
    };

    use super::*;

    /// Events as KVM reports them at an exit: an NMI queued and masked, an interrupt shadow,
    /// an exception being delivered.
    fn reported() -> kvm_vcpu_events {
        let mut e = kvm_vcpu_events {
            flags: KVM_VCPUEVENT_VALID_NMI_PENDING
                | KVM_VCPUEVENT_VALID_SHADOW
                | KVM_VCPUEVENT_VALID_SMM,
            sipi_vector: 0x9a,
            ..Default::default()
        };
        e.nmi.pending = 1;
        e.nmi.masked = 1;
        e.interrupt.shadow = 1;
        e.exception.injected = 1;
        e.exception.nr = 14;
        e.exception.has_error_code = 1;
        e.exception.error_code = 2;
        e
    }

    #[test]
    fn the_interrupt_is_queued_as_kvm_interrupt_queues_it() {
        let mut before = reported();
        before.interrupt.soft = 1;
        before.interrupt.nr = 3;
        let e = events_with_interrupt(&before, 0xec);
        assert_eq!(
            (e.interrupt.injected, e.interrupt.nr, e.interrupt.soft),
            (1, 0xec, 0)
        );
    }

    #[test]
    fn kvm_is_told_to_leave_its_nmi_queue_shadow_and_smm_alone() {
        // KVM_SET_VCPU_EVENTS rewrites the NMI queue only with VALID_NMI_PENDING (an NMI lull
        // queued with KVM_NMI after the exit would be lost), the shadow only with VALID_SHADOW,
        // SMM only with VALID_SMM.
        assert_eq!(events_with_interrupt(&reported(), 0x30).flags, 0);
    }

    #[test]
    fn what_kvm_writes_back_unconditionally_is_what_it_reported() {
        let before = reported();
        let e = events_with_interrupt(&before, 0x30);
        assert_eq!(
            (
                e.exception.injected,
                e.exception.nr,
                e.exception.has_error_code
            ),
            (1, 14, 1)
        );
        assert_eq!(e.exception.error_code, 2);
        assert_eq!((e.nmi.injected, e.nmi.masked), (0, 1));
    }
}
