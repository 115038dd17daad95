//! The LAPIC timer's host side over a real timer model on a fake host timer, at VM-clock
//! times given by hand (the fake clock's): where its host timer is armed, when an exit takes
//! it, how an expiry is delivered and what it learns.

use std::sync::Arc;

use timer::{build, AfterFire, FakeHostTimer, HostTimer, ModelKind, NEVER};

use super::tick_defer::GRACE_NS;
use super::*;

/// The timers of vCPU 0 of a one-vCPU VM in `pull`.
fn timers() -> Box<dyn CpuTimers<VcpuTimer>> {
    let waker = Arc::new(|_cpu: usize| {});
    let mut host = |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>;
    let model = build::<VcpuTimer>(ModelKind::Pull, &[0], &mut host, waker).unwrap();
    model.cpus.into_iter().next().unwrap()
}

/// The next deadline on the timers at `now` (nothing due then).
fn next(t: &mut dyn CpuTimers<VcpuTimer>, now: Nanos) -> Nanos {
    t.run(now, &mut |_| AfterFire::Done)
}

#[test]
fn a_deadline_is_armed_early_by_the_advance_and_its_expiry_waits_for_it() {
    let (mut t, c) = (timers(), VcpuCounters::default());
    let mut host = LapicTimerHost::new(TimerAdvanceMode::Fixed(10_000), TimerSlack::Off);
    host.arm(t.as_mut(), 100_000);
    assert_eq!(host.wake_at(), Some(90_000));
    assert_eq!(next(t.as_mut(), 0), 90_000);
    // Fired early by 8 us: wait for the deadline, never deliver before it.
    let e = host.fired(92_000, false, Some(100_000), &c).unwrap();
    assert_eq!(e.wait_until, Some(100_000));
    assert_eq!(host.wake_at(), None);
    host.delivered(e, 100_500, &c);
    assert_eq!(c.lapic_timer_fires.load(Ordering::Relaxed), 1);
    // Fired after the deadline: no wait. A deadline the guest cancelled: nothing to deliver.
    host.arm(t.as_mut(), 200_000);
    let e = host.fired(200_300, false, Some(200_000), &c).unwrap();
    assert_eq!(e.wait_until, None);
    assert_eq!(host.fired(300_000, false, None, &c), None);
}

#[test]
fn the_adaptive_advance_learns_the_host_delay_past_the_slack() {
    let c = VcpuCounters::default();
    let adaptive = TimerAdvanceMode::Adaptive { max_ns: 50_000 };
    for (slack, learned) in [(TimerSlack::Off, 1_000), (TimerSlack::Range(4_000), 500)] {
        let mut t = timers();
        let mut host = LapicTimerHost::new(adaptive, slack);
        host.arm(t.as_mut(), 100_000);
        assert_eq!(host.wake_at(), Some(100_000), "{slack:?}");
        // Handled 8 us after its host timer: an eighth of the delay past the slack's range.
        host.fired(108_000, false, Some(100_000), &c).unwrap();
        assert_eq!(host.advance_ns(), learned, "{slack:?}");
        assert_eq!(c.timer_advance_ns.load(Ordering::Relaxed), learned);
        host.arm(t.as_mut(), 200_000);
        assert_eq!(host.wake_at(), Some(200_000 - learned), "{slack:?}");
    }
}

#[test]
fn a_short_deadline_armed_with_interrupts_off_ticks_after_it_until_the_guest_halts() {
    let (mut t, c) = (timers(), VcpuCounters::default());
    let mut host = LapicTimerHost::new(TimerAdvanceMode::Fixed(10_000), TimerSlack::Off);
    assert!(host.arm_for_guest(t.as_mut(), 0, 50_000, false));
    assert_eq!(host.wake_at(), Some(50_000 + GRACE_NS));
    // The guest halts before the usual tick: back to it.
    assert!(!host.end_deferral(t.as_mut(), 20_000, Some(50_000)));
    assert_eq!(host.wake_at(), Some(40_000));
    assert_eq!(next(t.as_mut(), 20_000), 40_000);
    // Armed with interrupts on, or far ahead: as usual.
    assert!(!host.arm_for_guest(t.as_mut(), 0, 50_000, true));
    assert_eq!(host.wake_at(), Some(40_000));
    assert!(!host.arm_for_guest(t.as_mut(), 0, 1_000_000, false));
    assert_eq!(host.wake_at(), Some(990_000));
    // The guest halts after the usual tick's time: the timer is taken at that exit.
    assert!(host.arm_for_guest(t.as_mut(), 1_000_000, 1_050_000, false));
    assert!(host.end_deferral(t.as_mut(), 1_045_000, Some(1_050_000)));
    assert_eq!(host.wake_at(), None);
    assert!(host.take_taken());
    assert!(!host.take_taken(), "taken once");
    // Its expiry learns nothing from a tick it took itself, and waits for the deadline.
    let e = host.fired(1_045_000, false, Some(1_050_000), &c).unwrap();
    assert_eq!(e.wait_until, Some(1_050_000));
    assert_eq!(c.ticks_deferred_late.load(Ordering::Relaxed), 0);
}

#[test]
fn a_deferred_tick_that_fires_on_a_running_guest_is_a_miss_and_one_in_a_halt_is_late() {
    let (mut t, c) = (timers(), VcpuCounters::default());
    let mut host = LapicTimerHost::new(TimerAdvanceMode::Off, TimerSlack::Off);
    assert!(host.arm_for_guest(t.as_mut(), 0, 50_000, false));
    host.fired(50_000 + GRACE_NS, true, Some(50_000), &c)
        .unwrap();
    assert_eq!(c.ticks_deferred_missed.load(Ordering::Relaxed), 1);
    // Backing off: the next short deadline with interrupts off ticks as usual.
    assert!(!host.arm_for_guest(t.as_mut(), 300_000, 350_000, false));
    assert_eq!(host.wake_at(), Some(350_000));
    host.fired(350_000, true, Some(350_000), &c).unwrap();
    assert!(host.arm_for_guest(t.as_mut(), 400_000, 450_000, false));
    host.fired(450_000 + GRACE_NS, false, Some(450_000), &c)
        .unwrap();
    assert_eq!(c.ticks_deferred_late.load(Ordering::Relaxed), 1);
}

#[test]
fn a_tick_due_at_an_exit_is_taken_out_of_the_model_there() {
    let mut t = timers();
    let mut host = LapicTimerHost::new(TimerAdvanceMode::Off, TimerSlack::Off);
    host.arm(t.as_mut(), 100_000);
    assert!(!host.due_at_exit(t.as_mut(), 99_999));
    assert!(!host.take_taken());
    assert!(host.due_at_exit(t.as_mut(), 100_000));
    assert!(host.take_taken());
    assert_eq!(next(t.as_mut(), 100_000), NEVER, "left armed in the model");
    // A cancel disarms it.
    host.arm(t.as_mut(), 200_000);
    host.cancel(t.as_mut());
    assert_eq!(host.wake_at(), None);
    assert_eq!(next(t.as_mut(), 100_000), NEVER);
}
