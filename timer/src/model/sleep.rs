//! A blocked CPU's host wake-up, which any thread may move without waking the CPU.
//!
//! A vCPU blocks (HLT) until its *wake-up*: the earliest of its own deadline (first pinned
//! timer in `pull`; first timer in `push`) and, in `pull`, the wake-up duty the hierarchy gave
//! it (see `hierarchy/duty.rs`). The duty can move while the vCPU sleeps: another vCPU that
//! becomes active takes it over. So the wake-up is a host timer behind [`HostTimer`] that
//! the model re-arms from whichever thread moved the duty (a timerfd armed with an absolute
//! deadline: re-arming it wakes nobody), and the blocked thread waits on that timer or a kick
//! instead of a timeout it computed itself.
//!
//! ```text
//!  owner thread                        any thread
//!  idle():  sleep(own)  -> arm          retarget(): re-read duty -> re-arm if changed
//!          [blocks on the host wake-up or a kick]
//!  wake():  awake, report the deadline  (retargets of an awake CPU do nothing)
//! ```
//!
//! Race-freedom: the slot's lock serialises every re-arm, and every re-arm reads the duty
//! *inside* the lock (from the hierarchy's atomic, written before its author calls
//! [`Sleeper::retarget`]); so whichever re-arm comes last uses the latest duty. Without a
//! host timer attached the slot still tracks the deadline the owner was told, so the model's
//! metrics stay right for a VMM that blocks with a plain timeout.

use crate::clock::{Nanos, NEVER};
use crate::host::HostTimer;
use crate::metrics::Metrics;
use crate::sync::{lock, Mutex};

/// `armed` before anything was programmed: the first `sleep` programs the host timer.
const UNSET: Nanos = NEVER - 1;

/// One CPU's host wake-up (shared: the owner sleeps on it, others retarget it).
pub struct Sleeper {
    slot: Mutex<Slot>,
}

struct Slot {
    asleep: bool,
    /// The owner's own deadline while it sleeps.
    own: Nanos,
    /// The deadline the host timer is armed for (or, without one, the owner was told).
    armed: Nanos,
    timer: Option<Box<dyn HostTimer>>,
}

impl std::fmt::Debug for Sleeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = lock(&self.slot);
        f.debug_struct("Sleeper")
            .field("asleep", &s.asleep)
            .field("own", &s.own)
            .field("armed", &s.armed)
            .field("timer", &s.timer.is_some())
            .finish()
    }
}

impl Slot {
    /// Arms the host timer for `want` if it differs from what is armed. `remote`: another
    /// thread is re-arming (counted as a retarget; without a host timer nothing can move).
    fn arm(&mut self, want: Nanos, remote: bool, m: &Metrics) {
        if want == self.armed {
            return;
        }
        let Some(t) = self.timer.as_mut() else {
            if !remote {
                self.armed = want;
            }
            return;
        };
        self.armed = want;
        let ok = if want == NEVER {
            t.disarm().is_ok()
        } else {
            let ok = t.arm(want).is_ok();
            m.host_arm(ok);
            ok
        };
        m.wake_arm(remote);
        if !ok {
            tracing::warn!(deadline = want, "host wake-up programming failed");
        }
    }
}

impl Default for Sleeper {
    fn default() -> Self {
        Self::new()
    }
}

impl Sleeper {
    /// A sleeper without a host timer (the owner blocks with the timeout it is told).
    pub fn new() -> Self {
        Self {
            slot: Mutex::new(Slot {
                asleep: false,
                own: NEVER,
                armed: UNSET,
                timer: None,
            }),
        }
    }

    /// Gives it a host timer (any thread may arm it; see the module docs).
    pub fn attach(&self, timer: Box<dyn HostTimer>) {
        let mut s = lock(&self.slot);
        s.timer = Some(timer);
        s.armed = UNSET;
    }

    /// Whether a host timer is attached (then it, not the CPU's tick, wakes the CPU).
    pub fn has_timer(&self) -> bool {
        lock(&self.slot).timer.is_some()
    }

