//! lull's documented exit statuses (also in `lull --help` and docs/GUEST-ABI.md). Odd codes
//! come from the guest's test-exit port; even ones are lull's own.

use crate::config::ConfigError;
use crate::state::StopReason;
use crate::vm::kvm::KvmError;
use crate::vm::VmError;

/// The guest reset or powered off the machine.
pub const GUEST_RESET: i32 = 0;
/// Bad command line (clap's own code).
pub const USAGE: i32 = 2;
/// Bad input: kernel, initramfs, config file, memory size, CPU count, API socket path, disk
/// image (or one another process holds), tap device, contradictory flags, an output path that
/// is an input, a serial file that cannot be written, or the host out of file descriptors or
/// memory.
pub const BAD_INPUT: i32 = 4;
/// KVM unavailable.
pub const KVM_UNAVAILABLE: i32 = 6;
/// lull failed while running the guest.
pub const VMM_FAILURE: i32 = 8;
/// The guest crashed.
pub const GUEST_CRASH: i32 = 10;
/// Stopped by the user.
pub const USER_STOP: i32 = 12;
/// Stopped through the management API (`vm.shutdown`, `vmm.shutdown`).
pub const API_STOP: i32 = 14;

/// The status for a finished run.
pub fn for_stop(reason: &StopReason) -> i32 {
    match reason {
        StopReason::Reset | StopReason::PowerOff => GUEST_RESET,
        StopReason::TestExit(status) => i32::from(*status),
        StopReason::TripleFault | StopReason::GuestCrash(_) => GUEST_CRASH,
        StopReason::VmmError(_) => VMM_FAILURE,
        StopReason::User | StopReason::Signal(_) => USER_STOP,
        StopReason::Api => API_STOP,
        StopReason::OutputFailed(_) => BAD_INPUT,
    }
}

/// What to raise when `e` (or one of its causes) says the host ran out of a resource: file
/// descriptors (EMFILE, ENFILE) or memory (ENOMEM). Such a failure is bad input (status 4): the
/// limits lull was started with are too small for the VM asked of it.
pub fn exhausted_resource(e: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        let errno = c
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .or_else(|| {
                c.downcast_ref::<vmm_sys_util::errno::Error>()
                    .map(|e| e.errno())
            });
        match errno {
            Some(libc::EMFILE) => {
                return Some(
                    "lull ran out of file descriptors: raise its limit (`ulimit -n`, \
                     LimitNOFILE= in a systemd unit) or give the VM fewer vCPUs, disks and nets",
                )
            }
            Some(libc::ENFILE) => {
                return Some(
                    "the host ran out of file descriptors: raise fs.file-max (sysctl) or stop \
                     other processes",
                )
            }
            Some(libc::ENOMEM) => {
                return Some(
                    "the host refused memory: give the VM less --memory or raise lull's limits \
                     (`ulimit -v`, `ulimit -l`, the cgroup's memory.max)",
                )
            }
            _ => cause = c.source(),
        }
    }
    None
}

/// The status for a configuration error.
pub fn for_config_error(_e: &ConfigError) -> i32 {
    BAD_INPUT
}

/// The status for a VM that could not be built or run.
pub fn for_vm_error(e: &VmError) -> i32 {
    if exhausted_resource(e).is_some() {
        return BAD_INPUT;
    }
    match e {
        VmError::Guest(_)
        | VmError::Input(_)
        | VmError::Boot(_)
        | VmError::SerialFile { .. }
        | VmError::MetricsFile { .. }
        | VmError::Disk(_)
        | VmError::Net(_)
        | VmError::Snapshot(_) => BAD_INPUT,
        VmError::Kvm(k) if k.is_unavailable() => KVM_UNAVAILABLE,
        VmError::Kvm(KvmError::TooManyCpus { .. } | KvmError::AllocMemory { .. }) => BAD_INPUT,
        VmError::Kvm(_)
        | VmError::Vcpu(_)
        | VmError::IrqChip(_)
        | VmError::Bus(_)
        | VmError::MmioBus(_)
        | VmError::Host { .. }
        | VmError::SerialPty(_)
        | VmError::EventLoop(_)
        | VmError::Seccomp(_)
        | VmError::Restore(_) => VMM_FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_codes_are_odd_and_lull_codes_even() {
        for code in [
            USAGE,
            BAD_INPUT,
            KVM_UNAVAILABLE,
            VMM_FAILURE,
            GUEST_CRASH,
            USER_STOP,
            API_STOP,
        ] {
            assert_eq!(code % 2, 0);
        }
        assert_eq!(for_stop(&StopReason::TestExit(7)), 7);
        assert_eq!(for_stop(&StopReason::Reset), 0);
        assert_eq!(for_stop(&StopReason::TripleFault), GUEST_CRASH);
        assert_eq!(for_stop(&StopReason::Api), API_STOP);
    }

    #[test]
    fn running_out_of_descriptors_or_memory_is_bad_input_with_a_hint() {
        let host = |errno| VmError::Host {
            what: "the stop eventfd",
            source: std::io::Error::from_raw_os_error(errno),
        };
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOMEM] {
            assert_eq!(for_vm_error(&host(errno)), BAD_INPUT);
            assert!(exhausted_resource(&host(errno)).is_some());
        }
        assert_eq!(for_vm_error(&host(libc::EINVAL)), VMM_FAILURE);
        assert!(exhausted_resource(&host(libc::EINVAL)).is_none());
        let kvm = VmError::Kvm(KvmError::Ioctl {
            call: "KVM_CREATE_VCPU",
            source: kvm_ioctls::Error::new(libc::EMFILE),
        });
        assert_eq!(for_vm_error(&kvm), BAD_INPUT);
    }
}
