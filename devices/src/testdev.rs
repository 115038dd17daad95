//! The IRQ-line block of QEMU's `pc-testdev`: a byte write of 1 to port `0x2000 + n` raises
//! interrupt line `n`, a write of 0 lowers it. kvm-unit-tests' IOAPIC tests drive IOAPIC
//! inputs this way (`set_irq_line`).
//!
//! The device only knows lines by number; the VMM gives it an [`IrqLines`] that reaches the
//! interrupt controller (KVM's IOAPIC, or lull's own), so this crate needs no KVM.

use std::sync::Arc;

use crate::pio::{MachineRequest, PioDevice};

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