    /// Owner: it sleeps (or, asleep already, its own deadline moved) with its own deadline
    /// `own`; `duty()` reads its current duty. Arms the host wake-up; returns its deadline.
    /// `now` (if known) saves the syscall when the deadline is the one still pending from the
    /// last sleep (a kick woke it early): a timer armed for after `now` has not fired yet.
    /// Otherwise the timer is re-programmed, which clears an expiry that happened while the
    /// CPU was awake.
    pub fn sleep(
        &self,
        own: Nanos,
        duty: &dyn Fn() -> Nanos,
        now: Option<Nanos>,
        m: &Metrics,
    ) -> Nanos {
        let mut s = lock(&self.slot);
        s.asleep = true;
        s.own = own;
        let want = own.min(duty());
        let pending = s.armed == NEVER || now.is_some_and(|n| s.armed > n && s.armed != UNSET);
        if want != s.armed || !pending {
            s.armed = UNSET;
            s.arm(want, false, m);
        }
        want
    }

    /// Any thread: the duty moved (it changed the value `duty()` reads before calling). Re-arms
    /// the host wake-up of a sleeping owner; does nothing to an awake one.
    pub fn retarget(&self, duty: &dyn Fn() -> Nanos, m: &Metrics) {
        let mut s = lock(&self.slot);
        if !s.asleep {
            return;
        }
        let want = s.own.min(duty());
        s.arm(want, true, m);
    }

    /// Owner: it is awake. Returns the deadline its wake-up was armed for (`NEVER`: none; a
    /// huge value if it never slept), to tell a timer wake-up from a kick. The host timer is
    /// left as is (no syscall); the next [`Sleeper::sleep`] decides whether to re-program it.
    pub fn wake(&self) -> Nanos {
        let mut s = lock(&self.slot);
        s.asleep = false;
        s.armed
    }

    /// The deadline the wake-up is armed for while asleep (`NEVER`: none, or awake).
    pub fn armed(&self) -> Nanos {
        let s = lock(&self.slot);
        if s.asleep {
            s.armed
        } else {
            NEVER
        }
    }
}

#[cfg(test)]
#[cfg(not(loom))]
mod tests {
    use super::*;
    use crate::host::FakeHostTimer;

    #[test]
    fn programs_the_host_timer_only_when_needed() {
        let (m, fake, s) = (Metrics::default(), FakeHostTimer::new(), Sleeper::new());
        s.attach(Box::new(fake.clone()));
        let duty = std::cell::Cell::new(NEVER);
        let d = || duty.get();
        assert_eq!(s.sleep(100, &d, Some(0), &m), 100);
        assert_eq!((fake.deadline(), fake.arms()), (100, 1));
        // Kicked at 50: the same deadline, still pending at 60, costs no syscall.
        assert_eq!(s.wake(), 100);
        s.sleep(100, &d, Some(60), &m);
        assert_eq!(fake.arms(), 1);
        // It fired at 100 while the CPU ran: re-programmed even for the same deadline.
        s.wake();
        s.sleep(100, &d, Some(100), &m);
        assert_eq!(fake.arms(), 2);
        // Without `now`, always re-programmed.
        s.sleep(100, &d, None, &m);
        assert_eq!(fake.arms(), 3);
        // Another thread moves the duty earlier, then away: re-armed both times.
        duty.set(40);
        s.retarget(&d, &m);
        assert_eq!(fake.deadline(), 40);
        duty.set(NEVER);
        s.retarget(&d, &m);
        assert_eq!((fake.deadline(), fake.arms()), (100, 5));
        // An awake CPU is left alone.
        s.wake();
        duty.set(10);
        s.retarget(&d, &m);
        assert_eq!((fake.deadline(), s.armed()), (100, NEVER));
        let snap = m.read();
        assert_eq!((snap.wake_timer_arms, snap.wake_retargets), (5, 2));
        assert_eq!(snap.host_timer_arms, 5);
    }

    #[test]
    fn without_a_host_timer_a_retarget_cannot_move_the_wait() {
        let (m, s) = (Metrics::default(), Sleeper::new());
        s.sleep(100, &|| 50, Some(0), &m);
        assert_eq!(s.armed(), 50);
        // The owner blocks with 50 and only re-reads when it wakes.
        s.retarget(&|| NEVER, &m);
        assert_eq!(s.armed(), 50);
        assert_eq!(m.read().wake_timer_arms, 0);
    }
}
