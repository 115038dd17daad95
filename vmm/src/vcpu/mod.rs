//! vCPU set-up and the thread that runs one vCPU.

pub mod apic_base;
pub mod exit;
pub mod halt;
pub mod user;
pub mod user_exit;

use std::sync::Arc;

use kvm_bindings::{kvm_fpu, kvm_msr_entry, Msrs};
use kvm_ioctls::{VcpuExit, VcpuFd};

use crate::boot::cpu_state::{self, EntryMode};
use crate::cpuid;
use crate::kvm_vm::{ioctl_err, KvmError};
use crate::vm::VmShared;
use exit::{handle_exit, ExitContext, StopReason, VcpuAction};

const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;

/// Gives vCPU `id` its CPUID and MSRs, and for the boot CPU, its entry state.
pub fn configure(
    vcpu: &VcpuFd,
    id: u32,
    supported_cpuid: &[kvm_bindings::kvm_cpuid_entry2],
    cpus: u32,
    tsc_khz: u32,
    user_lapic: bool,
    entry: Option<EntryMode>,
) -> Result<(), KvmError> {
    let entries = cpuid::adjust(
        supported_cpuid,
        cpuid::CpuidParams {
            apic_id: id,
            cpus,
            tsc_khz,
            user_lapic,
        },
    );
    let kvm_cpuid = cpuid::to_kvm(&entries).map_err(|_| KvmError::Ioctl {
        call: "building the CPUID table",
        source: kvm_ioctls::Error::new(libc::E2BIG),
    })?;
    vcpu.set_cpuid2(&kvm_cpuid)
        .map_err(ioctl_err("KVM_SET_CPUID2"))?;
    let msrs = Msrs::from_entries(&[kvm_msr_entry {
        index: MSR_IA32_MISC_ENABLE,
        data: MISC_ENABLE_FAST_STRING,
        ..Default::default()
    }])
    .map_err(|_| KvmError::Ioctl {
        call: "building the MSR list",
        source: kvm_ioctls::Error::new(libc::E2BIG),
    })?;
    vcpu.set_msrs(&msrs).map_err(ioctl_err("KVM_SET_MSRS"))?;
    if let Some(mode) = entry {
        let fpu = kvm_fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        vcpu.set_fpu(&fpu).map_err(ioctl_err("KVM_SET_FPU"))?;
        let mut sregs = vcpu.get_sregs().map_err(ioctl_err("KVM_GET_SREGS"))?;
        cpu_state::configure_sregs(&mut sregs, mode);
        vcpu.set_sregs(&sregs).map_err(ioctl_err("KVM_SET_SREGS"))?;
        vcpu.set_regs(&cpu_state::boot_regs(mode))
            .map_err(ioctl_err("KVM_SET_REGS"))?;
    }
    Ok(())
}

/// Runs vCPU `id` until the VM stops. Meant to be the body of the vCPU's thread.
pub fn run_loop(mut vcpu: VcpuFd, id: u32, shared: Arc<VmShared>) {
    let index = usize::try_from(id).unwrap_or(usize::MAX);
    let Some(counters) = shared.vcpu_counters.get(index) else {
        shared
            .stop
            .request(StopReason::VmmError(format!("no counters for vCPU {id}")));
        return;
    };
    if let Err(e) = crate::seccomp::apply(crate::seccomp::ThreadKind::Vcpu) {
        shared.stop_from_thread(StopReason::VmmError(e.to_string()));
        return;
    }
    loop {
        if shared.stop.is_requested() {
            return;
        }
        let action = match vcpu.run() {
            Ok(VcpuExit::InternalError) => {
                VcpuAction::Stop(StopReason::GuestCrash(internal_error_detail(&mut vcpu)))
            }
            Ok(exit) => {
                let ctx = ExitContext {
                    vcpu: id,
                    pio: &shared.pio,
                    counters,
                    noise: &shared.noise,
                };
                handle_exit(exit, &ctx)
            }
            Err(e) if e.errno() == libc::EINTR => {
                counters
                    .interrupted
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                VcpuAction::Continue
            }
            Err(e) if e.errno() == libc::EAGAIN => VcpuAction::Continue,
            Err(e) => VcpuAction::Stop(StopReason::VmmError(format!("KVM_RUN on vCPU {id}: {e}"))),
        };
        match action {
            VcpuAction::Continue | VcpuAction::Halted => {}
            VcpuAction::BootComplete => shared.mark_booted(),
            VcpuAction::Stop(reason) => {
                shared.stop_from_thread(reason);
                return;
            }
        }
    }
}

/// Describes a KVM internal error: its sub-error and where the guest was.
fn internal_error_detail(vcpu: &mut VcpuFd) -> String {
    let run = vcpu.get_kvm_run();
    // SAFETY: KVM_RUN just returned KVM_EXIT_INTERNAL_ERROR, for which `internal` is the
    // member of the exit union KVM filled in.
    let suberror = unsafe { run.__bindgen_anon_1.internal.suberror };
    let rip = vcpu.get_regs().map(|r| r.rip).unwrap_or(0);
    format!("KVM internal error, suberror {suberror} (1 = instruction emulation failed) at rip {rip:#x}")
}
