//! Restoring a snapshot (`vm.restore`): what a VM built from its configuration gets from the
//! snapshot before its vCPUs start (paused). Only `--irqchip kernel` VMs: there KVM holds every
//! interrupt and timer state, and the snapshot has it (KVM's LAPICs, PICs, IOAPIC, PIT,
//! kvmclock). A `--irqchip user` VM's LAPICs, IOAPIC and timer queues are lull's, and this
//! snapshot format does not hold them yet: such a snapshot is refused.
//!
//! Order: memory (read into the new VM's before the vCPUs exist), each vCPU's KVM state
//! (`VcpuKvmState::restore`: KVM's LAPIC before the MSRs), then the VM's chips and kvmclock;
//! then, as the devices are built, the serial port from its saved registers and each virtio
//! device from its saved transport, queues and rate limiter (`snapshot::devices`), quiesced
//! until the resume.

use kvm_ioctls::VmFd;

use super::error::VmError;
use crate::config::IrqchipMode;
use crate::snapshot::{Snapshot, SnapshotError};
use crate::vcpu::KvmPort;

/// Fails unless this lull can restore `snapshot`.
pub fn check(snapshot: &Snapshot) -> Result<(), VmError> {
    if snapshot.manifest.config.irqchip != IrqchipMode::Kernel {
        return Err(SnapshotError::UserIrqchip.into());
    }
    if snapshot.vcpus.len() != snapshot.manifest.vcpus.len() {
        return Err(VmError::Restore(
            "its vCPU states are incomplete".to_string(),
        ));
    }
    Ok(())
}

/// Gives the new VM `vm` and its vCPUs `ports` the snapshot's KVM state.
pub fn apply(snapshot: &Snapshot, vm: &VmFd, ports: &[KvmPort]) -> Result<(), VmError> {
    for (port, state) in ports.iter().zip(&snapshot.vcpus) {
        state
            .restore(&port.fd)
            .map_err(|e| VmError::Restore(e.to_string()))?;
    }
    snapshot
        .kvm_vm
        .restore(vm)
        .map_err(|(call, e)| VmError::Restore(format!("KVM call {call} failed: {e}")))
}
