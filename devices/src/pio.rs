//! The port I/O bus: which device answers which guest I/O port.
//!
//! Devices implement [`PioDevice`]; the bus maps port ranges to them. The vCPU loop asks the bus
//! and never hard-codes a port. A write may ask the VMM to do something to the whole machine
//! (reset it, end the run); that comes back as a [`MachineRequest`].

use std::sync::{Arc, Mutex};

use timer::lock;

/// Something a guest's port write asks of the whole machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineRequest {
    /// Reset the machine (i8042 pulse of the reset line). lull ends the run with status 0.
    Reset,
    /// End the run with this process exit status (test-exit port).
    Exit(u8),
    /// The guest says it finished booting (boot-time marker port).
    BootComplete,
}

/// A device on the port I/O bus.
pub trait PioDevice: Send {
    /// Guest read of `data.len()` bytes at `offset` from the start of the device's range.
    fn read(&mut self, offset: u16, data: &mut [u8]);
    /// Guest write of `data` at `offset` from the start of the device's range.
    fn write(&mut self, offset: u16, data: &[u8]) -> Option<MachineRequest>;
}

/// A shared, lockable device on the bus.
pub type SharedPioDevice = Arc<Mutex<dyn PioDevice>>;

/// What happened to one access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PioOutcome {
    /// A device took the access.
    Handled(Option<MachineRequest>),
    /// No device owns the port: reads return all ones, writes are dropped.
    Unclaimed,
}

/// Errors when building the bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PioBusError {
    /// The port range is empty or wraps past 0xffff.
    #[error("Port range {base:#x}+{len} is empty or wraps past 0xffff")]
    BadRange {
        /// First port.
        base: u16,
        /// Number of ports.
        len: u16,
    },
    /// Two devices claim the same port.
    #[error("Port range {base:#x}+{len} overlaps a device already on the bus")]
    Overlap {
        /// First port.
        base: u16,
        /// Number of ports.
        len: u16,
    },
}

struct Entry {
    base: u16,
    len: u16,
    device: SharedPioDevice,
}

/// Maps guest I/O port ranges to devices.
#[derive(Default)]
pub struct PioBus {
    entries: Vec<Entry>,
}

impl PioBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `device` on ports `base..base + len`.
    pub fn insert(
        &mut self,
        base: u16,
        len: u16,
        device: SharedPioDevice,
    ) -> Result<(), PioBusError> {
        if len == 0 || base.checked_add(len - 1).is_none() {
            return Err(PioBusError::BadRange { base, len });
        }
        let end = u32::from(base) + u32::from(len);
        let overlaps = self.entries.iter().any(|e| {
            let e_end = u32::from(e.base) + u32::from(e.len);
            u32::from(base) < e_end && u32::from(e.base) < end
        });
        if overlaps {
            return Err(PioBusError::Overlap { base, len });
        }
        self.entries.push(Entry { base, len, device });
        self.entries.sort_by_key(|e| e.base);
        Ok(())
    }

    fn find(&self, port: u16) -> Option<(&Entry, u16)> {
        let idx = self
            .entries
            .partition_point(|e| e.base <= port)
            .checked_sub(1)?;
        let entry = &self.entries[idx];
        let offset = port - entry.base;
        (offset < entry.len).then_some((entry, offset))
    }

    /// Guest `in` from `port`; unclaimed ports read as all ones.
    pub fn read(&self, port: u16, data: &mut [u8]) -> PioOutcome {
        match self.find(port) {
            Some((entry, offset)) => {
                lock(&entry.device).read(offset, data);
                PioOutcome::Handled(None)
            }
            None => {
                data.fill(0xff);
                PioOutcome::Unclaimed
            }
        }
    }

    /// Guest `out` to `port`.
    pub fn write(&self, port: u16, data: &[u8]) -> PioOutcome {
        match self.find(port) {
            Some((entry, offset)) => PioOutcome::Handled(lock(&entry.device).write(offset, data)),
            None => PioOutcome::Unclaimed,
        }
    }
}

/// Ports that a guest touches and that lull deliberately accepts and ignores (PIT, port B,
/// POST code): reads return zero, writes are dropped, nothing is counted as unknown.
#[derive(Debug, Default)]
pub struct IgnoredPorts;

impl PioDevice for IgnoredPorts {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u16, _data: &[u8]) -> Option<MachineRequest> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Recorder(Vec<(u16, Vec<u8>)>);
    impl PioDevice for Recorder {
        fn read(&mut self, offset: u16, data: &mut [u8]) {
            data.fill(u8::try_from(offset).unwrap_or(0));
        }
        fn write(&mut self, offset: u16, data: &[u8]) -> Option<MachineRequest> {
            self.0.push((offset, data.to_vec()));
            None
        }
    }

    #[test]
    fn routes_by_range_and_offset() {
        let mut bus = PioBus::new();
        let rec = Arc::new(Mutex::new(Recorder(Vec::new())));
        bus.insert(0x3f8, 8, rec.clone()).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(bus.read(0x3fa, &mut b), PioOutcome::Handled(None));
        assert_eq!(b, [2]);
        assert_eq!(bus.write(0x3ff, &[9]), PioOutcome::Handled(None));
        assert_eq!(rec.lock().unwrap().0, vec![(7, vec![9])]);
        assert_eq!(bus.read(0x400, &mut b), PioOutcome::Unclaimed);
        assert_eq!(b, [0xff]);
        assert_eq!(bus.write(0x3f7, &[1]), PioOutcome::Unclaimed);
    }

    #[test]
    fn rejects_overlap_and_bad_ranges() {
        let mut bus = PioBus::new();
        bus.insert(0x60, 1, Arc::new(Mutex::new(IgnoredPorts)))
            .unwrap();
        assert_eq!(
            bus.insert(0x5f, 2, Arc::new(Mutex::new(IgnoredPorts))),
            Err(PioBusError::Overlap { base: 0x5f, len: 2 })
        );
        assert!(bus
            .insert(0xffff, 2, Arc::new(Mutex::new(IgnoredPorts)))
            .is_err());
        assert!(bus
            .insert(0x10, 0, Arc::new(Mutex::new(IgnoredPorts)))
            .is_err());
        bus.insert(0x61, 1, Arc::new(Mutex::new(IgnoredPorts)))
            .unwrap();
    }
}
