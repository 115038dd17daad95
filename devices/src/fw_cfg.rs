//! QEMU's firmware configuration device (`fw_cfg`), the legacy port interface: a 16-bit
//! selector at `0x510` picks an item, byte reads at `0x511` return its bytes one after the
//! other. Test images (kvm-unit-tests' `fwcfg_get_nb_cpus`, ...) read the CPU count and RAM
//! size this way.
//!
//! Items lull provides (little-endian, as QEMU): `0x00` signature `"QEMU"`, `0x01` interface
//! id (1: the port interface, no DMA), `0x03` RAM size (8 bytes), `0x05` CPU count (2 bytes),
//! `0x0f` maximum CPU count (2 bytes). Any other item, and reads past an item's end, read as
//! zeros (so the file directory, `0x19`, is an empty one).
//!
//! ```
//! use devices::fw_cfg::{FwCfg, FW_CFG_NB_CPUS};
//! use devices::pio::PioDevice;
//!
//! let mut dev = FwCfg::new(4, 256 << 20);
//! dev.write(0, &FW_CFG_NB_CPUS.to_le_bytes());
//! let (mut lo, mut hi) = ([0u8], [0u8]);
//! dev.read(1, &mut lo);
//! dev.read(1, &mut hi);
//! assert_eq!(u16::from_le_bytes([lo[0], hi[0]]), 4);
//! ```

use crate::pio::{MachineRequest, PioDevice};

/// First port of the device (selector; the data port follows).
pub const FW_CFG_PORT: u16 = 0x510;
/// Ports spanned: selector (`0x510`, 16-bit) and data (`0x511`).
pub const FW_CFG_PORT_COUNT: u16 = 2;
/// Item: the signature "QEMU".
pub const FW_CFG_SIGNATURE: u16 = 0x00;
/// Item: interface revision / feature bits (bit 0: traditional port interface).
pub const FW_CFG_ID: u16 = 0x01;
/// Item: RAM size in bytes (u64).
pub const FW_CFG_RAM_SIZE: u16 = 0x03;
/// Item: number of CPUs booted (u16).
pub const FW_CFG_NB_CPUS: u16 = 0x05;
/// Item: maximum number of CPUs (u16).
pub const FW_CFG_MAX_CPUS: u16 = 0x0f;

/// The fw_cfg register model. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct FwCfg {
    cpus: u16,
    memory: u64,
    selector: u16,
    offset: usize,
}

impl FwCfg {
    /// A device that reports `cpus` CPUs and `memory` bytes of RAM.
    pub fn new(cpus: u16, memory: u64) -> Self {
        Self {
            cpus,
            memory,
            selector: FW_CFG_SIGNATURE,
            offset: 0,
        }
    }

    /// The bytes of item `key` (empty for items lull does not have).
    pub fn item(&self, key: u16) -> Vec<u8> {
        match key {
            FW_CFG_SIGNATURE => b"QEMU".to_vec(),
            FW_CFG_ID => 1u32.to_le_bytes().to_vec(),
            FW_CFG_RAM_SIZE => self.memory.to_le_bytes().to_vec(),
            FW_CFG_NB_CPUS | FW_CFG_MAX_CPUS => self.cpus.to_le_bytes().to_vec(),
            _ => Vec::new(),
        }
    }

    fn next_byte(&mut self) -> u8 {
        let byte = self
            .item(self.selector)
            .get(self.offset)
            .copied()
            .unwrap_or(0);
        self.offset = self.offset.saturating_add(1);
        byte
    }
}

impl PioDevice for FwCfg {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        match offset {
            1 => data.iter_mut().for_each(|b| *b = self.next_byte()),
            _ => data.fill(0),
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<MachineRequest> {
        // The selector takes a 16-bit write; selecting an item rewinds its offset.
        if let (0, [lo, hi]) = (offset, data) {
            self.selector = u16::from_le_bytes([*lo, *hi]);
            self.offset = 0;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_item(dev: &mut FwCfg, key: u16, len: usize) -> Vec<u8> {
        dev.write(0, &key.to_le_bytes());
        (0..len)
            .map(|_| {
                let mut b = [0u8];
                dev.read(1, &mut b);
                b[0]
            })
            .collect()
    }

    #[test]
    fn items_read_bytewise_and_unknown_keys_are_zero() {
        let mut dev = FwCfg::new(3, 0x0012_3456_789a);
        assert_eq!(read_item(&mut dev, FW_CFG_SIGNATURE, 6), b"QEMU\0\0");
        assert_eq!(read_item(&mut dev, FW_CFG_NB_CPUS, 2), [3, 0]);
        assert_eq!(read_item(&mut dev, FW_CFG_MAX_CPUS, 2), [3, 0]);
        assert_eq!(read_item(&mut dev, FW_CFG_ID, 4), [1, 0, 0, 0]);
        assert_eq!(
            read_item(&mut dev, FW_CFG_RAM_SIZE, 8),
            0x0012_3456_789a_u64.to_le_bytes()
        );
        assert_eq!(read_item(&mut dev, 0x19, 4), [0; 4]);
        assert_eq!(read_item(&mut dev, 0x7fff, 3), [0; 3]);
        // Reselecting rewinds; a byte write to the selector is ignored.
        assert_eq!(read_item(&mut dev, FW_CFG_SIGNATURE, 1), b"Q");
        dev.write(0, &[5]);
        let mut b = [0u8; 2];
        dev.read(1, &mut b);
        assert_eq!(&b, b"EM");
    }
}
