//! What the VMM thread and the run report need of a virtio-net device, whatever its backend:
//! the descriptor to watch, the receive pass to run when it is readable, and its counters.
//! (`vm::nets` implements it for a tap; the shared state holds the devices through it, so the
//! layers below `vm` need not know the device's type.)

use std::os::fd::RawFd;

/// A virtio-net device as the VMM thread sees it.
pub trait NetPort: Send + Sync {
    /// The backend's descriptor: readable when frames wait for the guest.
    fn fd(&self) -> RawFd;
    /// The backend is readable: deliver what fits the guest's posted buffers.
    fn poll_rx(&self);
    /// The device's counters.
    fn report(&self) -> NetReport;
}

pub use lull_schema::NetReport;
