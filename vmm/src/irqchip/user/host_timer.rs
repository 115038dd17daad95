//! Host timers behind `timer::HostTimer`: each vCPU's host tick is a POSIX timer that sends
//! the kick signal to the vCPU's own thread, armed at absolute CLOCK_MONOTONIC deadlines and
//! created on first use by that thread; a blocked vCPU waits on its wake-up timerfd (which the
//! timer model re-arms from any thread without waking it) or, with `--timer-slack`, on a
//! ranged timeout with that timerfd as its doorbell (`ranged_wake.rs`), and the `central`
//! model's thread waits on a timerfd too.

use std::sync::Arc;

use timer::{HostTimer, HostTimerError, Nanos};

use super::ranged_wake::RangedWake;
use crate::host::sys::posix_timer::PosixTimer;
use crate::host::sys::timerfd::TimerFd;
use crate::irqchip::clock::VmClock;

fn host_err(e: std::io::Error) -> HostTimerError {
    HostTimerError::TimerFd(vmm_sys_util::errno::Error::new(
        e.raw_os_error().unwrap_or(0),
    ))
}

/// A vCPU thread's host tick: a POSIX timer created by the thread that first arms it.
pub struct ThreadTickTimer {
    clock: VmClock,
    timer: Option<PosixTimer>,
}

impl ThreadTickTimer {
    /// A timer on `clock`'s time base, not yet created.
    pub fn new(clock: VmClock) -> Self {
        Self { clock, timer: None }
    }

    fn timer(&mut self) -> Result<&mut PosixTimer, HostTimerError> {
        match &mut self.timer {
            Some(t) => Ok(t),
            slot @ None => Ok(slot.insert(PosixTimer::for_current_thread().map_err(host_err)?)),
        }
    }
}

impl HostTimer for ThreadTickTimer {
    fn arm(&mut self, deadline: Nanos) -> Result<(), HostTimerError> {
        let at = self.clock.to_monotonic(deadline);
        self.timer()?.arm_at(at).map_err(host_err)
    }

    fn disarm(&mut self) -> Result<(), HostTimerError> {
        match &mut self.timer {
            Some(t) => t.disarm().map_err(host_err),
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
}

impl SharedTimerFd {
    /// A disarmed timerfd on `clock`'s time base whose reads block (the central thread's).
    pub fn new(clock: VmClock) -> std::io::Result<Self> {
        Ok(Self {
            fd: TimerFd::new()?,
            clock,
            ranged: None,
        })
    }

    /// A disarmed timerfd on `clock`'s time base to wait on with poll (a vCPU's wake-up).
    pub fn for_poll(clock: VmClock) -> std::io::Result<Self> {
        Ok(Self {
            fd: TimerFd::nonblocking()?,
            clock,
            ranged: None,
        })
    }

    /// A vCPU's ranged wake-up (`--timer-slack`): arms record the wake-up for the sleeper's
    /// timeout and program the timerfd only as its doorbell (see [`RangedWake`]).
    pub fn ranged_for_poll(clock: VmClock) -> std::io::Result<Self> {
        Ok(Self {
            ranged: Some(RangedWake::default()),
            ..Self::for_poll(clock)?
        })
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
        if let Some(r) = &self.ranged {
            if !r.arm(deadline) {
                return Ok(());
            }
            r.doorbell_armed();
        }
        self.fd
            .arm_at(self.clock.to_monotonic(deadline))
            .map_err(host_err)
    }

    /// Disarms (ranged: no system call; a doorbell still armed is cleared by the sleeper).
    pub fn disarm_now(&self) -> Result<(), HostTimerError> {
        if let Some(r) = &self.ranged {
            r.disarm();
            return Ok(());
        }
        self.fd.disarm().map_err(host_err)
    }

    /// Blocks until the timer expires.
    pub fn wait(&self) -> std::io::Result<u64> {
        self.fd.wait()
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
