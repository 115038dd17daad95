//! The vCPU state machine, one for both irqchip modes (after Firecracker's explicit vCPU
//! states). Each state does one thing and names the next state:
//!
//! ```text
//!            before_entry: Enter                 exit: HLT
//!  Runnable ───────────────► KVM_RUN ─► exit ───────────────► Halted
//!     ▲  │                             │ │                      │ halted: Resume
//!     │  │ before_entry: WaitForSipi   │ └─ other exits ─► Runnable
//!     │  ▼                             │    (or Stopped with a reason)
//!  WaitingForSipi ─ SIPI ─► Runnable   ▼
//!     (INIT state)                  Stopped ◄── stop requested anywhere
//! ```
//! A pause request parks the thread at the top of the loop, in whatever state it is
//! ([`super::park`]); it then carries on in that state.
//!
//! The irqchip ([`VcpuIrq`]) decides everything about interrupts, timers and idling; this loop
//! only enters the guest, hands exits out (the chip first, then [`handle_exit`]) and turns
//! KVM's answers into states. The transitions are [`next_state`], a pure function.

use std::sync::atomic::Ordering;

use kvm_ioctls::VcpuExit;

use super::exit::{handle_exit, DeviceBuses, VcpuAction};
use super::kvm_port::KvmPort;
use super::park;
use crate::host::sys;
use crate::irqchip::{ChipExit, Entry, HaltEnd, VcpuIrq};
use crate::state::{StopReason, VcpuShared};

/// Where a vCPU is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuState {
    /// About to enter the guest.
    Runnable,
    /// Executed HLT; the irqchip polls or blocks.
    Halted,
    /// In INIT: waits for a start-up IPI.
    WaitingForSipi,
    /// Done; with the reason if this vCPU is the one that stops the VM.
    Stopped(Option<StopReason>),
}

/// What happened in the current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuEvent {
    /// The irqchip's verdict before an entry.
    BeforeEntry(Entry),
    /// The guest ran and exited; what the exit asks for.
    Exited(VcpuAction),
    /// A halt ended.
    HaltEnded(HaltEnd),
    /// The wait for SIPI ended: started (true) or the VM stops (false).
    SipiWaitEnded(bool),
    /// The VM is stopping (seen before doing anything).
    StopRequested,
}

/// lull's own time between KVM_RUN calls: from a return to the next call, less the time the
/// thread spent blocked in between (a halted vCPU's sleep is not work). Fed with timestamps and
/// the thread's running total of blocked time, so that it is a pure computation.
#[derive(Debug, Default)]
pub struct ExitClock {
    /// When KVM_RUN last returned, and the blocked total then.
    returned: Option<(u64, u64)>,
}

impl ExitClock {
    /// KVM_RUN returned at `now`; the thread had been blocked `blocked_ns` in all so far.
    pub fn returned(&mut self, now: u64, blocked_ns: u64) {
        self.returned = Some((now, blocked_ns));
    }

    /// KVM_RUN is about to be called at `now` (blocked total `blocked_ns`): the handling time
    /// since the last return, 0 before the first call.
    pub fn entering(&mut self, now: u64, blocked_ns: u64) -> u64 {
        self.returned.take().map_or(0, |(at, blocked_then)| {
            now.saturating_sub(at)
                .saturating_sub(blocked_ns.saturating_sub(blocked_then))
        })
    }
}

/// The transition function of the vCPU state machine.
pub fn next_state(event: VcpuEvent) -> VcpuState {
    match event {
        VcpuEvent::BeforeEntry(Entry::Enter) => VcpuState::Runnable,
        VcpuEvent::BeforeEntry(Entry::WaitForSipi) => VcpuState::WaitingForSipi,
        VcpuEvent::BeforeEntry(Entry::Stop) | VcpuEvent::StopRequested => VcpuState::Stopped(None),
        VcpuEvent::Exited(VcpuAction::Continue | VcpuAction::BootComplete) => VcpuState::Runnable,
        VcpuEvent::Exited(VcpuAction::Halted) => VcpuState::Halted,
        VcpuEvent::Exited(VcpuAction::Stop(reason)) => VcpuState::Stopped(Some(reason)),
        VcpuEvent::HaltEnded(HaltEnd::Resume) | VcpuEvent::SipiWaitEnded(true) => {
            VcpuState::Runnable
        }
        VcpuEvent::HaltEnded(HaltEnd::Stop) | VcpuEvent::SipiWaitEnded(false) => {
            VcpuState::Stopped(None)
        }
    }
}

