//! Keeping KVM's copy of IA32_APIC_BASE in step with lull's LAPIC (`--irqchip user`), so that
//! CPUID.1:EDX[9] (APIC present) follows the guest's enable bit as on hardware.
//!
//! KVM answers CPUID in the kernel and derives that bit from its own IA32_APIC_BASE.EN
//! (`kvm_update_cpuid_runtime`, also without an in-kernel LAPIC). The guest's writes of the
//! MSR reach lull instead (MSR filter), so KVM's copy would stay "enabled" for ever. Rewriting
//! the CPUID table is no way out: KVM refuses KVM_SET_CPUID2 with a different table after the
//! vCPU's first KVM_RUN. A host-initiated KVM_SET_MSRS of IA32_APIC_BASE is allowed at any
//! time, and KVM recomputes the CPUID bit from it.

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

use crate::ratelimit::LogLimiter;

/// IA32_APIC_BASE.
pub const MSR_IA32_APIC_BASE: u32 = 0x1b;

static FAILED: LogLimiter = LogLimiter::new();

/// Gives KVM `value`, the IA32_APIC_BASE lull's LAPIC now holds; a failure is logged
/// (rate-limited) and leaves only the CPUID bit stale.
pub fn sync_kvm_apic_base(vcpu: &VcpuFd, id: u32, value: u64) {
    let result = Msrs::from_entries(&[kvm_msr_entry {
        index: MSR_IA32_APIC_BASE,
        data: value,
        ..Default::default()
    }])
    .map_err(|e| format!("{e:?}"))
    .and_then(|msrs| vcpu.set_msrs(&msrs).map_err(|e| e.to_string()))
    .and_then(|n| {
        (n == 1)
            .then_some(())
            .ok_or_else(|| "KVM refused the value".to_string())
    });
    if let Err(e) = result {
        if let Some(n) = FAILED.hit() {
            tracing::warn!(
                vcpu = id,
                "KVM_SET_MSRS(IA32_APIC_BASE = {value:#x}) failed: {e}; CPUID.1:EDX[9] may not follow the APIC enable bit ({n} so far)"
            );
        }
    }
}
