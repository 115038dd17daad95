//! Deferred ticks at the chip (`lapic_timer_host/tick_defer.rs`): a short deadline armed inside the
//! guest's handler, the HLT that takes it, and deferred ticks that fire (a miss, or late).

use super::*;

use crate::irqchip::user::lapic_timer_host::tick_defer::GRACE_NS;

/// vCPU 0 in `kind`, inside its timer handler (interrupts off) at 1 ms: its LVT timer in
/// TSC-deadline mode (vector 0x40), a deadline 77 us ahead written, EOI, entered again; the
/// deadline, whose host tick is deferred.
fn deferred_in_handler(kind: ModelKind) -> (Rig, u64) {
    let mut rig = Rig::new(kind);
    rig.mmio_write(0x320, 0x4_0040);
    let deadline = 1_077_000; // 1 TSC tick per ns from 0
    rig.clock.set(1_000_000);
    rig.port.open = false;
    rig.wrmsr(0x6e0, deadline);
    rig.eoi();
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(
        rig.tick.deadline(),
        deadline + GRACE_NS,
        "{kind:?}: not deferred"
    );
    (rig, deadline)
}

/// A short deadline the guest arms inside its handler (interrupts off) gets no host tick
/// before the deadline: the HLT that follows the handler is where the interrupt is injected,
/// on that same exit; an exit with interrupts enabled before it puts the tick back in place.
#[test]
fn a_short_deadline_armed_with_interrupts_off_waits_for_the_guests_next_exit() {
    let mut rig = Rig::new(ModelKind::Pull);
    rig.mmio_write(0x320, 0x4_0040); // LVT timer: TSC-deadline mode, vector 0x40
    let deadline = 1_077_000; // 1 TSC tick per ns from 0
    rig.clock.set(1_000_000);
    rig.port.open = false; // inside the handler
    rig.wrmsr(0x6e0, deadline);
    rig.eoi();
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.tick.deadline(), deadline + GRACE_NS);
    // The handler's tail outlasts the deadline; then `sti; hlt`.
    rig.clock.set(deadline + 30_000);
    rig.port.open = true;
    assert_eq!(rig.irq.halted(&mut rig.port), HaltEnd::Resume);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x40]);
    assert_eq!(
        rig.tick.deadline(),
        timer::NEVER,
        "the deferred tick left armed would interrupt the guest for nothing"
    );
    let c = rig.shared.counters(0).unwrap().clone();
    assert_eq!(c.ticks_deferred.load(Ordering::Relaxed), 1);
    assert_eq!(c.ticks_deferred_missed.load(Ordering::Relaxed), 0);
    assert_eq!(c.lapic_timer_fires.load(Ordering::Relaxed), 1);

    // Next: the guest leaves its handler and exits with interrupts enabled before the
    // deadline: the tick is back at the deadline (no advance here), nothing early.
    rig.eoi();
    rig.port.open = false;
    let next = deadline + 200_000;
    rig.clock.set(next - 77_000);
    rig.wrmsr(0x6e0, next);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.tick.deadline(), next + GRACE_NS);
    rig.clock.set(next - 20_000);
    rig.port.open = true;
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.tick.deadline(), next);
    assert_eq!(rig.port.injected, vec![0x40], "nothing before the deadline");
    rig.clock.set(next);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x40, 0x40]);
}

/// A deferred tick that fires finds the guest running on without an exit: the interrupt
/// still comes (late by at most the grace), and the vCPU arms its next short deadline with
/// its tick as usual.
#[test]
fn a_deferred_tick_that_fires_is_a_miss_and_the_next_deadline_ticks_as_usual() {
    let mut rig = Rig::new(ModelKind::Pull);
    rig.mmio_write(0x320, 0x4_0040);
    let deadline = 1_077_000;
    rig.clock.set(1_000_000);
    rig.port.open = false;
    rig.wrmsr(0x6e0, deadline);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    // The guest enabled interrupts and ran on; the deferred tick ends KVM_RUN.
    rig.clock.set(deadline + GRACE_NS);
    rig.port.open = true;
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x40]);
    let c = rig.shared.counters(0).unwrap().clone();
    assert_eq!(c.ticks_deferred_missed.load(Ordering::Relaxed), 1);
    rig.eoi();
    rig.port.open = false;
    let next = deadline + GRACE_NS + 77_000;
    rig.wrmsr(0x6e0, next);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.tick.deadline(), next, "backing off: the usual tick");
    assert_eq!(c.ticks_deferred.load(Ordering::Relaxed), 1);
}

