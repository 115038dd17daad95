//! Creating the vCPUs and the irqchip that serves them: all vCPUs are created first (the TSC
//! frequency is read from the first), then configured; the irqchip is built for the mode.

use std::sync::Arc;

use kvm_bindings::{kvm_msr_entry, Msrs, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VmFd};
use vm_memory::GuestMemoryMmap;

use super::error::VmError;
use super::kvm::{ioctl_err, KvmError};
use crate::config::knobs::HaltPollMode;
use crate::config::{IrqchipMode, VmConfig};
use crate::host::sys;
use crate::idle::shared::IdleKnobs;
use crate::irqchip::kernel::KernelIrqChip;
use crate::irqchip::user::{guest_tsc, UserChipConfig, UserIrqChip};
use crate::irqchip::{IrqChip, IrqChipError};
use crate::setup::boot::cpu_state::EntryMode;
use crate::setup::cpuid::CpuidParams;
use crate::vcpu::{self, InjectPath, KvmPort, VcpuSetup};

const MSR_IA32_TSC: u32 = 0x10;
/// The CPUID leaf whose EAX[7:0] is MAXPHYADDR.
const LEAF_ADDRESS_SIZES: u32 = 0x8000_0008;
/// MAXPHYADDR when CPUID has no leaf 0x80000008 (SDM vol. 3, 4.1.4: 36 with PAE).
const DEFAULT_MAX_PHYS_ADDR_BITS: u8 = 36;

/// The VM's vCPUs (not yet running) and the guest TSC frequency.
pub struct CreatedVcpus {
    /// One per vCPU, in APIC-ID order.
    pub ports: Vec<KvmPort>,
    /// The guest TSC frequency KVM reports.
    pub tsc_khz: u32,
    /// The guest's MAXPHYADDR (CPUID 0x80000008 EAX[7:0], which lull passes through).
    pub max_phys_addr_bits: u8,
    /// KVM can move the guest TSC back by a pause (`vcpu::park::tsc_movable`).
    pub tsc_movable: bool,
}

/// MAXPHYADDR as `cpuid` tells it to the guest: leaf 0x80000008 EAX[7:0], else 36.
fn max_phys_addr_bits(cpuid: &[kvm_bindings::kvm_cpuid_entry2]) -> u8 {
    cpuid
        .iter()
        .find(|e| e.function == LEAF_ADDRESS_SIZES)
        .map_or(DEFAULT_MAX_PHYS_ADDR_BITS, |e| {
            u8::try_from(e.eax & 0xff).unwrap_or(DEFAULT_MAX_PHYS_ADDR_BITS)
        })
}

/// Creates `cfg.cpus` vCPUs and configures them; the boot CPU starts at `entry` (`None`: a
/// restored VM, whose registers the snapshot gives).
pub fn create(
    kvm: &Kvm,
    vm: &VmFd,
    cfg: &VmConfig,
    entry: Option<EntryMode>,
) -> Result<CreatedVcpus, VmError> {
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(ioctl_err("KVM_GET_SUPPORTED_CPUID"))?;
    let inject_path = if cfg.irqchip == IrqchipMode::User {
        InjectPath::probe(kvm)
    } else {
        InjectPath::Ioctl
    };
    let mut ports = Vec::new();
    for id in 0..cfg.cpus {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(ioctl_err("KVM_CREATE_VCPU"))?;
        let port = KvmPort::new(fd, id, inject_path).map_err(ioctl_err("KVM_GET_REGS/SREGS"))?;
        ports.push(port);
    }
    let bsp = ports.first().ok_or(KvmError::NoVcpus)?;
    let tsc_khz = bsp.fd.get_tsc_khz().map_err(ioctl_err("KVM_GET_TSC_KHZ"))?;
    let setup = VcpuSetup {
        supported_cpuid: supported.as_slice(),
        cpuid: CpuidParams {
            cpus: cfg.cpus,
            tsc_khz,
            user_lapic: cfg.irqchip == IrqchipMode::User,
            pv_eoi: cfg.pv_eoi.is_on(),
            pv_deadline: cfg.pv_deadline.is_on(),
            x2apic: cfg.x2apic.is_on(),
        },
    };
    for port in &ports {
        let boot_entry = entry.filter(|_| port.id == 0);
        vcpu::configure(&port.fd, port.id, &setup, boot_entry)?;
    }
    let tsc_movable = ports
        .first()
        .is_some_and(|bsp| vcpu::park::tsc_movable(&bsp.fd));
    tracing::debug!(tsc_movable, "guest TSC can move back by a pause");
    Ok(CreatedVcpus {
        ports,
        tsc_khz,
        max_phys_addr_bits: max_phys_addr_bits(supported.as_slice()),
        tsc_movable,
    })
}

