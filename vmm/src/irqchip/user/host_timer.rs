//! Host timers behind `timer::HostTimer`: each vCPU's host tick is a POSIX timer that sends
//! the kick signal to the vCPU's own thread, armed at absolute CLOCK_MONOTONIC deadlines and
//! created on first use by that thread; a blocked vCPU waits on its wake-up timerfd (which the
//! timer model re-arms from any thread without waking it), and the `central` model's thread
//! waits on a timerfd too.

use std::sync::Arc;

use timer::{HostTimer, HostTimerError, Nanos};

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

/// An absolute VM-clock timerfd that one thread waits on and any thread may arm.
pub struct SharedTimerFd {
    fd: TimerFd,
    clock: VmClock,
}

impl SharedTimerFd {
    /// A disarmed timerfd on `clock`'s time base whose reads block (the central thread's).
    pub fn new(clock: VmClock) -> std::io::Result<Self> {
        Ok(Self {
            fd: TimerFd::new()?,
            clock,
        })
    }

    /// A disarmed timerfd on `clock`'s time base to wait on with poll (a vCPU's wake-up).
    pub fn for_poll(clock: VmClock) -> std::io::Result<Self> {
        Ok(Self {
            fd: TimerFd::nonblocking()?,
            clock,
        })
    }

    /// The fd, to poll.
    pub fn fd(&self) -> &TimerFd {
        &self.fd
    }

    /// Arms for an absolute VM-clock deadline.
    pub fn arm_at(&self, deadline: Nanos) -> Result<(), HostTimerError> {
        self.fd
            .arm_at(self.clock.to_monotonic(deadline))
            .map_err(host_err)
    }

    /// Disarms.
    pub fn disarm_now(&self) -> Result<(), HostTimerError> {
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
