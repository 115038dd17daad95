//! A virtio-mmio transport's state as a snapshot holds it, and why a saved one is refused:
//! the plain types, apart from the transport (`mmio::state` saves and restores them), so that
//! the MMIO bus's device trait can name them without depending on the transport.

use serde::{Deserialize, Serialize};

use super::throttle::ThrottleState;
use crate::rate_limiter::RateStateError;

/// One queue's saved configuration and position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSnapshot {
    /// The size the driver chose.
    pub size: u16,
    /// QueueReady.
    pub ready: bool,
    /// Guest-physical address of the descriptor table.
    pub desc_table: u64,
    /// Guest-physical address of the available ring.
    pub avail_ring: u64,
    /// Guest-physical address of the used ring.
    pub used_ring: u64,
    /// The next available-ring entry the device takes.
    pub next_avail: u16,
    /// The next used-ring entry the device fills.
    pub next_used: u16,
    /// Whether `VIRTIO_F_EVENT_IDX` suppression is on.
    pub event_idx: bool,
}

/// A transport's saved state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportState {
    /// The device type (a check: the restoring VM must have the same device there).
    pub device_type: u32,
    /// The device status register.
    pub status: u32,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// The features the driver accepted.
    pub driver_features: u64,
    /// QueueSel.
    pub queue_sel: u32,
    /// InterruptStatus.
    pub interrupt_status: u32,
    /// ConfigGeneration (lull's devices never change their configuration: always 0).
    pub config_generation: u32,
    /// Each queue, in index order.
    pub queues: Vec<QueueSnapshot>,
    /// The device's rate limiter, if it has one.
    pub throttle: Option<ThrottleState>,
}

/// Why a saved transport cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum TransportStateError {
    /// The saved device is not this one.
    #[error("The saved device is of type {found}; the VM has a device of type {want} there: the snapshot's configuration or state is corrupt")]
    DeviceType {
        /// Saved.
        found: u32,
        /// This VM's.
        want: u32,
    },
    /// The saved device has another number of queues.
    #[error("The saved device has {found} queue(s); this device has {want}: corrupt snapshot")]
    QueueCount {
        /// Saved.
        found: usize,
        /// This device's.
        want: usize,
    },
    /// A queue's size or ring address is not one a driver could have set.
    #[error("Saved queue {index} is invalid ({why}): corrupt snapshot")]
    Queue {
        /// The queue.
        index: usize,
        /// What `virtio-queue` said.
        why: String,
    },
    /// A ready queue's rings are not in guest memory.
    #[error("Saved queue {index} is ready but its rings are not in guest memory: corrupt snapshot or another VM's")]
    QueueMemory {
        /// The queue.
        index: usize,
    },
    /// The accepted features are not a set the transport could have accepted.
    #[error("The saved driver features {found:#x} are not a subset of the device's {offered:#x} with VERSION_1: corrupt snapshot")]
    Features {
        /// Saved.
        found: u64,
        /// Offered by this device.
        offered: u64,
    },
    /// A register holds a value the transport never holds.
    #[error(
        "The saved {register} is {value:#x}, a value this transport never holds: corrupt snapshot"
    )]
    Register {
        /// The register.
        register: &'static str,
        /// Its value.
        value: u32,
    },
    /// The device's rate limiter.
    #[error(transparent)]
    Throttle(#[from] RateStateError),
}
