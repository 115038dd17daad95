//! The test-exit port (QEMU's `isa-debug-exit` semantics) and the boot-time marker port.

use crate::pio::{MachineRequest, PioDevice};

/// Port of the test-exit device.
pub const TEST_EXIT_PORT: u16 = 0xf4;
/// Ports spanned by the test-exit device (1-, 2- and 4-byte writes).
pub const TEST_EXIT_PORT_COUNT: u16 = 4;
/// Port of the boot-time marker (Firecracker's convention).
pub const BOOT_MARKER_PORT: u16 = 0x3f0;
/// The byte a guest writes to the marker port when it has booted.
pub const BOOT_MARKER_MAGIC: u8 = 123;

/// Ends the run: a write of `v` makes lull exit with `((v << 1) | 1) & 0xff`.
#[derive(Debug, Default)]
pub struct TestExit;

impl TestExit {
    /// The process exit status for a written value.
    pub fn status_for(value: u32) -> u8 {
        // Truncation to the low 8 bits is the documented behaviour, as a process status has 8.
        (((value << 1) | 1) & 0xff) as u8
    }
}

impl PioDevice for TestExit {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<MachineRequest> {
        if offset != 0 || !matches!(data.len(), 1 | 2 | 4) {
            return None;
        }
        let value = data
            .iter()
            .rev()
            .fold(0u32, |acc, byte| (acc << 8) | u32::from(*byte));
        Some(MachineRequest::Exit(Self::status_for(value)))
    }
}

/// Boot-time marker: writing [`BOOT_MARKER_MAGIC`] reports that the guest booted.
#[derive(Debug, Default)]
pub struct BootMarker;

impl PioDevice for BootMarker {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u16, data: &[u8]) -> Option<MachineRequest> {
        (data.first() == Some(&BOOT_MARKER_MAGIC)).then_some(MachineRequest::BootComplete)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_follows_qemu() {
        let mut dev = TestExit;
        assert_eq!(dev.write(0, &[0]), Some(MachineRequest::Exit(1)));
        assert_eq!(dev.write(0, &[3]), Some(MachineRequest::Exit(7)));
        assert_eq!(dev.write(0, &[0x10, 0]), Some(MachineRequest::Exit(0x21)));
        assert_eq!(
            dev.write(0, &[0x7f, 0, 0, 0]),
            Some(MachineRequest::Exit(0xff))
        );
        assert_eq!(dev.write(0, &[0x80]), Some(MachineRequest::Exit(1)));
        assert_eq!(dev.write(0, &[1, 2, 3]), None);
        assert_eq!(dev.write(1, &[1]), None);
    }

    #[test]
    fn boot_marker_needs_magic() {
        let mut dev = BootMarker;
        assert_eq!(dev.write(0, &[123]), Some(MachineRequest::BootComplete));
        assert_eq!(dev.write(0, &[1]), None);
    }
}
