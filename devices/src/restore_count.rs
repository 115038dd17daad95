//! The restore-count port: a read-only 32-bit register (little-endian, ports 0xf8-0xfb) that
//! tells the guest how many times its VM has been restored from a snapshot: 0 in a VM that
//! booted, one more than the snapshot's VM in a restored one.
//!
//! A snapshot catches a guest mid-measurement, and its clones may resume it minutes later: on
//! hosts where guest time runs on across a snapshot (the TSC cannot be moved back), every
//! timer the guest had armed fires at the resume, late by the whole gap. A guest workload
//! that reads this port when a timer comes very late (and now and then otherwise) learns that
//! the gap was a restore, not the host's doing, and starts its measurement again
//! (`resources/linux/lull_workload.c`). Reading it costs one port-I/O exit; writes are
//! ignored. Under another VMM the port is unclaimed and reads as all ones.

use crate::pio::{MachineRequest, PioDevice};

/// First port of the register.
pub const RESTORE_COUNT_PORT: u16 = 0xf8;
/// Ports spanned by the register (1-, 2- and 4-byte reads at any offset within).
pub const RESTORE_COUNT_PORT_COUNT: u16 = 4;

/// How many times the VM has been restored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreCount {
    count: u32,
}

impl RestoreCount {
    /// The register of a VM restored `count` times (0: it booted).
    pub fn new(count: u32) -> Self {
        Self { count }
    }
}

impl PioDevice for RestoreCount {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        let bytes = self.count.to_le_bytes();
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = usize::from(offset)
                .checked_add(i)
                .and_then(|at| bytes.get(at))
                .copied()
                .unwrap_or(0xff);
        }
    }

    fn write(&mut self, _offset: u16, _data: &[u8]) -> Option<MachineRequest> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_count_little_endian_at_any_offset() {
        let mut dev = RestoreCount::new(0x0403_0201);
        let mut four = [0u8; 4];
        dev.read(0, &mut four);
        assert_eq!(u32::from_le_bytes(four), 0x0403_0201);
        let mut two = [0u8; 2];
        dev.read(2, &mut two);
        assert_eq!(two, [0x03, 0x04]);
        // Past the register: all ones, as an unclaimed port.
        dev.read(3, &mut two);
        assert_eq!(two, [0x04, 0xff]);
    }

    #[test]
    fn a_booted_vm_reads_zero_and_writes_change_nothing() {
        let mut dev = RestoreCount::default();
        assert_eq!(dev.write(0, &[7, 7, 7, 7]), None);
        let mut four = [0xaau8; 4];
        dev.read(0, &mut four);
        assert_eq!(four, [0; 4]);
    }
}
