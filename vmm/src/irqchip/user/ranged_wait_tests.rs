//! A blocked vCPU's ranged wait (`--timer-slack`) on the real clock and host: it wakes for its
//! own timer never before the deadline, and a wake-up moved earlier by another thread while it
//! sleeps (the doorbell) ends the wait.

use std::sync::Arc;

use timer::{AfterFire, Clock, CpuTimers, FakeHostTimer, HostTimer, ModelKind, TimerKind};

use super::host_timer::{SharedHostTimer, SharedTimerFd};
use super::mailbox::Mailbox;
use super::wait::VcpuWait;
use crate::idle::vcpu_timer::VcpuTimer;
use crate::irqchip::clock::VmClock;

/// One vCPU's `pull` timers on `clock` with a ranged wake-up, and its wait.
fn ranged_vcpu(clock: VmClock) -> (Box<dyn CpuTimers<VcpuTimer>>, VcpuWait, Arc<SharedTimerFd>) {
    let mut host = |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>;
    let model =
        timer::build::<VcpuTimer>(ModelKind::Pull, &[0], &mut host, Arc::new(|_| {})).unwrap();
    let mut timers = model.cpus.into_iter().next().unwrap();
    let wake = SharedTimerFd::ranged_for_poll(clock).unwrap();
    timers.set_wake_timer(Box::new(SharedHostTimer(wake.clone())));
    let wait = VcpuWait {
        mailbox: Arc::new(Mailbox::new().unwrap()),
        wake_timer: Some(wake.clone()),
    };
    (timers, wait, wake)
}

#[test]
fn a_ranged_wait_ends_at_or_after_its_own_deadline() {
    crate::host::sys::thread::set_timer_slack(200_000).unwrap();
    let clock = VmClock::new();
    let (mut timers, wait, _) = ranged_vcpu(clock.clone());
    for _ in 0..20 {
        let deadline = clock.now() + 300_000;
        timers.arm(TimerKind::Pinned, deadline, VcpuTimer::Lapic);
        wait.block_until(timers.as_mut(), &clock, None, true, || false);
        let woke = clock.now();
        assert!(woke >= deadline, "woke {} ns early", deadline - woke);
        let mut fired = 0;
        timers.run(woke, &mut |_| {
            fired += 1;
            AfterFire::Done
        });
        assert_eq!(fired, 1, "the wake-up served its timer");
    }
}

#[test]
fn a_wake_up_moved_earlier_during_the_wait_rings_the_doorbell() {
    crate::host::sys::thread::set_timer_slack(1_000).unwrap();
    let clock = VmClock::new();
    let (mut timers, wait, wake) = ranged_vcpu(clock.clone());
    // Its own timer is far away: only the doorbell can end the wait in time.
    let far = clock.now() + 30_000_000_000;
    timers.arm(TimerKind::Pinned, far, VcpuTimer::Lapic);
    let sooner = clock.now() + 2_000_000;
    let mover = std::thread::spawn(move || {
        // Once the sleeper has armed its wake-up and waits (the model's own arm would
        // overwrite an earlier one: in lull every arm goes through the model's sleeper lock).
        while !wake.ranged().unwrap().asleep() {
            std::hint::spin_loop();
        }
        wake.arm_at(sooner).unwrap();
    });
    wait.block_until(timers.as_mut(), &clock, None, true, || false);
    mover.join().unwrap();
    let woke = clock.now();
    assert!(woke >= sooner, "woke before the moved wake-up");
    assert!(woke < far, "the moved wake-up was missed");
}
