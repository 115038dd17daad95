//! QEMU's devices for hypervisor test images, as kvm-unit-tests run them with `-kernel`:
//! `fw_cfg` (ports 0x510-0x511) and the port parts of `pc-testdev` (IRQ lines at 0x2000 + n,
//! the scratch register at 0xe0-0xeb).
//! The test-exit port (0xf4) is on the bus already (`devices::test_exit`).
//!
//! The IRQ lines reach the irqchip's IOAPIC (`IrqChip::irq_lines`): KVM's with `--irqchip
//! kernel`, lull's with `--irqchip user`.

use std::sync::{Arc, Mutex};

use devices::fw_cfg::{FwCfg, FW_CFG_PORT, FW_CFG_PORT_COUNT};
use devices::pio::{PioBus, PioBusError};
use devices::testdev::{
    IrqLinePorts, IrqLines, ScratchPorts, IRQ_LINE_COUNT, IRQ_LINE_PORT, SCRATCH_PORT,
    SCRATCH_PORT_COUNT,
};

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
