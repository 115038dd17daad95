//! Opening KVM, creating the VM, its memory slots and (in `kernel` mode) its in-kernel irqchip.

use std::path::Path;
use std::sync::Arc;

use kvm_bindings::{kvm_enable_cap, KVM_CAP_X86_USER_SPACE_MSR};
use kvm_ioctls::{
    Cap, Kvm, MsrExitReason, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VmFd,
};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::setup::layout::{self, KVM_IDENTITY_MAP_ADDR, KVM_TSS_ADDR};

/// Why KVM could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    /// `/dev/kvm` is missing.
    #[error("/dev/kvm does not exist: load the kvm module or run lull on a host with KVM")]
    NoDevice,
    /// `/dev/kvm` is not accessible.
    #[error("No permission to open /dev/kvm: run as root or add your user to the 'kvm' group")]
    NoPermission,
    /// Opening `/dev/kvm` failed otherwise.
    #[error("Cannot open /dev/kvm: {0}")]
    Open(kvm_ioctls::Error),
    /// The KVM API version is not 12.
    #[error("KVM API version {0} is not supported (need 12)")]
    ApiVersion(i32),
    /// A capability lull needs is missing.
    #[error("This KVM lacks {0:?}, which lull needs")]
    MissingCap(Cap),
    /// More vCPUs than KVM allows.
    #[error("--cpus {asked} exceeds this host's KVM limit of {max} vCPUs")]
    TooManyCpus {
        /// Requested.
        asked: u32,
        /// KVM's limit.
        max: usize,
    },
    /// The VM has no vCPU (a lull bug: the CPU count is validated before).
    #[error("The VM has no vCPU")]
    NoVcpus,
    /// Guest memory could not be allocated.
    #[error("Cannot allocate {size} bytes of guest memory: {source}")]
    AllocMemory {
        /// Requested size.
        size: u64,
        /// Why.
        source: vm_memory::mmap::FromRangesError,
    },
    /// A KVM call failed.
    #[error("KVM call {call} failed: {source}")]
    Ioctl {
        /// Which call.
        call: &'static str,
        /// Why.
        source: kvm_ioctls::Error,
    },
}

impl KvmError {
    /// True when the host cannot run lull at all (vs. a failure while setting up).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::NoDevice
                | Self::NoPermission
                | Self::Open(_)
                | Self::ApiVersion(_)
                | Self::MissingCap(_)
        )
    }
}

/// Wraps a failing KVM call.
pub fn ioctl_err(call: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> KvmError {
    move |source| KvmError::Ioctl { call, source }
}

/// Opens `/dev/kvm` and checks what lull relies on.
pub fn open_kvm(cpus: u32) -> Result<Kvm, KvmError> {
    if !Path::new("/dev/kvm").exists() {
        return Err(KvmError::NoDevice);
    }
    let kvm = Kvm::new().map_err(|e| match e.errno() {
        libc::EACCES | libc::EPERM => KvmError::NoPermission,
        libc::ENOENT => KvmError::NoDevice,
        _ => KvmError::Open(e),
    })?;
    let api = kvm.get_api_version();
    if api != 12 {
        return Err(KvmError::ApiVersion(api));
    }
    for cap in [
        Cap::Irqchip,
        Cap::UserMemory,
        Cap::SetTssAddr,
        Cap::ImmediateExit,
        Cap::Irqfd,
    ] {
        if !kvm.check_extension(cap) {
            return Err(KvmError::MissingCap(cap));
        }
    }
    let max = kvm.get_max_vcpus();
    if usize::try_from(cpus).map_or(true, |c| c > max) {
        return Err(KvmError::TooManyCpus { asked: cpus, max });
    }
    Ok(kvm)
}

/// Allocates guest RAM for `memory` bytes.
pub fn create_guest_memory(memory: u64) -> Result<GuestMemoryMmap, KvmError> {
    let ranges: Vec<(GuestAddress, usize)> = layout::ram_ranges(memory)
        .into_iter()
        .map(|(start, len)| {
            (
                GuestAddress(start),
                usize::try_from(len).unwrap_or(usize::MAX),
            )
        })
        .collect();
    GuestMemoryMmap::from_ranges(&ranges).map_err(|source| KvmError::AllocMemory {
        size: memory,
        source,
    })
}

/// Which interrupt controller a new VM gets from KVM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmChip {
    /// KVM's in-kernel LAPIC/IOAPIC/PIC (`--irqchip kernel`).
    InKernel,
    /// None from KVM: lull's own LAPIC and IOAPIC (`--irqchip user`), the LAPIC's MSRs sent
    /// to user space; with `pv_eoi`, MSR_KVM_PV_EOI_EN too.
    User {
        /// Whether lull implements PV EOI.
        pv_eoi: bool,
    },
}

