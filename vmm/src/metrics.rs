//! Counters lull keeps while a VM runs and the JSON it writes at exit (`--metrics`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::ratelimit::LogLimiter;

/// Per-vCPU exit counters, written by the vCPU thread, read by anyone.
#[derive(Debug, Default)]
pub struct VcpuCounters {
    /// Port reads.
    pub io_in: AtomicU64,
    /// Port writes.
    pub io_out: AtomicU64,
    /// MMIO reads.
    pub mmio_read: AtomicU64,
    /// MMIO writes.
    pub mmio_write: AtomicU64,
    /// HLT exits (only without an in-kernel irqchip).
    pub hlt: AtomicU64,
    /// KVM_RUN returns with EINTR (signals).
    pub interrupted: AtomicU64,
    /// Any other exit.
    pub other: AtomicU64,
}

/// Snapshot of [`VcpuCounters`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VcpuSnapshot {
    /// vCPU index.
    pub vcpu: u32,
    /// Port reads.
    pub io_in: u64,
    /// Port writes.
    pub io_out: u64,
    /// MMIO reads.
    pub mmio_read: u64,
    /// MMIO writes.
    pub mmio_write: u64,
    /// HLT exits.
    pub hlt: u64,
    /// Interrupted runs.
    pub interrupted: u64,
    /// Other exits.
    pub other: u64,
}

impl VcpuCounters {
    /// A snapshot for vCPU `vcpu`.
    pub fn snapshot(&self, vcpu: u32) -> VcpuSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        VcpuSnapshot {
            vcpu,
            io_in: g(&self.io_in),
            io_out: g(&self.io_out),
            mmio_read: g(&self.mmio_read),
            mmio_write: g(&self.mmio_write),
            hlt: g(&self.hlt),
            interrupted: g(&self.interrupted),
            other: g(&self.other),
        }
    }
}

/// VM-wide counters of guest behaviour that lull ignores.
#[derive(Debug, Default)]
pub struct GuestNoise {
    /// Accesses to ports no device owns.
    pub unknown_port: LogLimiter,
    /// Accesses to MMIO addresses no device owns.
    pub unknown_mmio: LogLimiter,
}

/// The JSON written to `--metrics` at exit. Field names are stable.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// lull's exit status.
    pub exit_status: i32,
    /// Why the run ended, in words.
    pub stop_reason: String,
    /// Milliseconds from lull's start to the end of the run.
    pub run_time_ms: u64,
    /// Milliseconds from lull's start to the guest's boot-complete marker, if it wrote one.
    pub boot_time_ms: Option<u64>,
    /// Bytes the guest wrote to its serial console.
    pub serial_bytes_out: u64,
    /// Accesses to unowned ports.
    pub unknown_port_accesses: u64,
    /// Accesses to unowned MMIO.
    pub unknown_mmio_accesses: u64,
    /// Per-vCPU exits.
    pub vcpus: Vec<VcpuSnapshot>,
}
