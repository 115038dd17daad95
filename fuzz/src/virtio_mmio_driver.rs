//! What the `virtio_blk` and `virtio_net` drivers share: the guest memory they build queues in,
//! the virtio-mmio registers worth hitting, and the recorder of the device's interrupt line.

use std::sync::Mutex;

use devices::testdev::IrqLines;
use devices::virtio::mmio::VirtioMmio;
use devices::virtio::VirtioDevice;
use vm_memory::GuestMemory;

/// Guest memory of a driven device: queues, buffers and the area inputs poke.
pub const MEM_SIZE: usize = 0x10000;
/// The device's interrupt line.
pub const LINE: u32 = 5;
/// `FEATURES_OK` in the status register.
pub const FEATURES_OK: u32 = 8;
/// `VIRTIO_F_VERSION_1` as a feature bit.
pub const VERSION_1: u64 = 1 << 32;

/// Register offsets worth hitting more often than a random one.
pub const REGISTERS: [u16; 22] = [
    0x000, 0x004, 0x008, 0x010, 0x014, 0x020, 0x024, 0x030, 0x034, 0x038, 0x044, 0x050, 0x060,
    0x064, 0x070, 0x080, 0x084, 0x090, 0x094, 0x0a0, 0x0a4, 0x100,
];

/// Records the line's levels.
#[derive(Default)]
pub struct Line(pub Mutex<Vec<bool>>);

impl IrqLines for Line {
    fn set_level(&self, line: u32, asserted: bool) {
        assert_eq!(line, LINE, "the device drove a line that is not its own");
        timer::lock(&self.0).push(asserted);
    }
}

/// `value` little-endian, its bytes repeated to `len` (an access of any width).
pub fn le(value: u64, len: usize) -> Vec<u8> {
    value
        .to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

/// The transport's invariants after a step: the line is high exactly while InterruptStatus is
/// not zero and only ever changes level; FEATURES_OK stands only for an offered feature set
/// that includes VERSION_1.
pub fn check_transport<D: VirtioDevice, M: GuestMemory>(transport: &VirtioMmio<D, M>, line: &Line) {
    let levels = timer::lock(&line.0);
    assert_eq!(
        levels.last().copied().unwrap_or(false),
        transport.interrupt_pending(),
        "the line does not follow InterruptStatus"
    );
    assert!(
        levels.windows(2).all(|w| w[0] != w[1]),
        "the line was driven to the level it had"
    );
    if transport.status() & FEATURES_OK != 0 {
        let accepted = transport.driver_features();
        let offered = transport.device().features();
        assert_eq!(
            accepted & !offered,
            0,
            "FEATURES_OK with unoffered features"
        );
        assert_ne!(accepted & VERSION_1, 0, "FEATURES_OK without VERSION_1");
    }
}
