//! Tests of a wait ([`super::poll`]) on a timerfd ([`super::timerfd`]): apart from both, so
//! that neither file's tests import the other.

use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::poll::{wait, Woken};
use super::timerfd::TimerFd;

#[test]
fn a_kick_a_timer_or_the_timeout_ends_the_wait() {
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let timer = TimerFd::new().unwrap();
    let short = Some(Duration::from_millis(1));
    assert_eq!(wait(&kick, Some(&timer), short).unwrap(), Woken::default());
    kick.write(1).unwrap();
    let w = wait(&kick, Some(&timer), None).unwrap();
    assert!(w.kick && !w.wake);
    kick.read().unwrap();
    timer.arm_at(1).unwrap();
    let w = wait(&kick, Some(&timer), None).unwrap();
    assert!(w.wake && !w.kick);
    assert!(!wait(&kick, None, short).unwrap().wake);
}

/// What a blocked vCPU relies on when it leaves an expiry unread (`irqchip/user/wait.rs`):
/// programming the timer again, armed or disarmed, drops it, so a wait after that is not
/// woken by it.
#[test]
fn reprogramming_drops_an_unread_expiry() {
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let t = TimerFd::nonblocking().unwrap();
    let readable = |t: &TimerFd| {
        let w = wait(&kick, Some(t), Some(Duration::ZERO));
        w.unwrap().wake
    };
    let fired = |t: &TimerFd| wait(&kick, Some(t), None).unwrap().wake;
    t.arm_at(1).unwrap();
    assert!(fired(&t), "an expired deadline fires");
    t.arm_at(u64::MAX / 2).unwrap();
    assert!(!readable(&t), "re-arming left the expiry readable");
    t.arm_at(1).unwrap();
    assert!(fired(&t));
    t.disarm().unwrap();
    assert!(!readable(&t), "disarming left the expiry readable");
}
