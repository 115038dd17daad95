//! What only the `vm` layer reads of a run: KVM's statistics, the virtio-net devices, the
//! disks' shrink errors.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::state::net_port::NetPort;

/// What only the `vm` layer reads of a run, besides what the vCPUs share with it
/// ([`crate::state::VcpuShared`]): KVM's statistics, the virtio-net devices and the disks'
/// shrink errors. Built with the devices; read by the report (on the VMM thread at the end, or
/// on the API thread while the VM runs).
pub struct RunStats {
    /// KVM's binary statistics of each vCPU.
    pub kvm_stats: Vec<std::fs::File>,
    /// The virtio-net devices, in `--net` order (the VMM thread also watches their taps).
    pub nets: Vec<Arc<dyn NetPort>>,
    /// Each disk's requests that failed because its image shrank under the VM.
    pub disk_shrink_errors: Vec<Arc<AtomicU64>>,
}

impl RunStats {
    /// KVM's counters summed over all vCPUs, if KVM offers binary statistics.
    pub fn kvm_counters(&self) -> Option<BTreeMap<String, u64>> {
        if self.kvm_stats.is_empty() {
            return None;
        }
        let mut out = BTreeMap::new();
        for fd in &self.kvm_stats {
            crate::host::stats::read_kvm_stats(fd, &mut out).ok()?;
        }
        Some(out)
    }
}
