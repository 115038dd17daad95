//! What the VMM thread and the run report need of a virtio-net device, whatever its backend:
//! the descriptor to watch, the receive pass to run when it is readable, and its counters.
//! (`vm::nets` implements it for a tap; the shared state holds the devices through it, so the
//! layers below `vm` need not know the device's type.)

use std::os::fd::RawFd;

use serde::Serialize;

/// A virtio-net device as the VMM thread sees it.
pub trait NetPort: Send + Sync {
    /// The backend's descriptor: readable when frames wait for the guest.
    fn fd(&self) -> RawFd;
    /// The backend is readable: deliver what fits the guest's posted buffers.
    fn poll_rx(&self);
    /// The device's counters.
    fn report(&self) -> NetReport;
}

/// One network device in the run report (`nets`, in `--net` order).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NetReport {
    /// The host tap.
    pub tap: String,
    /// The device's MAC address.
    pub mac: String,
    /// Frames delivered to the guest.
    pub rx_frames: u64,
    /// Their bytes (virtio-net headers not counted).
    pub rx_bytes: u64,
    /// Frames from the tap dropped: larger than the guest's buffer, or runts.
    pub rx_dropped: u64,
    /// Receive chains returned unused (a buffer outside guest memory).
    pub rx_bad_chains: u64,
    /// Tap read errors.
    pub rx_errors: u64,
    /// Frames the guest sent to the tap.
    pub tx_frames: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Frames the guest sent that were malformed (returned unsent).
    pub tx_dropped: u64,
    /// Frames the tap refused (e.g. the tap is down).
    pub tx_errors: u64,
    /// Available-ring entries naming no descriptor.
    pub bad_heads: u64,
    /// Frames the transmit rate limiter held back.
    pub throttled: u64,
    /// Refill timers that fired.
    pub refills: u64,
}
