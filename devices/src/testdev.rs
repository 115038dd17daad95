//! The port parts of QEMU's `pc-testdev`, which kvm-unit-tests use:
//! - IRQ lines: a byte write of 1 to port `0x2000 + n` raises interrupt line `n`, a write of 0
//!   lowers it (the IOAPIC tests' `set_irq_line`);
//! - a 32-bit scratch register at ports `0xe0-0xe3`, also reachable byte by byte at
//!   `0xe8-0xeb` (the emulator test's string I/O), and `0xe4-0xe7`, whose writes ask QEMU to
//!   flush a page and are accepted and ignored here ([`ScratchPorts`]).
//!
//! The device only knows lines by number; the VMM gives it an [`IrqLines`] that reaches the
//! interrupt controller (KVM's IOAPIC, or lull's own), so this crate needs no KVM.

use std::sync::Arc;

use crate::pio::{MachineRequest, PioDevice};

/// First port of the scratch register (`0xe0`), flush (`0xe4`) and byte-wise scratch (`0xe8`).
pub const SCRATCH_PORT: u16 = 0xe0;
/// Ports spanned from [`SCRATCH_PORT`].
pub const SCRATCH_PORT_COUNT: u16 = 12;

/// pc-testdev's scratch register: ports `0xe0-0xe3` and `0xe8-0xeb` both read and write the
/// same 4 little-endian bytes, at any access size; ports `0xe4-0xe7` (page flush) read 0 and
/// ignore writes.
#[derive(Debug, Default, Clone)]
pub struct ScratchPorts {
    data: [u8; 4],
}

impl ScratchPorts {
    /// The register's byte index for `offset`, if the port belongs to it.
    fn index(offset: u16) -> Option<usize> {
        match offset {
            0..=3 => Some(usize::from(offset)),
            8..=11 => Some(usize::from(offset - 8)),
            _ => None,
        }
    }
}

impl PioDevice for ScratchPorts {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        match Self::index(offset) {
            Some(i) => data.iter_mut().enumerate().for_each(|(k, b)| {
                *b = self.data.get(i + k).copied().unwrap_or(0);
            }),
            None => data.fill(0),
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<MachineRequest> {
        if let Some(i) = Self::index(offset) {
            for (slot, byte) in self.data.iter_mut().skip(i).zip(data) {
                *slot = *byte;
            }
        }
        None
    }
}

/// First port of the IRQ-line block.
pub const IRQ_LINE_PORT: u16 = 0x2000;
/// Lines (and ports) in the block: the IOAPIC's 24 inputs.
pub const IRQ_LINE_COUNT: u16 = 24;

/// Something that drives interrupt controller input lines.
pub trait IrqLines: Send + Sync {
    /// Sets input `line` to `asserted`.
    fn set_level(&self, line: u32, asserted: bool);
}

/// The port block. Reads return 0; a write of any non-zero value raises the line.
pub struct IrqLinePorts {
    lines: Arc<dyn IrqLines>,
}

impl IrqLinePorts {
    /// Ports that drive `lines`.
    pub fn new(lines: Arc<dyn IrqLines>) -> Self {
        Self { lines }
    }
}

impl PioDevice for IrqLinePorts {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<MachineRequest> {
        if offset < IRQ_LINE_COUNT && !data.is_empty() {
            let asserted = data.iter().any(|b| *b != 0);
            self.lines.set_level(u32::from(offset), asserted);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(u32, bool)>>);
    impl IrqLines for Recorder {
        fn set_level(&self, line: u32, asserted: bool) {
            self.0.lock().unwrap().push((line, asserted));
        }
    }

    #[test]
    fn scratch_register_keeps_what_was_written() {
        let mut dev = ScratchPorts::default();
        dev.write(0, &0x1234_5678u32.to_le_bytes());
        let mut b = [0u8; 4];
        dev.read(0, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x1234_5678);
        let mut byte = [0u8];
        dev.read(8 + 3, &mut byte);
        assert_eq!(byte, [0x12]);
        dev.write(8 + 1, &[0xab]);
        let mut w = [0u8; 2];
        dev.read(0, &mut w);
        assert_eq!(w, [0x78, 0xab]);
        dev.read(2, &mut b); // past the end reads 0
        assert_eq!(b, [0x34, 0x12, 0, 0]);
        dev.write(4, &[9, 9, 9, 9]); // flush: ignored
        dev.read(4, &mut b);
        assert_eq!(b, [0; 4]);
    }

    #[test]
    fn writes_raise_and_lower_lines() {
        let rec = Arc::new(Recorder::default());
        let mut dev = IrqLinePorts::new(rec.clone());
        dev.write(14, &[1]);
        dev.write(14, &[0]);
        dev.write(3, &[0xff, 0, 0, 0]);
        dev.write(24, &[1]);
        let mut b = [0xffu8; 1];
        dev.read(0, &mut b);
        assert_eq!(b, [0]);
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec![(14, true), (14, false), (3, true)]
        );
    }
}
