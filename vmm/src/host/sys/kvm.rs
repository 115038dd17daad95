//! KVM calls that need `unsafe`: the ioctls kvm-ioctls does not wrap (KVM_INTERRUPT,
//! KVM_GET_STATS_FD, a vCPU's KVM_GET_DEVICE_ATTR and KVM_SET_DEVICE_ATTR for its TSC
//! offset), memory-slot registration, and reading the internal-error member of the exit union.

use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;

use kvm_bindings::{
    kvm_device_attr, kvm_interrupt, kvm_userspace_memory_region, KVM_VCPU_TSC_CTRL,
    KVM_VCPU_TSC_OFFSET,
};
use kvm_ioctls::{VcpuFd, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::ioctl::{ioctl, ioctl_with_ref};

/// The ioctl numbers.
mod nr {
    #[allow(unused_imports)]
    use ioctl_ioc_nr as _;
    use vmm_sys_util::{ioctl_io_nr, ioctl_ioc_nr, ioctl_iow_nr};

    const KVMIO: u32 = 0xAE;
    ioctl_iow_nr!(KVM_INTERRUPT, KVMIO, 0x86, kvm_bindings::kvm_interrupt);
    ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);
    ioctl_iow_nr!(
        KVM_GET_DEVICE_ATTR,
        KVMIO,
        0xe2,
        kvm_bindings::kvm_device_attr
    );
    ioctl_iow_nr!(
        KVM_SET_DEVICE_ATTR,
        KVMIO,
        0xe1,
        kvm_bindings::kvm_device_attr
    );
}

/// KVM_INTERRUPT: queues external interrupt `vector` for the next entry of `vcpu` (only
/// without an in-kernel irqchip; at most one per KVM_RUN).
pub fn inject_interrupt(vcpu: &VcpuFd, vector: u8) -> std::io::Result<()> {
    let irq = kvm_interrupt {
        irq: u32::from(vector),
    };
    // SAFETY: KVM_INTERRUPT reads one kvm_interrupt from `irq`, which outlives the call;
    // `vcpu` is a live vCPU fd.
    errno_result(unsafe { ioctl_with_ref(vcpu, nr::KVM_INTERRUPT(), &irq) })
}

/// The TSC offset KVM adds to the host TSC for `vcpu` (KVM_VCPU_TSC_OFFSET, Linux 5.16+): the
/// guest TSC is the host TSC plus this (wrapping), unless KVM scales the guest's TSC.
pub fn tsc_offset(vcpu: &VcpuFd) -> std::io::Result<u64> {
    let mut offset: u64 = 0;
    let attr = tsc_offset_attr(std::ptr::addr_of_mut!(offset) as u64);
    // SAFETY: KVM_GET_DEVICE_ATTR reads `attr` and writes one u64 (the offset) to `attr.addr`,
    // which points at `offset`; both outlive the call. `vcpu` is a live vCPU fd.
    let rc = unsafe { ioctl_with_ref(vcpu, nr::KVM_GET_DEVICE_ATTR(), &attr) };
    errno_result(rc).map(|()| offset)
}

/// The device attribute of a vCPU's TSC offset, its value at `addr`.
fn tsc_offset_attr(addr: u64) -> kvm_device_attr {
    kvm_device_attr {
        flags: 0,
        group: KVM_VCPU_TSC_CTRL,
        attr: u64::from(KVM_VCPU_TSC_OFFSET),
        addr,
    }
}

/// An ioctl's return code as a result.
fn errno_result(rc: i32) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sets the TSC offset KVM adds to the host TSC for `vcpu` (KVM_VCPU_TSC_OFFSET, Linux 5.16+):
/// how lull moves a vCPU's TSC back by the time the VM was paused.
pub fn set_tsc_offset(vcpu: &VcpuFd, offset: u64) -> std::io::Result<()> {
    let attr = tsc_offset_attr(std::ptr::addr_of!(offset) as u64);
    // SAFETY: KVM_SET_DEVICE_ATTR reads `attr` and one u64 (the offset) from `attr.addr`,
    // which points at `offset`; both outlive the call. `vcpu` is a live vCPU fd.
    errno_result(unsafe { ioctl_with_ref(vcpu, nr::KVM_SET_DEVICE_ATTR(), &attr) })
}

/// KVM_SET_XSAVE: gives `vcpu` the FPU/SSE/AVX state of a snapshot.
pub fn set_xsave(vcpu: &VcpuFd, xsave: &kvm_bindings::kvm_xsave) -> Result<(), kvm_ioctls::Error> {
    // SAFETY: `xsave` is a whole kvm_xsave (4 KiB, what KVM_GET_XSAVE filled in), so KVM reads
    // no more than the struct holds; `vcpu` is a live vCPU fd.
    unsafe { vcpu.set_xsave(xsave) }
}

/// A binary statistics fd for a VM or vCPU fd (Linux 5.14+); `None` where KVM has none.
pub fn stats_fd(fd: &impl AsRawFd) -> Option<std::fs::File> {
    // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1; `fd` is a live
    // KVM VM or vCPU fd.
    let raw = unsafe { ioctl(fd, nr::KVM_GET_STATS_FD()) };
    if raw < 0 {
        return None;
    }
    // SAFETY: `raw` is a fresh descriptor returned to us and owned by nobody else.
    Some(unsafe { std::fs::File::from_raw_fd(raw) })
}

/// Registers every region of `mem` with `vm` as KVM memory slots 0, 1, ...
///
/// The mappings must outlive the VM: this keeps a reference to `mem` for the life of the
/// process (lull runs one VM per process), so no caller can unmap it under the guest.
pub fn register_guest_memory(
    vm: &VmFd,
    mem: &Arc<GuestMemoryMmap>,
) -> Result<(), kvm_ioctls::Error> {
    for (slot, region) in mem.iter().enumerate() {
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|_| kvm_ioctls::Error::new(libc::EFAULT))?;
        let entry = kvm_userspace_memory_region {
            slot: u32::try_from(slot).map_err(|_| kvm_ioctls::Error::new(libc::E2BIG))?,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: `host` points to a live mapping of `region.len()` bytes owned by `mem`,
        // which is kept alive for the rest of the process below; the regions of one
        // GuestMemoryMmap are disjoint, so the slots do not overlap.
        unsafe { vm.set_user_memory_region(entry) }?;
    }
    std::mem::forget(Arc::clone(mem));
    Ok(())
}

/// The sub-error of the KVM_EXIT_INTERNAL_ERROR that KVM_RUN just returned on `vcpu`.
pub fn internal_error_suberror(vcpu: &mut VcpuFd) -> u32 {
    let run = vcpu.get_kvm_run();
    if run.exit_reason != kvm_bindings::KVM_EXIT_INTERNAL_ERROR {
        return 0;
    }
    // SAFETY: the exit reason is KVM_EXIT_INTERNAL_ERROR, for which `internal` is the member
    // of the exit union KVM filled in.
    unsafe { run.__bindgen_anon_1.internal.suberror }
}