/// Creates the VM with its interrupt controller `chip` and registers `mem` with it.
///
/// For the user irqchip the MSR filter is set first, on the VM with no memory yet:
/// `KVM_X86_SET_MSR_FILTER` waits for an SRCU grace period (`synchronize_srcu`), which after
/// the memory slots' own grace periods took 13-16 ms in about one restore of three here
/// (a clone's restore-to-running went from ~5 to ~19 ms), and returns at once before them.
pub fn create_vm(kvm: &Kvm, mem: &Arc<GuestMemoryMmap>, chip: VmChip) -> Result<VmFd, KvmError> {
    let vm = kvm.create_vm().map_err(ioctl_err("KVM_CREATE_VM"))?;
    if let VmChip::User { pv_eoi } = chip {
        enable_user_msr_exits(kvm, &vm, pv_eoi)?;
    }
    crate::host::sys::kvm::register_guest_memory(&vm, mem)
        .map_err(ioctl_err("KVM_SET_USER_MEMORY_REGION"))?;
    let tss = usize::try_from(KVM_TSS_ADDR).unwrap_or(usize::MAX);
    vm.set_identity_map_address(KVM_IDENTITY_MAP_ADDR)
        .map_err(ioctl_err("KVM_SET_IDENTITY_MAP_ADDR"))?;
    vm.set_tss_address(tss)
        .map_err(ioctl_err("KVM_SET_TSS_ADDR"))?;
    if chip == VmChip::InKernel {
        vm.create_irq_chip()
            .map_err(ioctl_err("KVM_CREATE_IRQCHIP"))?;
    }
    Ok(vm)
}

/// MSRs whose accesses must reach lull's LAPIC although KVM knows them: IA32_APIC_BASE and
/// IA32_TSC_DEADLINE. (x2APIC MSRs 0x800-0x8ff reach user space as invalid without a filter.)
const FILTERED_MSRS: [u32; 2] = [0x1b, 0x6e0];
/// MSR_KVM_PV_EOI_EN: KVM would store it and do nothing (it drives PV EOI only for its own
/// LAPIC); lull implements PV EOI itself.
const MSR_KVM_PV_EOI_EN: u32 = 0x4b56_4d04;

/// Sends LAPIC MSRs (and every MSR KVM would fault on) to user space, for `--irqchip user`;
/// with `pv_eoi`, MSR_KVM_PV_EOI_EN too.
fn enable_user_msr_exits(kvm: &Kvm, vm: &VmFd, pv_eoi: bool) -> Result<(), KvmError> {
    for cap in [Cap::X86UserSpaceMsr, Cap::X86MsrFilter] {
        if !kvm.check_extension(cap) {
            return Err(KvmError::MissingCap(cap));
        }
    }
    let reasons = MsrExitReason::Filter | MsrExitReason::Inval | MsrExitReason::Unknown;
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_X86_USER_SPACE_MSR,
        ..Default::default()
    };
    cap.args[0] = u64::from(reasons.bits());
    vm.enable_cap(&cap)
        .map_err(ioctl_err("KVM_ENABLE_CAP(X86_USER_SPACE_MSR)"))?;
    // A bitmap bit of 0 denies the access, which makes it exit with reason FILTER.
    let deny = [0u8; 1];
    let pv_eoi_msr = pv_eoi.then_some(MSR_KVM_PV_EOI_EN);
    let ranges: Vec<MsrFilterRange<'_>> = FILTERED_MSRS
        .iter()
        .copied()
        .chain(pv_eoi_msr)
        .map(|base| MsrFilterRange {
            flags: MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE,
            base,
            msr_count: 1,
            bitmap: &deny,
        })
        .collect();
    vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &ranges)
        .map_err(ioctl_err("KVM_X86_SET_MSR_FILTER"))
}
