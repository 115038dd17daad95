//! A virtio-mmio transport as a snapshot holds it: the registers a driver wrote (status,
//! feature selectors, accepted features, queue select), InterruptStatus, and each queue's
//! configuration and position (size, ready, ring addresses, the next available-ring entry the
//! device will take and the next used-ring entry it will fill), plus the device's rate
//! limiter. A restored transport serves the next request exactly where the saved one would.
//!
//! The state comes from a file, so [`VirtioMmio::restore`] trusts none of it: a device of
//! another type or queue count, a queue size that is zero, not a power of two or above the
//! device's maximum, a misaligned ring, a ready queue whose rings are not in guest memory,
//! features the device does not offer, unknown InterruptStatus bits each get a
//! [`TransportStateError`], never a panic, and leave the transport as it was.

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::{VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::GuestMemory;

use super::super::throttle::ThrottleState;
use super::super::VirtioDevice;
use super::VirtioMmio;
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
    /// The snapshot has a virtio state for a device that is not virtio.
    #[error(
        "The snapshot has a virtio device's state for a device that is not one: corrupt snapshot"
    )]
    NotVirtio,
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

impl<D: VirtioDevice, M: GuestMemory> VirtioMmio<D, M> {
    /// The transport's state, its device's rate limiter included.
    pub fn save(&self) -> TransportState {
        TransportState {
            device_type: self.device.device_type(),
            status: self.status,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            queue_sel: self.queue_sel,
            interrupt_status: self.interrupt_status,
            config_generation: 0,
            queues: self
                .queues
                .iter()
                .map(|q| {
                    let s = q.state();
                    QueueSnapshot {
                        size: s.size,
                        ready: s.ready,
                        desc_table: s.desc_table,
                        avail_ring: s.avail_ring,
                        used_ring: s.used_ring,
                        next_avail: s.next_avail,
                        next_used: s.next_used,
                        event_idx: s.event_idx_enabled,
                    }
                })
                .collect(),
            throttle: self.device.save_throttle(),
        }
    }

    /// Checks `s` against this device and guest memory and, if it holds, puts it in place;
    /// on an error nothing changed. A refill timer the device waited for is asked for again
    /// (taken by the next `take_timer_request`).
    pub fn restore(&mut self, s: &TransportState) -> Result<(), TransportStateError> {
        let want = self.device.device_type();
        if s.device_type != want {
            return Err(TransportStateError::DeviceType {
                found: s.device_type,
                want,
            });
        }
        let maxes = self.device.queue_max_sizes();
        if s.queues.len() != maxes.len() {
            return Err(TransportStateError::QueueCount {
                found: s.queues.len(),
                want: maxes.len(),
            });
        }
        let queues = s
            .queues
            .iter()
            .zip(maxes)
            .enumerate()
            .map(|(index, (q, &max_size))| self.restore_queue(index, q, max_size))
            .collect::<Result<Vec<_>, _>>()?;
        let offered = self.device.features();
        let accepted = s.driver_features;
        let features_ok = s.status & VIRTIO_CONFIG_S_FEATURES_OK != 0;
        if accepted & !offered != 0 || (features_ok && accepted & (1 << VIRTIO_F_VERSION_1) == 0) {
            return Err(TransportStateError::Features {
                found: accepted,
                offered,
            });
        }
        let register = |register, value| TransportStateError::Register { register, value };
        if s.interrupt_status & !(VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG) != 0 {
            return Err(register("InterruptStatus", s.interrupt_status));
        }
        if s.config_generation != 0 {
            return Err(register("ConfigGeneration", s.config_generation));
        }
        self.device.restore_throttle(s.throttle.as_ref())?;
        self.queues = queues;
        self.status = s.status;
        self.device_features_sel = s.device_features_sel;
        self.driver_features_sel = s.driver_features_sel;
        self.driver_features = s.driver_features;
        self.queue_sel = s.queue_sel;
        self.interrupt_status = s.interrupt_status;
        Ok(())
    }

    fn restore_queue(
        &self,
        index: usize,
        q: &QueueSnapshot,
        max_size: u16,
    ) -> Result<Queue, TransportStateError> {
        let queue = Queue::try_from(QueueState {
            max_size,
            next_avail: q.next_avail,
            next_used: q.next_used,
            event_idx_enabled: q.event_idx,
            size: q.size,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
        })
        .map_err(|e| TransportStateError::Queue {
            index,
            why: e.to_string(),
        })?;
        if q.ready && !queue.is_valid(self.mem.as_ref()) {
            return Err(TransportStateError::QueueMemory { index });
        }
        Ok(queue)
    }
}