/// A deferred tick that fires while the guest still has interrupts off (its thread was
/// preempted in the handler, or the handler ran long) is late, not a miss: the interrupt
/// waits for the guest's `sti; hlt`, and its next short deadline is deferred again.
#[test]
fn a_deferred_tick_that_finds_interrupts_off_is_late_and_the_next_deadline_defers_again() {
    let (mut rig, deadline) = deferred_in_handler(ModelKind::Pull);
    // The deferred tick ends KVM_RUN inside the handler: nothing injectable yet.
    rig.clock.set(deadline + GRACE_NS);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(rig.port.injected.is_empty(), "interrupts are off");
    let c = rig.shared.counters(0).unwrap().clone();
    assert_eq!(c.ticks_deferred_missed.load(Ordering::Relaxed), 0);
    assert_eq!(c.ticks_deferred_late.load(Ordering::Relaxed), 1);
    // `sti; hlt`: injected on the HLT's exit.
    rig.clock.set(deadline + GRACE_NS + 20_000);
    rig.port.open = true;
    assert_eq!(rig.irq.halted(&mut rig.port), HaltEnd::Resume);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x40]);
    // The handler re-arms: deferred again, no back-off.
    rig.port.open = false;
    let next = deadline + GRACE_NS + 20_000 + 77_000;
    rig.wrmsr(0x6e0, next);
    rig.eoi();
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.tick.deadline(), next + GRACE_NS, "deferred again");
    assert_eq!(c.ticks_deferred.load(Ordering::Relaxed), 2);
    assert_eq!(c.lapic_timer_fires.load(Ordering::Relaxed), 1);
}

/// A vCPU that halts only after its deferred tick's time (the handler ran long) takes the
/// interrupt at that HLT; the tick is late, not a miss.
#[test]
fn a_halt_after_the_deferred_ticks_time_is_late_not_a_miss() {
    let (mut rig, deadline) = deferred_in_handler(ModelKind::Pull);
    rig.clock.set(deadline + GRACE_NS + 5_000);
    rig.port.open = true;
    assert_eq!(rig.irq.halted(&mut rig.port), HaltEnd::Resume);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x40]);
    let c = rig.shared.counters(0).unwrap().clone();
    assert_eq!(c.ticks_deferred_missed.load(Ordering::Relaxed), 0);
    assert_eq!(c.ticks_deferred_late.load(Ordering::Relaxed), 1);
}

/// In every timer model, a deferred deadline that has passed by the guest's next exit with
/// interrupts enabled is injected on that exit: `central` would otherwise leave it to its
/// timer thread and `push` to its own next pass, each a hop (two thread wake-ups) away.
#[test]
fn a_deadline_past_at_an_exit_the_guest_chose_is_injected_on_it_in_every_model() {
    for kind in [ModelKind::Pull, ModelKind::Push, ModelKind::Central] {
        let (mut rig, deadline) = deferred_in_handler(kind);
        assert!(rig.port.injected.is_empty(), "{kind:?}: early");
        // The handler's tail outlasts the deadline; the guest's next exit can take it.
        rig.clock.set(deadline + 30_000);
        rig.port.open = true;
        assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
        assert_eq!(rig.port.injected, vec![0x40], "{kind:?}: not on this exit");
        let c = rig.shared.counters(0).unwrap().clone();
        assert_eq!(c.lapic_timer_fires.load(Ordering::Relaxed), 1, "{kind:?}");
        assert_eq!(c.ticks_deferred.load(Ordering::Relaxed), 1, "{kind:?}");
        assert_eq!(
            c.ticks_deferred_missed.load(Ordering::Relaxed),
            0,
            "{kind:?}"
        );
        // Nothing fires twice: the timer model no longer holds it.
        rig.clock.set(deadline + GRACE_NS + 1);
        assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
        assert_eq!(rig.port.injected, vec![0x40], "{kind:?}: fired twice");
        assert_eq!(c.lapic_timer_fires.load(Ordering::Relaxed), 1, "{kind:?}");
    }
}

/// A guest that re-arms from its handler soon after each HLT: once lull has seen it do so,
/// the deferred tick left stale at the HLT stays armed until the next WRMSR moves it, one
/// host-timer programming per deadline instead of a disarm and an arm.
#[test]
fn the_stale_tick_is_kept_until_the_next_arm_once_the_guest_re_arms_soon() {
    let mut rig = Rig::new(ModelKind::Pull);
    rig.mmio_write(0x320, 0x4_0040);
    let mut now = 1_000_000;
    let mut programs = Vec::new();
    for round in 0..3 {
        // The handler: WRMSR with interrupts off, EOI.
        let deadline = now + 77_000;
        rig.clock.set(now);
        rig.port.open = false;
        rig.wrmsr(0x6e0, deadline);
        rig.eoi();
        assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
        assert_eq!(rig.tick.deadline(), deadline + GRACE_NS, "round {round}");
        let before = (rig.tick.arms(), rig.tick.disarms());
        // `sti; hlt` after the deadline: injected there.
        rig.clock.set(deadline + 20_000);
        rig.port.open = true;
        assert_eq!(rig.irq.halted(&mut rig.port), HaltEnd::Resume);
        assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
        assert_eq!(rig.port.injected.len(), round + 1, "round {round}");
        programs.push((
            rig.tick.deadline(),
            rig.tick.arms() - before.0,
            rig.tick.disarms() - before.1,
        ));
        // The next handler arms 30 us after the injection.
        now = deadline + 50_000;
    }
    // Nothing learned at the first HLT: disarmed. Then kept (no programming at the HLT).
    assert_eq!(programs[0], (timer::NEVER, 0, 1));
    assert_eq!(programs[1].1 + programs[1].2, 0, "kept: {programs:?}");
    assert_eq!(programs[2].1 + programs[2].2, 0, "kept: {programs:?}");
    let c = rig.shared.counters(0).unwrap().clone();
    assert_eq!(c.lapic_timer_fires.load(Ordering::Relaxed), 3);
    assert_eq!(c.injected.load(Ordering::Relaxed), 3);
}
