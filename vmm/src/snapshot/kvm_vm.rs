//! What KVM holds for the whole VM with `--irqchip kernel`: the PIC pair and the IOAPIC
//! (`KVM_GET_IRQCHIP`), the PIT (`KVM_GET_PIT2`) and kvmclock (`KVM_GET_CLOCK`, as it was
//! when the VM paused). With `--irqchip user` KVM has none of the chips: lull's own IOAPIC
//! is kept here too (`user_ioapic`), its LAPICs with each vCPU's state.

use devices::ioapic::IoApicState;
use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_pit_state2, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

/// The file name of the VM's KVM state.
pub const FILE: &str = "kvm-vm.json";

/// The VM's KVM state.
#[derive(Debug, Serialize, Deserialize)]
pub struct KvmVmState {
    /// PIC master, PIC slave, IOAPIC (empty without an in-kernel irqchip).
    pub irqchips: Vec<kvm_irqchip>,
    /// The PIT (`None` without an in-kernel PIT).
    pub pit: Option<kvm_pit_state2>,
    /// kvmclock when the VM paused.
    pub clock: Option<kvm_clock_data>,
    /// lull's IOAPIC (`--irqchip user`; `None` with KVM's): not KVM's, but VM-wide like it.
    pub user_ioapic: Option<IoApicState>,
}

impl KvmVmState {
    /// Reads `vm`'s chips (those it has); `clock` is kvmclock at the pause.
    pub fn capture(vm: &VmFd, clock: Option<kvm_clock_data>) -> Self {
        let irqchips = [
            KVM_IRQCHIP_PIC_MASTER,
            KVM_IRQCHIP_PIC_SLAVE,
            KVM_IRQCHIP_IOAPIC,
        ]
        .into_iter()
        .map_while(|chip_id| {
            let mut chip = kvm_irqchip {
                chip_id,
                ..Default::default()
            };
            vm.get_irqchip(&mut chip).ok().map(|()| chip)
        })
        .collect();
        Self {
            irqchips,
            pit: vm.get_pit2().ok(),
            clock,
            user_ioapic: None,
        }
    }

    /// Gives `vm` these chips and this kvmclock; the KVM call that failed, if one did.
    pub fn restore(&self, vm: &VmFd) -> Result<(), (&'static str, kvm_ioctls::Error)> {
        for chip in &self.irqchips {
            vm.set_irqchip(chip).map_err(|e| ("KVM_SET_IRQCHIP", e))?;
        }
        if let Some(pit) = &self.pit {
            vm.set_pit2(pit).map_err(|e| ("KVM_SET_PIT2", e))?;
        }
        if let Some(clock) = &self.clock {
            let again = kvm_clock_data {
                clock: clock.clock,
                ..Default::default()
            };
            vm.set_clock(&again).map_err(|e| ("KVM_SET_CLOCK", e))?;
        }
        Ok(())
    }
}
