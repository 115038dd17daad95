//! QEMU's devices for hypervisor test images, as kvm-unit-tests run them with `-kernel`:
//! `fw_cfg` (ports 0x510-0x511) and the port parts of `pc-testdev` (IRQ lines at 0x2000 + n,
//! the scratch register at 0xe0-0xeb).
//! The test-exit port (0xf4) is on the bus already (`devices::test_exit`).
//!
//! The IRQ lines reach KVM's IOAPIC (`KVM_IRQ_LINE` on GSI n, KVM's default routing sends GSI
//! n to IOAPIC input n) with `--irqchip kernel`, and lull's IOAPIC with `--irqchip user`.

use std::sync::{Arc, Mutex};

use devices::fw_cfg::{FwCfg, FW_CFG_PORT, FW_CFG_PORT_COUNT};
use devices::pio::{PioBus, PioBusError};
use devices::testdev::{
    IrqLinePorts, IrqLines, ScratchPorts, IRQ_LINE_COUNT, IRQ_LINE_PORT, SCRATCH_PORT,
    SCRATCH_PORT_COUNT,
};
use kvm_ioctls::VmFd;

use crate::irqchip::router::InterruptRouter;
use crate::ratelimit::LogLimiter;

/// Interrupt lines driven through KVM's in-kernel irqchip.
pub struct KvmIrqLines {
    vm: Arc<VmFd>,
    failed: LogLimiter,
}

impl KvmIrqLines {
    /// Lines of `vm`'s in-kernel irqchip.
    pub fn new(vm: Arc<VmFd>) -> Self {
        Self {
            vm,
            failed: LogLimiter::new(),
        }
    }
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

/// Interrupt lines driven into lull's IOAPIC (`--irqchip user`).
pub struct UserIrqLines(pub Arc<InterruptRouter>);

impl IrqLines for UserIrqLines {
    fn set_level(&self, line: u32, asserted: bool) {
        if let Ok(pin) = usize::try_from(line) {
            self.0.set_irq_line(pin, asserted);
        }
    }
}

/// Puts fw_cfg (reporting `cpus` and `memory`), the scratch ports and the IRQ-line ports
/// driving `lines` on `bus`.
pub fn add_to_bus(
    bus: &mut PioBus,
    cpus: u32,
    memory: u64,
    lines: Arc<dyn IrqLines>,
) -> Result<(), PioBusError> {
    let cpus = u16::try_from(cpus).unwrap_or(u16::MAX);
    bus.insert(
        FW_CFG_PORT,
        FW_CFG_PORT_COUNT,
        Arc::new(Mutex::new(FwCfg::new(cpus, memory))),
    )?;
    bus.insert(
        SCRATCH_PORT,
        SCRATCH_PORT_COUNT,
        Arc::new(Mutex::new(ScratchPorts::default())),
    )?;
    bus.insert(
        IRQ_LINE_PORT,
        IRQ_LINE_COUNT,
        Arc::new(Mutex::new(IrqLinePorts::new(lines))),
    )
}
