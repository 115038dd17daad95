//! A virtio-net device's counters, as the device keeps them and as the report lists them.

use serde::{Deserialize, Serialize};

/// What a virtio-net device has done, for metrics and tests (each [`NetReport`]'s counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetStats {
    /// Frames delivered to the guest.
    pub rx_frames: u64,
    /// Bytes of those frames (virtio-net headers not counted).
    pub rx_bytes: u64,
    /// Received frames dropped: larger than the chain posted for them, or runts.
    pub rx_dropped: u64,
    /// Receive chains returned unused (a writable buffer outside guest memory, or room for
    /// less than a header and an Ethernet header).
    pub rx_bad_chains: u64,
    /// Backend (tap) read errors other than "nothing waiting" (each ends a receive pass).
    pub rx_errors: u64,
    /// Frames the guest sent that went to the backend (the tap).
    pub tx_frames: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Transmit chains returned unsent: no header, a runt or oversized frame, a buffer
    /// outside guest memory.
    pub tx_dropped: u64,
    /// Frames the backend refused (e.g. the tap is down).
    pub tx_errors: u64,
    /// Available-ring entries naming no descriptor (index past the queue's size): skipped.
    pub bad_heads: u64,
    /// Frames the transmit rate limiter held back (each left in the queue until a refill).
    pub throttled: u64,
    /// Refill timers that fired.
    pub refills: u64,
}

/// One network device in the run report (`nets`, in `--net` order): its tap and address, then
/// its counters as keys of the same object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetReport {
    /// The host tap.
    pub tap: String,
    /// The device's MAC address.
    pub mac: String,
    /// The device's counters.
    #[serde(flatten)]
    pub stats: NetStats,
}
