//! Host timers behind `timer::HostTimer`: each vCPU's host tick is a POSIX timer that sends
//! the kick signal to the vCPU's own thread, armed at absolute CLOCK_MONOTONIC deadlines and
//! created on first use by that thread; a blocked vCPU waits on its wake-up timerfd (which the
//! timer model re-arms from any thread without waking it) or, with `--timer-slack`, on a
//! ranged timeout with that timerfd as its doorbell (`ranged_wake.rs`), and the `central`
//! model's thread waits on a timerfd too. Each remembers the VM-clock deadline it is armed for
//! and registers with the clock, which re-arms it when the VM resumes from a pause
//! (`irqchip::clock`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use timer::{lock, HostTimer, HostTimerError, Nanos};

use super::ranged_wake::RangedWake;
use crate::host::sys::posix_timer::PosixTimer;
use crate::host::sys::timerfd::TimerFd;
use crate::irqchip::clock::{Rearm, VmClock};

/// No deadline armed.
const DISARMED: Nanos = Nanos::MAX;

/// A vCPU thread's host tick: a POSIX timer created by the thread that first arms it.
pub struct ThreadTickTimer {
    clock: VmClock,
    tick: Arc<Tick>,
}

/// The POSIX timer (once created) and the VM-clock deadline it is armed for, which a thaw of
/// the clock re-arms from the resuming thread.
struct Tick {
    timer: Mutex<Option<PosixTimer>>,
    deadline: AtomicU64,
}

impl ThreadTickTimer {
    /// A timer on `clock`'s time base, not yet created.
    pub fn new(clock: VmClock) -> Self {
        let tick = Arc::new(Tick {
            timer: Mutex::new(None),
            deadline: AtomicU64::new(DISARMED),
        });
        clock.on_thaw(Arc::downgrade(&(tick.clone() as Arc<dyn Rearm>)));
        Self { clock, tick }
    }
}

impl Rearm for Tick {
    fn rearm(&self, clock: &VmClock) {
        // The deadline is read under the timer's lock, which an arm holds from its store to
        // its write: an arm that converted with the frozen clock cannot write after this.
        let mut timer = lock(&self.timer);
        let deadline = self.deadline.load(Ordering::Acquire);
        if deadline == DISARMED {
            return;
        }
        if let Some(t) = timer.as_mut() {
            if let Err(e) = t.arm_at(clock.to_monotonic(deadline)) {
                tracing::warn!("cannot re-arm a vCPU's host tick after a pause: {e}");
            }
        }
    }
}

impl HostTimer for ThreadTickTimer {
    fn arm(&mut self, deadline: Nanos) -> Result<(), HostTimerError> {
        let mut timer = lock(&self.tick.timer);
        let t = match &mut *timer {
            Some(t) => t,
            slot @ None => {
                slot.insert(PosixTimer::for_current_thread().map_err(HostTimerError::TimerFd)?)
            }
        };
        self.tick.deadline.store(deadline, Ordering::Release);
        t.arm_at(self.clock.to_monotonic(deadline))
            .map_err(HostTimerError::TimerFd)
    }

    fn disarm(&mut self) -> Result<(), HostTimerError> {
        self.tick.deadline.store(DISARMED, Ordering::Release);
        match lock(&self.tick.timer).as_mut() {
            Some(t) => t.disarm().map_err(HostTimerError::TimerFd),
            None => Ok(()),
        }
    }
}

/// An absolute VM-clock timerfd that one thread waits on and any thread may arm; ranged, it
/// is only the doorbell of a [`RangedWake`].
pub struct SharedTimerFd {
    fd: TimerFd,
    clock: VmClock,
    ranged: Option<RangedWake>,
    /// The VM-clock deadline armed (a thaw of the clock re-arms it).
    deadline: AtomicU64,
    /// Held from a deadline's store to its timerfd write, and by a thaw's re-arm: an arm
    /// that converted its deadline with the frozen clock ("never") cannot write the timerfd
    /// after the thaw's re-arm did (the timer would never fire).
    arming: Mutex<()>,
}

