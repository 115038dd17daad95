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

/// `armed` after a wake-up: forces the next `sleep` to program the host timer, which also
/// clears an expiry that happened while the CPU was awake.
const STALE: Nanos = NEVER - 1;

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
                armed: STALE,
                timer: None,
            }),
        }
    }

    /// Gives it a host timer (any thread may arm it; see the module docs).
    pub fn attach(&self, timer: Box<dyn HostTimer>) {
        let mut s = lock(&self.slot);
        s.timer = Some(timer);
        s.armed = STALE;
    }

    /// Owner: it sleeps (or, asleep already, its own deadline moved) with its own deadline
    /// `own`; `duty()` reads its current duty. Arms the host wake-up; returns its deadline.
    pub fn sleep(&self, own: Nanos, duty: &dyn Fn() -> Nanos, m: &Metrics) -> Nanos {
        let mut s = lock(&self.slot);
        s.asleep = true;
        s.own = own;
        let want = own.min(duty());
        s.arm(want, false, m);
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
    /// left as is (no syscall): the next [`Sleeper::sleep`] re-programs an armed one, which
    /// clears an expiry that happened meanwhile.
    pub fn wake(&self) -> Nanos {
        let mut s = lock(&self.slot);
        s.asleep = false;
        let armed = s.armed;
        if armed != NEVER {
            // It may fire while the CPU is awake; the next `sleep` must re-program it.
            s.armed = STALE;
        }
        armed
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
