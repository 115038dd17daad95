//! Guest-facing devices of lull: pure register models, no threads, no `unsafe`.
//!
//! Each device is a plain struct with register read/write methods. Port I/O devices implement
//! [`pio::PioDevice`] and sit on a [`pio::PioBus`]; MMIO devices outside the interrupt
//! controllers implement [`mmio::MmioDevice`] and sit on an [`mmio::MmioBus`]. Virtio devices
//! ([`virtio`]) reach guest memory through `vm-memory`'s `GuestMemory` trait.
#![forbid(unsafe_code)]

pub mod cmos;
pub mod fw_cfg;
pub mod i8042;
pub mod ioapic;
pub mod lapic;
pub mod mmio;
pub mod pio;
pub mod port92;
pub mod rate_limiter;
pub mod restore_count;
pub mod serial;
pub mod test_exit;
pub mod testdev;
pub mod virtio;