/// Runs the vCPU until the VM stops, its exits reaching `buses`. The body of the vCPU's thread,
/// counted by the pause gate from before the thread starts (`spawn`) until this returns.
pub fn run(mut port: KvmPort, mut irq: Box<dyn VcpuIrq>, shared: &VcpuShared, buses: &DeviceBuses) {
    irq.attach(&mut port);
    // A vCPU restored from a snapshot taken in its halt halts again.
    let mut state = match irq.take_restored_halt() {
        true => VcpuState::Halted,
        false => VcpuState::Runnable,
    };
    let mut exit_clock = ExitClock::default();
    // The irqchip ends a halt, a wait for SIPI or an entry with `Stop` for a pause request
    // too: then the vCPU parks at the top of the loop and goes back to the state it was in.
    let stopping = || shared.stop.is_requested();
    let reason = loop {
        let event = match state {
            VcpuState::Stopped(reason) => break reason,
            _ if stopping() => VcpuEvent::StopRequested,
            _ if shared.pause.is_requested() => {
                match park::park(&mut port, irq.as_mut(), shared, state == VcpuState::Halted) {
                    Ok(()) => continue,
                    Err(reason) => VcpuEvent::Exited(VcpuAction::Stop(reason)),
                }
            }
            VcpuState::Runnable => match irq.before_entry(&mut port) {
                Entry::Enter => VcpuEvent::Exited(enter_guest(
                    &mut port,
                    irq.as_mut(),
                    shared,
                    buses,
                    &mut exit_clock,
                )),
                Entry::Stop if !stopping() => continue,
                other => VcpuEvent::BeforeEntry(other),
            },
            VcpuState::Halted => match irq.halted(&mut port) {
                HaltEnd::Stop if !stopping() => continue,
                end => VcpuEvent::HaltEnded(end),
            },
            VcpuState::WaitingForSipi => match wait_for_sipi(&mut port, irq.as_mut()) {
                Ok(false) if !stopping() => continue,
                Ok(started) => VcpuEvent::SipiWaitEnded(started),
                Err(reason) => VcpuEvent::Exited(VcpuAction::Stop(reason)),
            },
        };
        if let VcpuEvent::Exited(VcpuAction::BootComplete) = event {
            shared.mark_booted();
        }
        state = next_state(event);
    };
    irq.detach(&mut port);
    shared.pause.thread_ended();
    match reason {
        Some(reason) => shared.stop_from_thread(reason),
        None => shared.thread_ended(),
    }
}

/// INIT, then the wait for SIPI; true once started at the SIPI's vector.
fn wait_for_sipi(port: &mut KvmPort, irq: &mut dyn VcpuIrq) -> Result<bool, StopReason> {
    let id = port.id;
    let failed = |call: &str, e: kvm_ioctls::Error| {
        StopReason::VmmError(format!("{call} on vCPU {id}: {e}"))
    };
    port.reset_to_init()
        .map_err(|e| failed("KVM_SET_REGS/SREGS (INIT)", e))?;
    let Some(vector) = irq.wait_for_sipi(port) else {
        return Ok(false);
    };
    port.start_at_sipi(vector)
        .map_err(|e| failed("KVM_SET_REGS/SREGS (SIPI)", e))?;
    Ok(true)
}

/// One KVM_RUN and the handling of its exit; the time since the last return goes to the
/// vCPU's `exit_handling_ns`.
fn enter_guest(
    port: &mut KvmPort,
    irq: &mut dyn VcpuIrq,
    shared: &VcpuShared,
    buses: &DeviceBuses,
    exit_clock: &mut ExitClock,
) -> VcpuAction {
    let id = port.id;
    let Some(counters) = shared.counters(id) else {
        return VcpuAction::Stop(StopReason::VmmError(format!("no counters for vCPU {id}")));
    };
    let blocked = || counters.blocked_ns.load(Ordering::Relaxed);
    let handling = exit_clock.entering(sys::clock::monotonic_ns(), blocked());
    counters
        .exit_handling_ns
        .fetch_add(handling, Ordering::Relaxed);
    let result = port.fd.run();
    exit_clock.returned(sys::clock::monotonic_ns(), blocked());
    irq.after_run(sys::kick::registered_cr8());
    let action = match result {
        Ok(VcpuExit::InternalError) => VcpuAction::Stop(StopReason::GuestCrash(format!(
            "KVM internal error on vCPU {id}, suberror {} (1 = instruction emulation failed)",
            sys::kvm::internal_error_suberror(&mut port.fd)
        ))),
        Ok(exit) => match irq.handle_exit(exit) {
            Ok(ChipExit::Continue) => VcpuAction::Continue,
            Ok(ChipExit::Stop(reason)) => VcpuAction::Stop(reason),
            Err(exit) => handle_exit(exit, &buses.exit_context(id, counters)),
        },
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
            counters.interrupted.fetch_add(1, Ordering::Relaxed);
            VcpuAction::Continue
        }
        Err(e) => VcpuAction::Stop(StopReason::VmmError(format!("KVM_RUN on vCPU {id}: {e}"))),
    };
    irq.exit_done(port);
    action
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_handling_leaves_out_the_time_blocked() {
        let mut clock = ExitClock::default();
        assert_eq!(
            clock.entering(1_000, 0),
            0,
            "nothing to measure before the first run"
        );
        clock.returned(10_000, 500);
        // 7 us from the return to the next entry, 4 us of it blocked: 3 us of handling.
        assert_eq!(clock.entering(17_000, 4_500), 3_000);
        // Each return is measured once.
        assert_eq!(clock.entering(20_000, 4_500), 0);
        clock.returned(30_000, 4_500);
        assert_eq!(clock.entering(30_250, 4_500), 250);
    }

    #[test]
    fn exits_and_halts_lead_where_the_diagram_says() {
        use VcpuEvent as E;
        use VcpuState as S;
        assert_eq!(next_state(E::BeforeEntry(Entry::Enter)), S::Runnable);
        assert_eq!(
            next_state(E::BeforeEntry(Entry::WaitForSipi)),
            S::WaitingForSipi
        );
        assert_eq!(next_state(E::Exited(VcpuAction::Halted)), S::Halted);
        assert_eq!(next_state(E::Exited(VcpuAction::BootComplete)), S::Runnable);
        assert_eq!(next_state(E::HaltEnded(HaltEnd::Resume)), S::Runnable);
        assert_eq!(next_state(E::SipiWaitEnded(true)), S::Runnable);
        assert_eq!(
            next_state(E::Exited(VcpuAction::Stop(StopReason::Reset))),
            S::Stopped(Some(StopReason::Reset))
        );
        for stop in [
            E::StopRequested,
            E::BeforeEntry(Entry::Stop),
            E::HaltEnded(HaltEnd::Stop),
            E::SipiWaitEnded(false),
        ] {
            assert_eq!(next_state(stop), S::Stopped(None));
        }
    }
}
