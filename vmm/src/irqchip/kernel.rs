//! `--irqchip kernel`: KVM's in-kernel LAPIC, IOAPIC and PIC, the industry baseline lull is
//! measured against. KVM handles HLT, interrupt injection, INIT/SIPI and the LAPIC timer
//! itself, so the per-vCPU half has nothing to do; devices reach the chip through an irqfd
//! (the serial port) or `KVM_IRQ_LINE` (pc-testdev's lines; KVM's default routing sends GSI
//! n to IOAPIC input n).

use std::sync::Arc;

use devices::testdev::IrqLines;
use kvm_ioctls::{VcpuExit, VmFd};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{ChipExit, CpuPort, EdgeIrq, Entry, HaltEnd, IrqChip, IrqChipError, VcpuIrq};
use crate::metrics::RunReport;
use crate::ratelimit::LogLimiter;
use crate::state::VmShared;

/// KVM's in-kernel irqchip of one VM (created with the VM).
pub struct KernelIrqChip {
    vm: Arc<VmFd>,
    lines: Arc<KvmIrqLines>,
}

impl KernelIrqChip {
    /// The chip of `vm`, whose in-kernel irqchip exists already.
    pub fn new(vm: Arc<VmFd>) -> Self {
        Self {
            lines: Arc::new(KvmIrqLines {
                vm: vm.clone(),
                failed: LogLimiter::new(),
            }),
            vm,
        }
    }
}

impl IrqChip for KernelIrqChip {
    fn name(&self) -> &'static str {
        "kernel"
    }

    fn vcpu(&self, _id: u32, _shared: &Arc<VmShared>) -> Result<Box<dyn VcpuIrq>, IrqChipError> {
        Ok(Box::new(KernelVcpuIrq))
    }

    fn edge_irq(&self, gsi: u32) -> Result<EdgeIrq, IrqChipError> {
        let evt = EventFd::new(EFD_NONBLOCK).map_err(|source| IrqChipError::Host {
            what: "an irqfd eventfd",
            source,
        })?;
        self.vm
            .register_irqfd(&evt, gsi)
            .map_err(|source| IrqChipError::Kvm {
                call: "KVM_IRQFD",
                source,
            })?;
        Ok(EdgeIrq::Irqfd(evt))
    }

    fn irq_lines(&self) -> Arc<dyn IrqLines> {
        self.lines.clone()
    }

    fn start(&self, _shared: &Arc<VmShared>) -> Result<(), IrqChipError> {
        Ok(())
    }

    fn kick_all(&self) {
        // vCPU threads in KVM_RUN are ended with the process; nothing of theirs is reported.
    }

    fn report(&self, _report: &mut RunReport) {}
}

/// The per-vCPU half of KVM's irqchip: KVM does everything.
pub struct KernelVcpuIrq;

impl VcpuIrq for KernelVcpuIrq {
    fn attach(&mut self, _cpu: &mut dyn CpuPort) {}

    fn before_entry(&mut self, _cpu: &mut dyn CpuPort) -> Entry {
        Entry::Enter
    }

    fn after_run(&mut self, _cr8: Option<u64>) {}

    fn handle_exit<'a>(&mut self, exit: VcpuExit<'a>) -> Result<ChipExit, VcpuExit<'a>> {
        Err(exit)
    }

    fn exit_done(&mut self, _cpu: &mut dyn CpuPort) {}

    fn halted(&mut self, _cpu: &mut dyn CpuPort) -> HaltEnd {
        // KVM handles HLT in the kernel; a HLT exit here would be KVM's bug: resume.
        HaltEnd::Resume
    }

    fn wait_for_sipi(&mut self, _cpu: &mut dyn CpuPort) -> Option<u8> {
        None
    }

    fn detach(&mut self, _cpu: &mut dyn CpuPort) {}
}

/// Interrupt lines driven through KVM's in-kernel irqchip.
pub struct KvmIrqLines {
    vm: Arc<VmFd>,
    failed: LogLimiter,
}

impl IrqLines for KvmIrqLines {
    fn set_level(&self, line: u32, asserted: bool) {
        if let Err(e) = self.vm.set_irq_line(line, asserted) {
            if let Some(n) = self.failed.hit() {
                tracing::warn!("KVM_IRQ_LINE {line} = {asserted} failed: {e} ({n} so far)");
            }
        }
    }
}
