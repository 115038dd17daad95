//! System Control Port A (port 0x92, the "fast A20 and reset" port of PS/2-era PCs): bit 0
//! written as 1 resets the machine at once, bit 1 is the A20 gate. Guests that know no other
//! way reset through it (kvm-unit-tests, some boot loaders); QEMU models it the same way.
//!
//! Reads return the last value written with bit 0 clear (the reset bit reads 0 once the
//! reset is done); at power-on bit 1 is set, as a BIOS leaves A20 enabled. lull never masks
//! address line 20, so bit 1 is only stored and read back.

use crate::pio::{MachineRequest, PioDevice};

/// The port.
pub const PORT: u16 = 0x92;
/// Bit 0: fast reset.
const FAST_RESET: u8 = 1 << 0;
/// Bit 1: A20 gate enabled.
const A20: u8 = 1 << 1;

/// System Control Port A.
#[derive(Debug)]
pub struct SystemControlA {
    value: u8,
}

impl Default for SystemControlA {
    fn default() -> Self {
        Self { value: A20 }
    }
}

impl PioDevice for SystemControlA {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = self.value;
        }
    }

    fn write(&mut self, _offset: u16, data: &[u8]) -> Option<MachineRequest> {
        let value = *data.first()?;
        self.value = value & !FAST_RESET;
        (value & FAST_RESET != 0).then_some(MachineRequest::Reset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(dev: &mut SystemControlA) -> u8 {
        let mut b = [0xaa];
        dev.read(0, &mut b);
        b[0]
    }

    #[test]
    fn bit_0_resets_and_reads_back_clear() {
        let mut dev = SystemControlA::default();
        assert_eq!(read(&mut dev), A20, "A20 on at power-on");
        assert_eq!(dev.write(0, &[0x00]), None);
        assert_eq!(read(&mut dev), 0);
        assert_eq!(dev.write(0, &[0x03]), Some(MachineRequest::Reset));
        assert_eq!(read(&mut dev), 0x02, "last value, bit 0 clear");
        assert_eq!(dev.write(0, &[0x42]), None);
        assert_eq!(read(&mut dev), 0x42);
        assert_eq!(dev.write(0, &[]), None);
    }
}
