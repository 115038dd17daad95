//! Pausing and resuming a running VM (`vm.pause`, `vm.resume`), with no guest time passing
//! while it is paused.
//!
//! ```text
//!  pause:  gate.request ─► chip.kick_to_pause ─► gate.wait_parked (every vCPU thread out of
//!          KVM_RUN, out of its halt, parked) ─► m = now: KVM_GET_CLOCK, chip.paused(m)
//!          (the VM clock stops), device refill timerfds disarmed, virtio devices quiesced
//!          (no tap poll or refill touches a queue)
//!  resume: p = now - m ─► KVM_SET_CLOCK (kvmclock goes on from where it was) ─► device
//!          refills re-armed p later, devices released ─► chip.resuming(p) (the VM clock
//!          goes on, host timers re-armed) ─► gate.release(p): each vCPU moves its TSC back
//!          by p, then runs ─► gate.wait_released: every parked vCPU has left the gate
//! ```
//! So every guest timer resumes with the guest time it had left: lull's LAPIC timers (one-shot,
//! periodic, TSC-deadline, PV deadline), the global timers and the device refills are
//! VM-clock deadlines, the VM clock stood still, and the guest TSC and kvmclock lose the pause
//! too. Where KVM cannot move the guest TSC (PVM hosts: `vcpu::park::tsc_movable`), nothing
//! moves back: the clocks only stand still while paused (no timer fires then), and on resume
//! guest time has run on; what came due meanwhile fires at once, each timer once, none early.
//! See `docs/API.md` ("Pause and resume") for what a guest sees.

use std::time::Duration;

use kvm_bindings::kvm_clock_data;
use timer::lock;

use super::live::LiveVm;
use super::pause_state::Paused;
use crate::host::sys::clock::monotonic_ns;
use crate::state::pause_gate::PauseWaitError;

/// How long the vCPUs have to reach the gate.
pub const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a pause or resume was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    /// `vm.pause` of a paused VM.
    #[error("The VM is already paused: resume it first")]
    AlreadyPaused,
    /// `vm.resume` of a VM that is not paused.
    #[error("The VM is not paused: pause it first")]
    NotPaused,
    /// The vCPUs could not all be stopped.
    #[error("Cannot pause the VM: {0}")]
    Wait(#[from] PauseWaitError),
}

impl LiveVm {
    /// Whether the VM is paused.
    pub fn is_paused(&self) -> bool {
        lock(&self.pause.paused).is_some()
    }

    /// kvmclock as it was when the VM paused (`None` if it is not paused or KVM would not tell).
    pub fn kvm_clock_at_pause(&self) -> Option<kvm_clock_data> {
        lock(&self.pause.paused).and_then(|p| p.kvm_clock)
    }

    /// Pauses the VM: returns once every vCPU thread is parked outside KVM_RUN and the VM's
    /// clocks stand still.
    pub fn pause(&self) -> Result<(), PauseError> {
        let mut state = lock(&self.pause.paused);
        if state.is_some() {
            return Err(PauseError::AlreadyPaused);
        }
        let asked = monotonic_ns();
        let gate = &self.shared.pause;
        gate.request();
        self.chip.kick_to_pause();
        if let Err(e) = gate.wait_parked(PAUSE_TIMEOUT) {
            // The clocks never stopped: the parked vCPUs go on as if nothing happened.
            gate.release(0);
            return Err(e.into());
        }
        let monotonic = monotonic_ns();
        let kvm_clock = match self.vm.get_clock() {
            Ok(clock) => Some(clock),
            Err(e) => {
                tracing::warn!("KVM_GET_CLOCK failed ({e}): kvmclock runs on while paused");
                None
            }
        };
        self.chip.paused(monotonic);
        self.shared.device_timers.pause();
        crate::snapshot::devices::quiesce(&self.buses.mmio, true);
        *state = Some(Paused {
            monotonic,
            kvm_clock,
        });
        tracing::info!(
            "VM paused: every vCPU stopped {} us after the request",
            monotonic.saturating_sub(asked) / 1_000
        );
        Ok(())
    }

    /// Resumes a paused VM; returns how long it was paused, and whether guest time stood
    /// still meanwhile (else KVM cannot move the guest TSC: guest time ran on).
    pub fn resume(&self) -> Result<(Duration, bool), PauseError> {
        let mut state = lock(&self.pause.paused);
        let paused = state.take().ok_or(PauseError::NotPaused)?;
        let paused_for = Duration::from_nanos(monotonic_ns().saturating_sub(paused.monotonic));
        let frozen = self.pause.tsc_movable;
        // 0: no shift anywhere; the VM clock, kvmclock and the TSC all count the pause.
        let paused_ns = if frozen {
            u64::try_from(paused_for.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1)
        } else {
            0
        };
        if let Some(clock) = paused.kvm_clock.filter(|_| frozen) {
            let again = kvm_clock_data {
                clock: clock.clock,
                ..Default::default()
            };
            if let Err(e) = self.vm.set_clock(&again) {
                tracing::warn!("KVM_SET_CLOCK failed ({e}): kvmclock counts the pause");
            }
        }
        self.shared.device_timers.resume(paused_ns);
        crate::snapshot::devices::quiesce(&self.buses.mmio, false);
        self.chip.resuming(paused_ns);
        self.shared.pause.release(paused_ns);
        // The reply to `vm.resume` means the vCPUs run again.
        if let Err(e) = self.shared.pause.wait_released(PAUSE_TIMEOUT) {
            tracing::warn!("{e}");
        }
        let guest_time = if frozen {
            "guest time stood still"
        } else {
            "guest time ran on: KVM cannot move this guest's TSC"
        };
        tracing::info!(
            "VM resumed after {} ms paused; {guest_time}",
            paused_for.as_millis()
        );
        Ok((paused_for, frozen))
    }
}
