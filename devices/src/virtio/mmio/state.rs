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

use virtio_bindings::virtio_config::{VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::GuestMemory;

use super::super::transport_state::{QueueSnapshot, TransportState, TransportStateError};
use super::super::VirtioDevice;
use super::VirtioMmio;

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
