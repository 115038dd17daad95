//! A running VM as another thread (the report, the management API) sees it.

use std::sync::Arc;

use ::devices::serial::SerialCounters;
use ::devices::virtio::mmio::SharedTransport;
use kvm_ioctls::VmFd;
use vm_memory::GuestMemoryMmap;

use super::pause_state::PauseState;
use super::run_stats::RunStats;
use crate::irqchip::IrqChip;
use crate::state::{StopReason, VcpuShared};
use crate::vcpu::DeviceBuses;

/// A running VM as another thread sees it: what it needs to read the VM's counters
/// ([`super::report::live`]), to pause and resume it ([`super::pause_resume`]) and to ask it to stop.
#[derive(Clone)]
pub struct LiveVm {
    pub(super) shared: Arc<VcpuShared>,
    pub(super) buses: Arc<DeviceBuses>,
    pub(super) stats: Arc<RunStats>,
    pub(super) chip: Arc<dyn IrqChip>,
    pub(super) serial: Arc<SerialCounters>,
    pub(super) vm: Arc<VmFd>,
    pub(super) pause: Arc<PauseState>,
    pub(super) mem: Arc<GuestMemoryMmap>,
    pub(super) console: Arc<std::sync::Mutex<super::devices::Console>>,
    /// The virtio devices in window order (disks, then nets), for a snapshot.
    pub(super) virtio: Arc<[SharedTransport]>,
    /// How many times the VM has been restored (0: it booted), for its snapshots.
    pub(super) restores: u32,
    /// The path of the serial console's pseudo-terminal (`--serial pty`).
    pub(super) serial_pty: Option<std::path::PathBuf>,
}

impl LiveVm {
    /// The path of the serial console's pseudo-terminal, if it has one (`--serial pty`).
    pub fn serial_pty(&self) -> Option<&std::path::Path> {
        self.serial_pty.as_deref()
    }

    /// Asks the VM to stop (the first request wins); [`super::run`] then returns as for any stop.
    pub fn request_stop(&self, reason: StopReason) {
        self.shared.stop.request(reason);
        // Paused vCPUs leave the gate and stop.
        self.shared.pause.stop();
    }
}
