//! vCPUs: their set-up (CPUID, MSRs, boot state), the thread that runs each one, and the one
//! run loop both irqchip modes share.
//!
//! - [`configure`]: CPUID, MSRs and, for the boot CPU, the entry state.
//! - [`spawn`]: starts a vCPU's thread; the [`VcpuHandle`] names it.
//! - [`run`]: the vCPU state machine (runnable, halted, waiting for SIPI, stopped).
//! - [`exit`]: the exits the irqchip does not take, as a free function.
//! - [`kvm_port`]: the KVM adapter the irqchip acts through.
//! - [`park`]: a vCPU at the pause gate, and its TSC moved back by the pause.
//! - [`state`]: a vCPU's KVM state, read for a snapshot.

pub mod exit;
pub mod kvm_port;
pub mod park;
pub mod run;
pub mod state;

use std::sync::Arc;

use kvm_bindings::{kvm_fpu, kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

use crate::irqchip::VcpuIrq;
use crate::setup::boot::cpu_state::{self, EntryMode};
use crate::setup::cpuid;
use crate::state::VcpuShared;
pub use exit::DeviceBuses;
pub use kvm_port::{InjectPath, KvmPort};

const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;

/// Why a vCPU could not be set up or started.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// A KVM call failed.
    #[error("KVM call {call} on vCPU {id} failed: {source}")]
    Kvm {
        /// Which vCPU.
        id: u32,
        /// Which call.
        call: &'static str,
        /// Why.
        source: kvm_ioctls::Error,
    },
    /// The CPUID table has more entries than KVM takes (a lull bug).
    #[error("The CPUID table of vCPU {0} is too large for KVM")]
    CpuidTooLarge(u32),
    /// The vCPU's thread could not be started.
    #[error("Cannot start the thread of vCPU {id}: {source}")]
    Thread {
        /// Which vCPU.
        id: u32,
        /// Why.
        source: std::io::Error,
    },
}

/// What every vCPU's CPUID is made from.
#[derive(Debug, Clone, Copy)]
pub struct VcpuSetup<'a> {
    /// KVM's supported CPUID entries.
    pub supported_cpuid: &'a [kvm_bindings::kvm_cpuid_entry2],
    /// What lull changes in them (the same for every vCPU but its APIC ID).
    pub cpuid: cpuid::CpuidParams,
}

/// Gives vCPU `id` its CPUID and MSRs, and for the boot CPU, its entry state.
pub fn configure(
    vcpu: &VcpuFd,
    id: u32,
    setup: &VcpuSetup<'_>,
    entry: Option<EntryMode>,
) -> Result<(), VcpuError> {
    let kvm = |call: &'static str| move |source| VcpuError::Kvm { id, call, source };
    let entries = cpuid::adjust(setup.supported_cpuid, id, setup.cpuid);
    let kvm_cpuid = cpuid::to_kvm(&entries).map_err(|_| VcpuError::CpuidTooLarge(id))?;
    vcpu.set_cpuid2(&kvm_cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
    let misc_enable = kvm_msr_entry {
        index: MSR_IA32_MISC_ENABLE,
        data: MISC_ENABLE_FAST_STRING,
        ..Default::default()
    };
    // One entry always fits the MSR list.
    if let Ok(msrs) = Msrs::from_entries(&[misc_enable]) {
        vcpu.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
    }
    if let Some(mode) = entry {
        let fpu = kvm_fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        vcpu.set_fpu(&fpu).map_err(kvm("KVM_SET_FPU"))?;
        let mut sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
        cpu_state::configure_sregs(&mut sregs, mode);
        vcpu.set_sregs(&sregs).map_err(kvm("KVM_SET_SREGS"))?;
        vcpu.set_regs(&cpu_state::boot_regs(mode))
            .map_err(kvm("KVM_SET_REGS"))?;
    }
    Ok(())
}

/// A running vCPU thread.
#[derive(Debug)]
pub struct VcpuHandle {
    /// The vCPU's index.
    pub id: u32,
    /// Its thread (detached: the VM's stop ends it).
    pub thread: std::thread::JoinHandle<()>,
}

/// Starts vCPU `port.id`'s thread: it installs its seccomp filter and runs [`run::run`].
pub fn spawn(
    port: KvmPort,
    irq: Box<dyn VcpuIrq>,
    shared: Arc<VcpuShared>,
    buses: Arc<DeviceBuses>,
) -> Result<VcpuHandle, VcpuError> {
    let id = port.id;
    // Counted by the pause gate before its thread exists: a vm.pause that comes before the
    // thread reaches its loop waits for it to park there (counted from inside the thread, a
    // pause right after vm.boot could complete, and a snapshot be written, without it).
    shared.pause.thread_started();
    let gate = Arc::clone(&shared);
    // Its name, `vcpuN` as Cloud Hypervisor names them (libvirt finds the vCPU threads by it
    // in /proc to pin them), is set as the thread starts: wait until it has, so that whoever
    // learns the VM booted finds every vCPU thread by its name.
    let named = Arc::new(std::sync::Barrier::new(2));
    let started = Arc::clone(&named);
    let thread = std::thread::Builder::new()
        .name(format!("vcpu{id}"))
        .spawn(move || {
            started.wait();
            // Wake-ups at guest timer deadlines must not be batched (50 us by default); with
            // `--timer-slack` the user irqchip sets the slack asked for when it attaches.
            if let Err(e) = crate::host::sys::thread::set_timer_slack(1) {
                tracing::warn!(vcpu = id, "cannot set the vCPU thread's timer slack: {e}");
            }
            if let Err(e) = crate::host::seccomp::apply(crate::host::seccomp::ThreadKind::Vcpu) {
                shared.pause.thread_ended();
                shared.stop_from_thread(crate::state::StopReason::VmmError(e.to_string()));
                return;
            }
            run::run(port, irq, &shared, &buses);
        })
        .map_err(|source| {
            gate.pause.thread_ended();
            VcpuError::Thread { id, source }
        })?;
    named.wait();
    Ok(VcpuHandle { id, thread })
}
