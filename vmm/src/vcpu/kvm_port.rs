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

use kvm_bindings::{kvm_msr_entry, kvm_regs, kvm_sregs, Msrs, KVM_VCPUEVENT_VALID_NMI_PENDING};
use kvm_ioctls::VcpuFd;

use crate::irqchip::{CpuPort, KvmNmi};
use crate::ratelimit::LogLimiter;
use crate::sys;

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
}

impl KvmPort {
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
        sys::kvm::inject_interrupt(&self.fd, vector)
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