/// The irqchip `cfg` asks for, over `vm` and its created vCPUs.
pub fn irqchip(
    cfg: &VmConfig,
    vm: &Arc<VmFd>,
    mem: &Arc<GuestMemoryMmap>,
    vcpus: &CreatedVcpus,
) -> Result<Arc<dyn IrqChip>, IrqChipError> {
    if cfg.irqchip == IrqchipMode::Kernel {
        return Ok(Arc::new(KernelIrqChip::new(vm.clone())?));
    }
    let chip_cfg = UserChipConfig {
        cpus: cfg.cpus,
        model: cfg.timer_model,
        tsc_khz: vcpus.tsc_khz,
        idle: IdleKnobs {
            halt_poll: cfg.halt_poll.unwrap_or(HaltPollMode::Adaptive),
            timer_advance: cfg.timer_advance.unwrap_or_default(),
            timer_slack: cfg.timer_slack.unwrap_or_default(),
            wake_placement: cfg.wake_placement.unwrap_or_default(),
            idle_inject: cfg.idle_inject,
            cpu_quota: cfg.cpu_quota,
            global_timers: cfg.global_timers,
        },
        pv_eoi: cfg.pv_eoi.is_on(),
        pv_deadline: cfg.pv_deadline.is_on(),
        x2apic: cfg.x2apic.is_on(),
        max_phys_addr_bits: vcpus.max_phys_addr_bits,
    };
    let bsp = vcpus.ports.first().ok_or(IrqChipError::NoVcpuPart(0))?;
    let read_msr = || {
        let kvm = |source| IrqChipError::Kvm {
            call: "KVM_GET_MSRS(IA32_TSC)",
            source,
        };
        let tsc = kvm_msr_entry {
            index: MSR_IA32_TSC,
            ..Default::default()
        };
        let mut msrs =
            Msrs::from_entries(&[tsc]).map_err(|_| kvm(kvm_ioctls::Error::new(libc::E2BIG)))?;
        bsp.fd.get_msrs(&mut msrs).map_err(kvm)?;
        Ok(msrs.as_slice().first().map_or(0, |e| e.data))
    };
    // The guest TSC read as RDTSC plus KVM's offset where that is the guest TSC (see
    // `irqchip::user::guest_tsc`), else through KVM_GET_MSRS.
    let offset = match sys::kvm::tsc_offset(&bsp.fd) {
        Ok(offset) => {
            let before = sys::clock::host_tsc();
            let guest = read_msr()?;
            let after = sys::clock::host_tsc();
            let plus = guest_tsc::is_host_tsc_plus(offset, before, guest, after);
            if !plus {
                tracing::debug!("guest TSC: not the host TSC plus KVM's offset (scaled?)");
            }
            plus.then_some(offset)
        }
        Err(e) => {
            tracing::debug!("guest TSC: KVM tells no TSC offset ({e})");
            None
        }
    };
    let read_tsc = move || match offset {
        Some(offset) => Ok(sys::clock::host_tsc().wrapping_add(offset)),
        None => read_msr(),
    };
    let mut chip = UserIrqChip::new(&chip_cfg, mem.clone(), read_tsc)?;
    // Re-anchoring reads the guest TSC with the offset of now: only where a pause cannot move
    // it (`vcpu::park`), else a map made after a resume would be early by the pause.
    if let Some(offset) = offset.filter(|_| !vcpus.tsc_movable) {
        chip.reanchor_tsc_with(Arc::new(move || {
            sys::clock::host_tsc().wrapping_add(offset)
        }));
    }
    Ok(Arc::new(chip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    #[test]
    fn maxphyaddr_comes_from_leaf_0x80000008() {
        let leaf = |eax| kvm_cpuid_entry2 {
            function: LEAF_ADDRESS_SIZES,
            eax,
            ..Default::default()
        };
        assert_eq!(max_phys_addr_bits(&[leaf(0x3027)]), 0x27);
        assert_eq!(max_phys_addr_bits(&[leaf(0x302e)]), 46);
        assert_eq!(max_phys_addr_bits(&[]), 36);
    }
}
