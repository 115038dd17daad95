//! The VM's port-I/O devices and its serial console: the bus every vCPU thread dispatches
//! port exits to, built once before the vCPUs start.

use std::sync::{Arc, Mutex};

use devices::cmos::{Cmos, CMOS_PORT, CMOS_PORT_COUNT};
use devices::i8042::{self, I8042};
use devices::pio::{IgnoredPorts, PioBus, PioBusError};
use devices::port92::{self, SystemControlA};
use devices::restore_count::{RestoreCount, RESTORE_COUNT_PORT, RESTORE_COUNT_PORT_COUNT};
use devices::serial::{SerialPort, SerialSnapshot, COM1_IRQ, COM1_PORT, COM_PORT_COUNT};
use devices::test_exit::{
    BootMarker, TestExit, BOOT_MARKER_PORT, TEST_EXIT_PORT, TEST_EXIT_PORT_COUNT,
};
use timer::lock;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::error::VmError;
use super::test_devices;
use crate::config::{SerialMode, VmConfig};
use crate::host::console::ConsoleSink;
use crate::host::pty::Pty;
use crate::irqchip::{EdgeIrq, IrqChip};
use crate::snapshot::SnapshotError;

/// The serial console device.
pub type Console = SerialPort<EdgeIrq, ConsoleSink>;

/// The console and the eventfd its input-drained hook writes.
pub struct ConsoleParts {
    /// The device.
    pub console: Arc<Mutex<Console>>,
    /// Written when the guest has drained the console's input FIFO.
    pub drained: Arc<EventFd>,
}

/// Opens the console's sink (before anything else, so a bad `--serial file=` fails at once),
/// and with `--serial pty` the pseudo-terminal it writes to (the VM holds it for its life).
pub fn console_sink(mode: &SerialMode) -> Result<(ConsoleSink, Option<Pty>), VmError> {
    match mode {
        SerialMode::Stdio => Ok((ConsoleSink::Stdout(std::io::stdout()), None)),
        SerialMode::Off => Ok((ConsoleSink::Null, None)),
        SerialMode::File(path) => {
            ConsoleSink::file(path)
                .map(|sink| (sink, None))
                .map_err(|source| VmError::SerialFile {
                    path: path.clone(),
                    source,
                })
        }
        SerialMode::Pty => {
            let pty = Pty::open().map_err(VmError::SerialPty)?;
            tracing::info!("serial console on {}", pty.path().display());
            Ok((ConsoleSink::Pty(pty.main()), Some(pty)))
        }
    }
}

/// The serial console on COM1, its interrupt on `chip`; restored from `saved` if given (a
/// snapshot's).
pub fn console(
    chip: &dyn IrqChip,
    sink: ConsoleSink,
    saved: Option<&SerialSnapshot>,
) -> Result<ConsoleParts, VmError> {
    let irq = chip.edge_irq(COM1_IRQ)?;
    let port = match saved {
        None => SerialPort::new(irq, sink),
        Some(s) => SerialPort::from_saved(irq, sink, s).map_err(SnapshotError::from)?,
    };
    let console = Arc::new(Mutex::new(port));
    let drained = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(|source| VmError::Host {
        what: "the console's eventfd",
        source,
    })?);
    let hook = drained.clone();
    lock(&console).set_input_drained_hook(Box::new(move || {
        let _ = hook.write(1);
    }));
    Ok(ConsoleParts { console, drained })
}

/// Every port-I/O device of the VM; `restores`: how many times it has been restored (0: it
/// booted), for the restore-count port.
pub fn pio_bus(
    cfg: &VmConfig,
    console: Arc<Mutex<Console>>,
    chip: &dyn IrqChip,
    restores: u32,
) -> Result<PioBus, PioBusError> {
    pio_bus_with_cmos(cfg, console, chip, Cmos::with_host_clock(), restores)
}

/// [`pio_bus`] with the CMOS (RTC) given: the serial fuzz target's reads a clock chosen by its
/// input, so that an input replays the same way any day.
pub fn pio_bus_with_cmos(
    cfg: &VmConfig,
    console: Arc<Mutex<Console>>,
    chip: &dyn IrqChip,
    cmos: Cmos,
    restores: u32,
) -> Result<PioBus, PioBusError> {
    let mut bus = PioBus::new();
    bus.insert(COM1_PORT, COM_PORT_COUNT, console)?;
    bus.insert(0x60, i8042::PORT_COUNT, Arc::new(Mutex::new(I8042)))?;
    bus.insert(
        port92::PORT,
        1,
        Arc::new(Mutex::new(SystemControlA::default())),
    )?;
    bus.insert(
        TEST_EXIT_PORT,
        TEST_EXIT_PORT_COUNT,
        Arc::new(Mutex::new(TestExit)),
    )?;
    bus.insert(BOOT_MARKER_PORT, 1, Arc::new(Mutex::new(BootMarker)))?;
    bus.insert(
        RESTORE_COUNT_PORT,
        RESTORE_COUNT_PORT_COUNT,
        Arc::new(Mutex::new(RestoreCount::new(restores))),
    )?;
    bus.insert(CMOS_PORT, CMOS_PORT_COUNT, Arc::new(Mutex::new(cmos)))?;
    let ignored = Arc::new(Mutex::new(IgnoredPorts));
    bus.insert(0x40, 4, ignored.clone())?; // PIT: Linux stops it; lull has none
    bus.insert(0x80, 1, ignored.clone())?; // POST code / I/O delay

    // No 8259 PIC: its mask registers read 0, so Linux's probe finds no PIC and uses the
    // IOAPIC alone (with --irqchip kernel, KVM's PIC answers these ports before lull).
    bus.insert(0x20, 2, ignored.clone())?;
    bus.insert(0xa0, 2, ignored.clone())?;
    bus.insert(0x4d0, 2, ignored)?; // ELCR
    test_devices::add_to_bus(&mut bus, cfg.cpus, cfg.memory.0, chip.irq_lines())?;
    Ok(bus)
}
