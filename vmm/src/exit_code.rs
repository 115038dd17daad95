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
/// image, tap device.
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
    }
}

/// The status for a configuration error.
pub fn for_config_error(_e: &ConfigError) -> i32 {
    BAD_INPUT
}

/// The status for a VM that could not be built or run.
pub fn for_vm_error(e: &VmError) -> i32 {
    match e {
        VmError::Guest(_)
        | VmError::Boot(_)
        | VmError::SerialFile { .. }
        | VmError::MetricsFile { .. }
        | VmError::Disk(_)
        | VmError::Net(_) => BAD_INPUT,
        VmError::Kvm(k) if k.is_unavailable() => KVM_UNAVAILABLE,
        VmError::Kvm(KvmError::TooManyCpus { .. } | KvmError::AllocMemory { .. }) => BAD_INPUT,
        VmError::Kvm(_)
        | VmError::Vcpu(_)
        | VmError::IrqChip(_)
        | VmError::Bus(_)
        | VmError::MmioBus(_)
        | VmError::Host { .. }
        | VmError::EventLoop(_)
        | VmError::Seccomp(_) => VMM_FAILURE,
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
}
