//! Virtio devices over MMIO (virtio 1.x, "modern" MMIO register layout, version 2).
//!
//! ```text
//!  guest driver ── MMIO registers ──► mmio::VirtioMmio (transport: features, status, queues,
//!                                      │                 interrupt status)
//!                                      │ QueueNotify(n)
//!                                      ▼
//!                           dyn-free VirtioDevice::process_queue(n, &mut Queue, &memory)
//!                                      │ block::Block: parse chains, do I/O on its Disk
//!                                      │ net::Net: frames between chains and a NetBackend
//!                                      ▼
//!                           used ring updated ──► interrupt status ──► line level
//! ```
//!
//! The transport owns the split virtqueues (`virtio-queue`'s [`Queue`]); a device sees a queue
//! only while it processes a notification, and reaches guest memory through `vm-memory`'s
//! [`GuestMemory`] trait, so unit tests and fuzz targets run it on a `GuestMemoryMmap` of
//! their own. Nothing here owns a thread or an interrupt controller: the interrupt is a level
//! ([`mmio::VirtioMmio::interrupt_pending`]) that the bus adapter
//! ([`mmio::VirtioMmioDevice`]) puts on an IOAPIC line after every access, and after every
//! [`mmio::VirtioMmioDevice::poll_queue`], which the VMM calls when a backend has something
//! for the guest (a net device's received frames).

pub mod block;
pub mod disk;
pub mod mmio;
pub mod net;
pub mod throttle;
pub mod transport_state;

// Test addresses and lengths are small: their casts are exact.
#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod net_tests;
#[cfg(test)]
mod proptests;
// Test addresses and lengths are small: their casts are exact.
#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod state_tests;
// The spec's constants come as u32 and the tests' addresses are small: their casts are exact.
#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests;

use virtio_queue::Queue;
use vm_memory::GuestMemory;

/// A virtio device behind a transport.
pub trait VirtioDevice: Send {
    /// The virtio device type (`virtio_ids`), e.g. 2 for a block device.
    fn device_type(&self) -> u32;
    /// Every feature bit the device offers, transport bits (`VIRTIO_F_VERSION_1`) included.
    fn features(&self) -> u64;
    /// The largest size of each of the device's queues (their number is the slice's length).
    fn queue_max_sizes(&self) -> &[u16];
    /// Guest read of the device-specific configuration space at `offset`.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Guest write of the configuration space at `offset`.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// Takes every chain the driver made available on queue `index` (at most the queue's size
    /// of them) and returns each through the used ring; true if any was returned.
    fn process_queue<M: GuestMemory>(&mut self, index: usize, queue: &mut Queue, mem: &M) -> bool;
    /// A timer the device wants, as an effect: the time (on the device's clock) at which its
    /// [`DeviceTimer`] should fire once. Taken after every access and every timer callback.
    fn take_timer_request(&mut self) -> Option<u64> {
        None
    }
    /// The timer the device asked for fired: it may process its queues again.
    fn timer_fired(&mut self) {}
    /// The device's rate limiter, if it has one.
    fn throttle(&self) -> Option<&throttle::Throttle> {
        None
    }
    /// The same, to change.
    fn throttle_mut(&mut self) -> Option<&mut throttle::Throttle> {
        None
    }
    /// The device is quiesced (`on`) or released: its rate limiter's saved state is taken as
    /// of the quiescing ([`throttle::Throttle::freeze`]).
    fn freeze_throttle(&mut self, on: bool) {
        if let Some(t) = self.throttle_mut() {
            t.freeze(on);
        }
    }
    /// The device's rate limiter as a snapshot holds it (`None`: it has none).
    fn save_throttle(&self) -> Option<throttle::ThrottleState> {
        self.throttle().map(throttle::Throttle::save)
    }
    /// Restores the rate limiter saved by [`Self::save_throttle`]; a refill timer it waited
    /// for is asked for again through [`Self::take_timer_request`].
    fn restore_throttle(
        &mut self,
        saved: Option<&throttle::ThrottleState>,
    ) -> Result<(), crate::rate_limiter::RateStateError> {
        throttle::restore_optional(self.throttle_mut(), saved)
    }
}

/// Where a device's timer requests go: the VMM arms a timer for the device and, when it
/// fires, calls the device's `MmioDevice::timer_fired` on whatever thread expired it.
pub trait DeviceTimer: Send + Sync {
    /// Fire once at `deadline` (ns on the device's clock); an earlier request still pending
    /// may be replaced.
    fn request(&self, deadline: u64);
}
