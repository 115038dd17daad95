//! A halted vCPU's wake-up with `--timer-slack`: a ranged sleep the host may batch, which other
//! threads may still move earlier.
//!
//! With slack off a blocked vCPU waits on an absolute timerfd that the timer model re-arms
//! from any thread (see `wait.rs`); a timerfd is a hard hrtimer and ignores the thread's timer
//! slack. With slack on the vCPU thread instead sleeps with a relative `ppoll` timeout to its
//! wake-up, which the kernel expires anywhere in `[wake-up, wake-up + slack]` (the thread's
//! `PR_SET_TIMERSLACK`), so wake-ups of threads on one host CPU that fall within the slack of
//! each other are served by one CPU wake-up. The timerfd stays as a *doorbell*: armed only
//! when another thread moves the wake-up before the one the sleeper's timeout runs to.
//!
//! ```text
//!  armer (the model, under its sleeper lock)     sleeper (the vCPU thread)
//!  want := d                                     w := want; waiting_for := w
//!  if d < waiting_for: arm the doorbell at d     if want != w: again
//!                                                ppoll(kick, doorbell, w - now)
//!                                                waiting_for := AWAKE; due if want <= now
//! ```
//!
//! Race-freedom (both sides SeqCst, Dekker's pattern): either the sleeper's re-read sees the
//! armer's new `want` and sleeps for it, or the armer sees the sleeper's `waiting_for` and
//! rings the doorbell (hard, at the new wake-up: the rare case costs today's behaviour). A
//! wake-up moved *later* while the vCPU sleeps cannot lengthen its timeout: the sleeper wakes
//! at the old one, finds it not due and sleeps again (one wake-up more than with slack off).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use timer::{Nanos, NEVER};

/// `waiting_for` of a sleeper that is not asleep: no arm is earlier, so none rings.
const AWAKE: Nanos = 0;

/// The wake-up a ranged sleeper waits for, shared between its armers and the sleeper.
#[derive(Debug)]
pub struct RangedWake {
    /// The wake-up the timer model armed (`NEVER`: disarmed).
    want: AtomicU64,
    /// The wake-up the sleeper's timeout runs to (`AWAKE`: not asleep; `NEVER`: asleep
    /// without a timeout).
    waiting_for: AtomicU64,
    /// The doorbell was armed and may still fire.
    doorbell: AtomicBool,
}

impl Default for RangedWake {
    fn default() -> Self {
        Self {
            want: AtomicU64::new(NEVER),
            waiting_for: AtomicU64::new(AWAKE),
            doorbell: AtomicBool::new(false),
        }
    }
}

impl RangedWake {
    /// Armer: the wake-up is now `deadline`. True if the sleeper waits for later: the caller
    /// must ring the doorbell at `deadline` (then call [`Self::doorbell_armed`]).
    pub fn arm(&self, deadline: Nanos) -> bool {
        self.want.store(deadline, Ordering::SeqCst);
        deadline < self.waiting_for.load(Ordering::SeqCst)
    }

    /// Armer: the doorbell is armed.
    pub fn doorbell_armed(&self) {
        self.doorbell.store(true, Ordering::SeqCst);
    }

    /// Armer: no wake-up (no system call: a sleeper without one wakes only for a kick).
    pub fn disarm(&self) {
        self.want.store(NEVER, Ordering::SeqCst);
    }

    /// Sleeper: publishes and returns the wake-up its timeout will run to.
    pub fn begin_wait(&self) -> Nanos {
        loop {
            let want = self.want.load(Ordering::SeqCst);
            self.waiting_for.store(want, Ordering::SeqCst);
            if self.want.load(Ordering::SeqCst) == want {
                return want;
            }
        }
    }

    /// Sleeper: awake. True if the doorbell was armed since the last call (the caller disarms
    /// it, so that it does not end a later wait early).
    pub fn end_wait(&self) -> bool {
        self.waiting_for.store(AWAKE, Ordering::SeqCst);
        self.doorbell.swap(false, Ordering::SeqCst)
    }

    /// The sleeper is asleep (tests: to arm only once it is).
    #[cfg(test)]
    pub fn asleep(&self) -> bool {
        self.waiting_for.load(Ordering::SeqCst) != AWAKE
    }

    /// The wake-up is due at `now`.
    pub fn due(&self, now: Nanos) -> bool {
        self.want.load(Ordering::SeqCst) <= now
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn arms_before_the_wait_need_no_doorbell_and_earlier_ones_during_it_do() {
        let w = RangedWake::default();
        assert!(!w.due(u64::MAX - 1));
        assert!(!w.arm(1_000), "nobody waits yet");
        assert_eq!(w.begin_wait(), 1_000);
        assert!(
            !w.arm(2_000),
            "later: the sleeper wakes at 1000 and looks again"
        );
        assert!(w.arm(500), "earlier than the sleeper's timeout: ring");
        w.doorbell_armed();
        assert!(w.end_wait());
        assert!(!w.end_wait(), "told once");
        assert!(w.due(500) && !w.due(499));
        w.disarm();
        assert!(!w.due(u64::MAX - 1));
        assert!(!w.arm(10), "not asleep");
    }

    /// An armer racing a sleeper: every time, either the sleeper's published wake-up is the
    /// armer's or the armer is told to ring the doorbell, so no earlier wake-up is missed.
    #[test]
    fn a_racing_earlier_arm_is_never_missed() {
        for round in 0..2_000u64 {
            let w = Arc::new(RangedWake::default());
            w.arm(1_000_000);
            let armer = {
                let w = w.clone();
                std::thread::spawn(move || w.arm(10 + round % 7))
            };
            let waits_for = w.begin_wait();
            let rang = armer.join().unwrap();
            let earlier = 10 + round % 7;
            assert!(
                waits_for == earlier || rang,
                "round {round}: sleeper waits for {waits_for}, armer did not ring"
            );
            w.end_wait();
        }
    }
}
