//! `--irqchip kernel`: KVM's in-kernel LAPIC, IOAPIC and PIC, the industry baseline lull is
//! measured against. KVM handles HLT, interrupt injection, INIT/SIPI and the LAPIC timer
//! itself, so the per-vCPU half has nothing to do; devices reach the chip through an irqfd
//! (the serial port) or `KVM_IRQ_LINE` (pc-testdev's lines; KVM's default routing sends GSI
//! n to IOAPIC input n).

use std::sync::{Arc, Mutex};

use devices::testdev::IrqLines;
use kvm_ioctls::{VcpuExit, VmFd};
use timer::lock;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{ChipExit, CpuPort, EdgeIrq, Entry, HaltEnd, IrqChip, IrqChipError, VcpuIrq};
use crate::metrics::RunReport;
use crate::ratelimit::LogLimiter;
use crate::state::VcpuShared;

/// KVM's in-kernel irqchip of one VM (created with the VM).
pub struct KernelIrqChip {
    vm: Arc<VmFd>,
    lines: Arc<KvmIrqLines>,
    /// Thread ids of the vCPU threads, to kick them out of KVM_RUN at stop.
    vcpu_threads: Arc<Mutex<Vec<libc::pid_t>>>,
}

impl KernelIrqChip {
    /// The chip of `vm`, whose in-kernel irqchip exists already.
    pub fn new(vm: Arc<VmFd>) -> Result<Self, IrqChipError> {
        crate::host::sys::kick::install_handler().map_err(|e| IrqChipError::Host {
            what: "the kick signal handler",
            source: std::io::Error::from_raw_os_error(e.errno()),
        })?;
        Ok(Self {
            lines: Arc::new(KvmIrqLines {
                vm: vm.clone(),
                failed: LogLimiter::new(),
            }),
            vm,
            vcpu_threads: Arc::default(),
        })
    }
}

impl IrqChip for KernelIrqChip {
    fn name(&self) -> &'static str {
        "kernel"
    }

    fn vcpu(&self, _id: u32, _shared: &Arc<VcpuShared>) -> Result<Box<dyn VcpuIrq>, IrqChipError> {
        Ok(Box::new(KernelVcpuIrq {
            threads: self.vcpu_threads.clone(),
        }))
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

    fn start(&self, _shared: &Arc<VcpuShared>) -> Result<(), IrqChipError> {
        Ok(())
    }

    fn kick_all(&self) {
        // Out of KVM_RUN (the kick's handler sets immediate_exit): each sees the stop.
        for &tid in lock(&self.vcpu_threads).iter() {
            crate::host::sys::kick::kick_thread(tid);
        }
    }

    fn kick_to_pause(&self) {
        self.kick_all();
    }

    // KVM's own clocks (its LAPIC timers, kvmclock) are the VM's business: `vm::pause_resume`.
    fn paused(&self, _monotonic: u64) {}

    fn resuming(&self, _paused_ns: u64) {}

    fn report(&self, _report: &mut RunReport) {}
}

/// The per-vCPU half of KVM's irqchip: KVM does everything; lull only kicks it at stop.
pub struct KernelVcpuIrq {
    threads: Arc<Mutex<Vec<libc::pid_t>>>,
}

impl VcpuIrq for KernelVcpuIrq {
    fn attach(&mut self, cpu: &mut dyn CpuPort) {
        cpu.register_kick();
        lock(&self.threads).push(crate::host::sys::kick::current_tid());
    }

    fn before_entry(&mut self, _cpu: &mut dyn CpuPort) -> Entry {
        Entry::Enter
    }

    fn after_run(&mut self, _cr8: Option<u64>) {}

    fn handle_exit<'a>(&mut self, exit: VcpuExit<'a>) -> Result<ChipExit, VcpuExit<'a>> {
        Err(exit)
    }

    fn exit_done(&mut self, cpu: &mut dyn CpuPort) {
        cpu.clear_immediate_exit();
    }

    fn halted(&mut self, _cpu: &mut dyn CpuPort) -> HaltEnd {
        // KVM handles HLT in the kernel; a HLT exit here would be KVM's bug: resume.
        HaltEnd::Resume
    }

    fn wait_for_sipi(&mut self, _cpu: &mut dyn CpuPort) -> Option<u8> {
        None
    }

    fn detach(&mut self, cpu: &mut dyn CpuPort) {
        let tid = crate::host::sys::kick::current_tid();
        lock(&self.threads).retain(|&t| t != tid);
        cpu.unregister_kick();
    }
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
