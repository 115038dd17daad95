//! The host a benchmark ran on, as recorded in the JSON reports.

use serde::{Deserialize, Serialize};

/// Facts about the host that change the numbers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostInfo {
    /// Host CPUs lull may run on.
    pub cpus: usize,
    /// Host kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel: String,
    /// `kvm_pvm` (software virtualization, guest kernel code emulated), else `kvm`.
    pub kvm_module: String,
    /// KVM's `halt_poll_ns` module parameter (the in-kernel irqchip's halt polling), if readable.
    pub kvm_halt_poll_ns: Option<u64>,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix_s: u64,
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// This host, now.
pub fn host_info() -> HostInfo {
    HostInfo {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default(),
        kvm_module: if kit::host_is_pvm() {
            "kvm_pvm".into()
        } else {
            "kvm".into()
        },
        kvm_halt_poll_ns: read_trimmed("/sys/module/kvm/parameters/halt_poll_ns")
            .and_then(|s| s.parse().ok()),
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}
