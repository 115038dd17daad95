//! Whether a VM is paused, shared by every clone of its `LiveVm` (`vm::pause_resume` pauses and
//! resumes it).

use std::sync::{Arc, Mutex};

use kvm_bindings::kvm_clock_data;

/// A pause in progress: when it began, and kvmclock then.
#[derive(Debug, Clone, Copy)]
pub(super) struct Paused {
    pub(super) monotonic: u64,
    pub(super) kvm_clock: Option<kvm_clock_data>,
}

/// Whether the VM is paused (shared by every clone of its `LiveVm`), and whether KVM can
/// move its TSC back by a pause.
#[derive(Debug, Default)]
pub struct PauseState {
    pub(super) paused: Mutex<Option<Paused>>,
    pub(super) tsc_movable: bool,
}

/// A fresh "not paused" state for a new `LiveVm`; `tsc_movable`: KVM can move its TSC.
pub fn not_paused(tsc_movable: bool) -> Arc<PauseState> {
    Arc::new(PauseState {
        paused: Mutex::new(None),
        tsc_movable,
    })
}

/// The state of a VM restored from a snapshot: paused since `monotonic`, with kvmclock at
/// `kvm_clock` (the snapshot's), so that `vm.resume` starts it where the snapshot left it.
pub fn paused_since(
    tsc_movable: bool,
    monotonic: u64,
    kvm_clock: Option<kvm_clock_data>,
) -> Arc<PauseState> {
    Arc::new(PauseState {
        paused: Mutex::new(Some(Paused {
            monotonic,
            kvm_clock,
        })),
        tsc_movable,
    })
}
