//! The VM's devices in a snapshot (`devices.json`): the serial port's registers and unread
//! input, and each virtio-mmio device's transport state (registers, each queue's
//! configuration, next available and used index, InterruptStatus) with its rate limiter's
//! buckets, in window order: the disks in `--disk` order, then the nets in `--net` order.
//!
//! Taken from a paused VM, whose devices are quiesced (`MmioDevice::quiesce`: no tap poll and
//! no refill timer touches a queue while paused; virtio requests otherwise run inside the
//! vCPUs' MMIO exits, and every vCPU is parked), so the queues and guest memory agree.
//! Restored before the vCPUs start, onto the devices a VM built from the snapshot's
//! configuration has: each state is checked against its device and the new guest memory
//! (`VirtioMmio::restore`), and the first that does not fit refuses the restore.

use devices::mmio::MmioBus;
use devices::serial::SerialSnapshot;
use devices::virtio::mmio::{SharedTransport, TransportState};
use serde::{Deserialize, Serialize};
use timer::lock;

use super::SnapshotError;
use crate::config::VmConfig;

/// The file name of the devices' state.
pub const FILE: &str = "devices.json";

/// The devices' state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesState {
    /// COM1.
    pub serial: SerialSnapshot,
    /// Each virtio device, in window order (disks, then nets).
    pub virtio: Vec<TransportState>,
    /// How many times the VM had been restored when it was saved (0: it booted); its restore
    /// reads one more at the restore-count port (`devices::restore_count`).
    #[serde(default)]
    pub restores: u32,
}

impl DevicesState {
    /// The console's saved `serial` state and that of every device of `virtio` (the VM's
    /// virtio devices in window order), of a VM restored `restores` times.
    pub fn capture(serial: SerialSnapshot, virtio: &[SharedTransport], restores: u32) -> Self {
        Self {
            serial,
            restores,
            virtio: virtio
                .iter()
                .map(|device| lock(device).save_transport())
                .collect(),
        }
    }

    /// Fails unless there is one virtio state per disk and net of `cfg`.
    pub fn check_count(&self, cfg: &VmConfig) -> Result<(), SnapshotError> {
        let want = cfg.disks.len() + cfg.nets.len();
        if self.virtio.len() != want {
            return Err(SnapshotError::DeviceCount {
                found: self.virtio.len(),
                want,
            });
        }
        Ok(())
    }

    /// Gives every device of `virtio` (the VM's virtio devices in window order) its saved
    /// state, and quiesces it (the restored VM starts paused; its resume releases them).
    pub fn restore_virtio(&self, virtio: &[SharedTransport]) -> Result<(), SnapshotError> {
        if virtio.len() != self.virtio.len() {
            return Err(SnapshotError::DeviceCount {
                found: self.virtio.len(),
                want: virtio.len(),
            });
        }
        for (index, (device, state)) in virtio.iter().zip(&self.virtio).enumerate() {
            let mut device = lock(device);
            device.quiesce(true);
            device
                .restore_transport(state)
                .map_err(|source| SnapshotError::Device { index, source })?;
        }
        Ok(())
    }
}

/// Quiesces (`on`) or releases every device on `mmio` (a pause and its resume).
pub fn quiesce(mmio: &MmioBus, on: bool) {
    for (_, device) in mmio.devices() {
        lock(device).quiesce(on);
    }
}