impl SharedTimerFd {
    /// A disarmed timerfd on `clock`'s time base whose reads block (the central thread's).
    pub fn new(clock: VmClock) -> std::io::Result<Arc<Self>> {
        Ok(Self::registered(TimerFd::new()?, clock, None))
    }

    /// A disarmed timerfd on `clock`'s time base to wait on with poll (a vCPU's wake-up).
    pub fn for_poll(clock: VmClock) -> std::io::Result<Arc<Self>> {
        Ok(Self::registered(TimerFd::nonblocking()?, clock, None))
    }

    fn registered(fd: TimerFd, clock: VmClock, ranged: Option<RangedWake>) -> Arc<Self> {
        let this = Arc::new(Self {
            fd,
            clock: clock.clone(),
            ranged,
            deadline: AtomicU64::new(DISARMED),
            arming: Mutex::new(()),
        });
        clock.on_thaw(Arc::downgrade(&(this.clone() as Arc<dyn Rearm>)));
        this
    }

    /// A vCPU's ranged wake-up (`--timer-slack`): arms record the wake-up for the sleeper's
    /// timeout and program the timerfd only as its doorbell (see [`RangedWake`]).
    pub fn ranged_for_poll(clock: VmClock) -> std::io::Result<Arc<Self>> {
        Ok(Self::registered(
            TimerFd::nonblocking()?,
            clock,
            Some(RangedWake::default()),
        ))
    }

    /// The ranged wake-up, if this is one.
    pub fn ranged(&self) -> Option<&RangedWake> {
        self.ranged.as_ref()
    }

    /// A ranged sleeper is awake: disarms the doorbell if it was armed (one system call, only
    /// after a wake-up was moved earlier during a sleep).
    pub fn end_ranged_wait(&self) {
        if self.ranged.as_ref().is_some_and(RangedWake::end_wait) {
            let _ = self.fd.disarm();
        }
    }

    /// The fd, to poll.
    pub fn fd(&self) -> &TimerFd {
        &self.fd
    }

    /// Arms for an absolute VM-clock deadline (ranged: rings the doorbell only if the sleeper
    /// waits for later).
    pub fn arm_at(&self, deadline: Nanos) -> Result<(), HostTimerError> {
        let _arming = lock(&self.arming);
        self.deadline.store(deadline, Ordering::Release);
        if let Some(r) = &self.ranged {
            if !r.arm(deadline) {
                return Ok(());
            }
            r.doorbell_armed();
        }
        self.fd
            .arm_at(self.clock.to_monotonic(deadline))
            .map_err(HostTimerError::TimerFd)
    }

    /// Disarms (ranged: no system call; a doorbell still armed is cleared by the sleeper).
    pub fn disarm_now(&self) -> Result<(), HostTimerError> {
        let _arming = lock(&self.arming);
        self.deadline.store(DISARMED, Ordering::Release);
        if let Some(r) = &self.ranged {
            r.disarm();
            return Ok(());
        }
        self.fd.disarm().map_err(HostTimerError::TimerFd)
    }

    /// Blocks until the timer expires.
    pub fn wait(&self) -> std::io::Result<u64> {
        self.fd.wait()
    }
}

impl Rearm for SharedTimerFd {
    fn rearm(&self, clock: &VmClock) {
        // See `arming`: an arm that converted with the frozen clock cannot write after this.
        let _arming = lock(&self.arming);
        let deadline = self.deadline.load(Ordering::Acquire);
        // A ranged sleeper was woken for the pause and computes its timeout afresh.
        if deadline == DISARMED || self.ranged.is_some() {
            return;
        }
        if let Err(e) = self.fd.arm_at(clock.to_monotonic(deadline)) {
            tracing::warn!("cannot re-arm a timerfd after a pause: {e}");
        }
    }
}

/// A host timer that is a handle on a shared timerfd: the `central` timer thread's, or a
/// vCPU's wake-up (which other threads re-arm while the vCPU sleeps).
pub struct SharedHostTimer(pub Arc<SharedTimerFd>);

impl HostTimer for SharedHostTimer {
    fn arm(&mut self, deadline: Nanos) -> Result<(), HostTimerError> {
        self.0.arm_at(deadline)
    }

    fn disarm(&mut self) -> Result<(), HostTimerError> {
        self.0.disarm_now()
    }
}
