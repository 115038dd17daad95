//! The MMIO bus: which device answers which guest-physical address outside RAM.
//!
//! KVM hands lull an MMIO exit for every access to an address that is neither RAM nor claimed
//! by an in-kernel device (with `--irqchip user`, lull's LAPIC and IOAPIC take theirs first).
//! The vCPU loop asks this bus for the rest; a device sees offsets from the start of its
//! window. Windows never overlap, and an access that straddles a window's end is unclaimed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device on the MMIO bus.
pub trait MmioDevice: Send {
    /// Guest read of `data.len()` bytes at `offset` from the start of the device's window.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Guest write of `data` at `offset` from the start of the device's window.
    fn write(&mut self, offset: u64, data: &[u8]);
    /// A timer the device asked for (through its `virtio::DeviceTimer`) fired.
    fn timer_fired(&mut self) {}
    /// While `on`, the device changes nothing on its own (a backend's poll, a timer): what
    /// came meanwhile is served when it is turned off. A paused VM's devices are quiesced, so
    /// that their state and guest memory stay as the snapshot takes them.
    fn quiesce(&mut self, _on: bool) {}
}

/// A shared, lockable device on the bus.
pub type SharedMmioDevice = Arc<Mutex<dyn MmioDevice>>;

/// Errors when building the bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MmioBusError {
    /// The window is empty or wraps past the end of the address space.
    #[error("MMIO window {base:#x}+{len:#x} is empty or wraps past the end of the address space")]
    BadRange {
        /// First address.
        base: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Two devices claim the same address.
    #[error("MMIO window {base:#x}+{len:#x} overlaps a device already on the bus")]
    Overlap {
        /// First address.
        base: u64,
        /// Length in bytes.
        len: u64,
    },
}

/// Maps guest-physical windows to devices, keyed by the window's first address.
#[derive(Default)]
pub struct MmioBus {
    windows: BTreeMap<u64, (u64, SharedMmioDevice)>,
}

impl MmioBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `device` on `base..base + len`.
    pub fn insert(
        &mut self,
        base: u64,
        len: u64,
        device: SharedMmioDevice,
    ) -> Result<(), MmioBusError> {
        let Some(end) = base.checked_add(len).filter(|_| len > 0) else {
            return Err(MmioBusError::BadRange { base, len });
        };
        let below = self.windows.range(..end).next_back();
        if below.is_some_and(|(&b, &(l, _))| b + l > base) {
            return Err(MmioBusError::Overlap { base, len });
        }
        self.windows.insert(base, (len, device));
        Ok(())
    }

    /// The device whose window holds all of `addr..addr + size`, and the offset into it.
    fn find(&self, addr: u64, size: usize) -> Option<(&SharedMmioDevice, u64)> {
        let (&base, (len, device)) = self.windows.range(..=addr).next_back()?;
        let offset = addr - base;
        let end = offset.checked_add(u64::try_from(size).ok()?)?;
        (end <= *len).then_some((device, offset))
    }

    /// Every device, by window base, lowest first.
    pub fn devices(&self) -> impl Iterator<Item = (u64, &SharedMmioDevice)> {
        self.windows
            .iter()
            .map(|(&base, (_, device))| (base, device))
    }

    /// Guest read at `addr`; false if no device owns it (then `data` is all ones).
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((device, offset)) => {
                timer::lock(device).read(offset, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    /// Guest write at `addr`; false if no device owns it (the write is dropped).
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((device, offset)) => {
                timer::lock(device).write(offset, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder(Vec<(u64, Vec<u8>)>);
    impl MmioDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(u8::try_from(offset).unwrap_or(0xee));
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn routes_by_window_and_offset() {
        let mut bus = MmioBus::new();
        let rec = Arc::new(Mutex::new(Recorder::default()));
        bus.insert(0xd000_0000, 0x1000, rec.clone()).unwrap();
        let mut b = [0u8; 4];
        assert!(bus.read(0xd000_0010, &mut b));
        assert_eq!(b, [0x10; 4]);
        assert!(bus.write(0xd000_0ffc, &[1, 2, 3, 4]));
        assert_eq!(rec.lock().unwrap().0, vec![(0xffc, vec![1, 2, 3, 4])]);
        // Straddling the end, below the start, past the end: unclaimed.
        assert!(!bus.write(0xd000_0ffe, &[1, 2, 3, 4]));
        assert!(!bus.read(0xcfff_fffc, &mut b));
        assert_eq!(b, [0xff; 4]);
        assert!(!bus.read(0xd000_1000, &mut b));
    }

    #[test]
    fn rejects_overlap_and_bad_ranges() {
        let mut bus = MmioBus::new();
        let dev = || Arc::new(Mutex::new(Recorder::default()));
        bus.insert(0x1000, 0x1000, dev()).unwrap();
        assert_eq!(
            bus.insert(0x1800, 0x1000, dev()),
            Err(MmioBusError::Overlap {
                base: 0x1800,
                len: 0x1000
            })
        );
        assert!(bus.insert(0x0800, 0x1000, dev()).is_err());
        assert!(bus.insert(0x0, 0x0, dev()).is_err());
        assert!(bus.insert(u64::MAX, 2, dev()).is_err());
        bus.insert(0x2000, 0x1000, dev()).unwrap();
        bus.insert(0x0, 0x1000, dev()).unwrap();
    }
}
