//! The `central` model's timer thread across a pause, on the real clock, thread and timerfd:
//! a LAPIC timer armed before the pause, or while paused (a restored vCPU arms its timer
//! then), fires after the resume, at or after its deadline.
//!
//! The resume used to wake the thread at once as well (a timerfd write of 0, bypassing the
//! model): the thread found nothing due, its model believed the timerfd still armed for the
//! deadline and did not arm it again, and the timer never fired (a restored `central` VM
//! resumed at once hung).

use std::sync::Arc;
use std::time::{Duration, Instant};

use timer::{Clock, ModelKind, TimerKind};

use super::*;
use crate::config::knobs::{HaltPollMode, TimerAdvanceMode, TimerSlack, WakePlacementMode};
use crate::host::sys::clock::monotonic_ns;

/// How far ahead the timer is armed: long enough that the resume comes well before it.
const AHEAD_NS: u64 = 50_000_000;

/// A one-vCPU `central` chip on the VM clock with its timer thread running.
fn central_chip() -> (UserIrqChip, Arc<VcpuShared>) {
    let cfg = UserChipConfig {
        cpus: 1,
        model: ModelKind::Central,
        tsc_khz: 1_000_000,
        idle: IdleKnobs {
            halt_poll: HaltPollMode::Off,
            timer_advance: TimerAdvanceMode::Off,
            timer_slack: TimerSlack::Off,
            wake_placement: WakePlacementMode::Off,
            idle_inject: None,
            cpu_quota: None,
            global_timers: None,
        },
        pv_eoi: false,
        pv_deadline: false,
        x2apic: false,
        max_phys_addr_bits: 39,
    };
    let mem = Arc::new(
        vm_memory::GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 0x10000)]).unwrap(),
    );
    let mut tsc = 0u64;
    let chip = UserIrqChip::new(&cfg, mem, || {
        tsc += 1_000;
        Ok(tsc)
    })
    .unwrap();
    let shared = Arc::new(VcpuShared::new(1, Instant::now()).unwrap());
    chip.start(&shared).unwrap();
    (chip, shared)
}

/// Arms vCPU 0's LAPIC timer `AHEAD_NS` from now, before (`while_paused` false) or during a
/// pause; resumes; fails unless the timer thread flags it, at or after its deadline.
fn timer_fires_after_the_resume(while_paused: bool) {
    let (chip, shared) = central_chip();
    let mailbox = chip.router.mailbox(0).unwrap().clone();
    // The test thread stands for the blocked vCPU: a kick writes its eventfd.
    mailbox.set_blocked();
    let arm = |chip: &UserIrqChip| {
        let deadline = chip.clock.now() + AHEAD_NS;
        let mut parts = lock(&chip.parts);
        let (_, timers, _) = parts[0].as_mut().unwrap();
        timers.arm(TimerKind::Pinned, deadline, VcpuTimer::Lapic);
        deadline
    };
    let mut deadline = 0;
    if !while_paused {
        deadline = arm(&chip);
    }
    let paused_at = monotonic_ns();
    chip.paused(paused_at);
    if while_paused {
        deadline = arm(&chip);
    }
    chip.resuming(monotonic_ns() - paused_at);
    let woken =
        crate::host::sys::poll::wait(mailbox.kick_fd(), None, Some(Duration::from_secs(10)))
            .unwrap();
    let now = chip.clock.now();
    let fired = mailbox.take_timer_due();
    shared.stop.request(StopReason::Api);
    chip.kick_all();
    assert!(
        woken.kick && fired,
        "the timer armed {} the pause did not fire within 10 s of its deadline",
        if while_paused { "during" } else { "before" }
    );
    assert!(now >= deadline, "fired {} ns early", deadline - now);
}

#[test]
fn a_central_timer_armed_before_a_pause_fires_after_the_resume() {
    timer_fires_after_the_resume(false);
}

#[test]
fn a_central_timer_armed_while_paused_fires_after_the_resume() {
    timer_fires_after_the_resume(true);
}
