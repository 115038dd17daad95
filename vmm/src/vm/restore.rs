//! Restoring a snapshot (`vm.restore`): what a VM built from its configuration gets from the
//! snapshot before its vCPUs start (paused).
//!
//! Order: memory (the snapshot's file mapped copy-on-write, or its data copied in: `load` in
//! `vm/mod.rs`, before the vCPUs exist), each vCPU's KVM state
//! (`VcpuKvmState::restore`: KVM's LAPIC before the MSRs), then the VM's chips and kvmclock.
//! With `--irqchip kernel` that is all the interrupt and timer state (KVM's LAPICs, PICs,
//! IOAPIC, PIT). With `--irqchip user` lull's own chip is built afterwards (its TSC map from
//! the restored guest TSC), its clock is stopped as for a pause ([`freeze`]), then it takes
//! the IOAPIC ([`apply_user_ioapic`]) and each vCPU its LAPIC and PV registrations
//! ([`apply_user_vcpu`], before its thread starts; the thread arms the LAPIC timer's host
//! timer). Every lull timer resumes in guest time: a one-shot or periodic count with the time
//! it had left, a TSC deadline at its guest TSC value (one the guest TSC has passed, where it
//! runs on across the snapshot, fires at the resume: late, once, never early).
//! Then, as the devices are built, the serial port takes its saved registers and each virtio
//! device its saved transport, queues and rate limiter (`snapshot::devices`), quiesced until
//! the resume.

use kvm_ioctls::VmFd;

use super::error::VmError;
use crate::config::IrqchipMode;
use crate::irqchip::{IrqChip, VcpuIrq};
use crate::snapshot::{Snapshot, SnapshotError};
use crate::vcpu::KvmPort;

/// Fails unless this lull can restore `snapshot`.
pub fn check(snapshot: &Snapshot) -> Result<(), VmError> {
    if snapshot.vcpus.len() != snapshot.manifest.vcpus.len() {
        return Err(VmError::Restore(
            "its vCPU states are incomplete".to_string(),
        ));
    }
    if snapshot.manifest.config.irqchip == IrqchipMode::User {
        if snapshot.vcpus.iter().any(|v| v.user_irqchip.is_none()) {
            return Err(SnapshotError::UserIrqchip("LAPICs").into());
        }
        if snapshot.kvm_vm.user_ioapic.is_none() {
            return Err(SnapshotError::UserIrqchip("IOAPIC").into());
        }
    }
    Ok(())
}

/// Gives the new VM `vm` and its vCPUs `ports` the snapshot's KVM state (and a vCPU
/// restored halted the exit flags of its halt: `KvmPort::seed_halted_exit`).
pub fn apply(snapshot: &Snapshot, vm: &VmFd, ports: &mut [KvmPort]) -> Result<(), VmError> {
    for (port, state) in ports.iter_mut().zip(&snapshot.vcpus) {
        state
            .restore(&port.fd)
            .map_err(|e| VmError::Restore(e.to_string()))?;
        if state.user_irqchip.as_ref().is_some_and(|u| u.halted) {
            port.seed_halted_exit(&state.regs, &state.events);
        }
    }
    snapshot
        .kvm_vm
        .restore(vm)
        .map_err(|(call, e)| VmError::Restore(format!("KVM call {call} failed: {e}")))
}

/// Stops `chip`'s clock at CLOCK_MONOTONIC `monotonic`, as `vm.pause` does: the restored VM
/// starts paused, and `vm.resume` thaws the clock as after any pause.
pub fn freeze(chip: &dyn IrqChip, monotonic: u64) {
    chip.paused(monotonic);
}

/// `--irqchip user`: gives `chip` the snapshot's IOAPIC (nothing with `--irqchip kernel`).
pub fn apply_user_ioapic(snapshot: &Snapshot, chip: &dyn IrqChip) -> Result<(), VmError> {
    let Some(state) = &snapshot.kvm_vm.user_ioapic else {
        return Ok(());
    };
    chip.restore_ioapic(state).map_err(|why| {
        SnapshotError::IrqchipState {
            what: "the IOAPIC".to_string(),
            why,
        }
        .into()
    })
}

/// `--irqchip user`: gives vCPU `id`'s chip `irq` its saved LAPIC and PV registrations
/// (nothing with `--irqchip kernel`).
pub fn apply_user_vcpu(snapshot: &Snapshot, id: u32, irq: &mut dyn VcpuIrq) -> Result<(), VmError> {
    let saved = usize::try_from(id)
        .ok()
        .and_then(|i| snapshot.vcpus.get(i))
        .and_then(|v| v.user_irqchip.as_ref());
    let Some(state) = saved else {
        return Ok(());
    };
    irq.restore(state).map_err(|why| {
        SnapshotError::IrqchipState {
            what: format!("vCPU {id}"),
            why,
        }
        .into()
    })
}
