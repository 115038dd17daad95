//! The part of the i8042 keyboard controller a guest uses to reset the machine.
//!
//! Linux with `reboot=k` (and after `panic=-1`) writes the command 0xFE ("pulse the reset line")
//! to port 0x64. Everything else reads as an empty controller: status 0, no data.

use crate::pio::{MachineRequest, PioDevice};

/// Offset of the command/status port (0x64) from the data port (0x60).
pub const COMMAND_OFFSET: u16 = 4;
/// Number of ports the device spans starting at 0x60.
pub const PORT_COUNT: u16 = 5;
/// The "pulse output line 0" command that resets the CPU.
const CMD_RESET_CPU: u8 = 0xfe;

/// i8042 at ports 0x60..=0x64 (port B, 0x61, is answered elsewhere in lull's bus).
#[derive(Debug, Default)]
pub struct I8042;

impl PioDevice for I8042 {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<MachineRequest> {
        (offset == COMMAND_OFFSET && data.first() == Some(&CMD_RESET_CPU))
            .then_some(MachineRequest::Reset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command_resets_and_others_do_nothing() {
        let mut dev = I8042;
        assert_eq!(
            dev.write(COMMAND_OFFSET, &[0xfe]),
            Some(MachineRequest::Reset)
        );
        assert_eq!(dev.write(COMMAND_OFFSET, &[0xd1]), None);
        assert_eq!(dev.write(0, &[0xfe]), None);
        let mut b = [0xaa];
        dev.read(COMMAND_OFFSET, &mut b);
        assert_eq!(b, [0]);
    }
}
