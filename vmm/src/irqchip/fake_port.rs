//! A vCPU that records what the irqchip does to it, for tests and fuzz targets that drive the
//! real per-vCPU irqchip without KVM (`irqchip/user/vcpu_tests.rs`, `fuzz/src/chip.rs`).

use super::{CpuPort, KvmNmi};

/// A [`CpuPort`] whose interrupt window the caller sets and which records every injection,
/// NMI, window request, CR8 and APIC-base write.
#[derive(Debug, Default)]
pub struct FakePort {
    /// The guest can take an interrupt (RFLAGS.IF set, no interrupt shadow).
    pub open: bool,
    /// Vectors injected, in order.
    pub injected: Vec<u8>,
    /// The interrupt-window request as last set.
    pub window_requested: bool,
    /// NMIs injected.
    pub nmis: u64,
    /// The IA32_APIC_BASE KVM was last told.
    pub apic_base: Option<u64>,
    /// CR8 as the irqchip set it for the next entry.
    pub cr8: u64,
    /// What KVM_GET_VCPU_EVENTS says about NMIs; `None`: what KVM_NMI queued is still
    /// pending (no guest code ran to take it).
    pub kvm_nmi: Option<KvmNmi>,
    /// KVM_GET_VCPU_EVENTS calls.
    pub events_asked: u64,
}

impl CpuPort for FakePort {
    fn can_inject(&mut self) -> bool {
        self.open
    }

    fn interrupts_enabled(&mut self) -> bool {
        self.open
    }

    fn inject(&mut self, vector: u8) -> std::io::Result<()> {
        // KVM_INTERRUPT with IF clear or in a shadow would be lost or fault the guest.
        assert!(
            self.open,
            "vector {vector:#x} injected while the guest cannot take an interrupt"
        );
        self.injected.push(vector);
        Ok(())
    }

    fn request_interrupt_window(&mut self, on: bool) {
        self.window_requested = on;
    }

    fn clear_immediate_exit(&mut self) {}

    fn inject_nmi(&mut self) -> std::io::Result<()> {
        self.nmis += 1;
        Ok(())
    }

    fn kvm_nmi(&mut self) -> std::io::Result<KvmNmi> {
        self.events_asked += 1;
        Ok(self.kvm_nmi.unwrap_or(if self.nmis > 0 {
            KvmNmi::Deliverable
        } else {
            KvmNmi::None
        }))
    }

    fn set_cr8(&mut self, cr8: u64) {
        self.cr8 = cr8;
    }

    fn set_apic_base(&mut self, value: u64) {
        self.apic_base = Some(value);
    }

    fn register_kick(&mut self) {}

    fn unregister_kick(&mut self) {}
}
