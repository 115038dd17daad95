//! Host timers behind `timer::HostTimer`: each vCPU's host tick is a POSIX timer that sends
//! the kick signal to the vCPU's own thread, armed at absolute CLOCK_MONOTONIC deadlines and
//! created on first use by that thread; a blocked vCPU waits on its wake-up timerfd (which the
//! timer model re-arms from any thread without waking it), and the `central` model's thread
//! waits on a timerfd too. Each remembers the VM-clock deadline it is armed for and registers
//! with the clock, which re-arms it when the VM resumes from a pause (`irqchip::clock`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use timer::{HostTimer, HostTimerError, Nanos};

use crate::host::sys::posix_timer::PosixTimer;
use crate::host::sys::timerfd::TimerFd;
use crate::irqchip::clock::{Rearm, VmClock};
use crate::state::lock;

fn host_err(e: std::io::Error) -> HostTimerError {
    HostTimerError::TimerFd(vmm_sys_util::errno::Error::new(
        e.raw_os_error().unwrap_or(0),
    ))
}

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
        let deadline = self.deadline.load(Ordering::Acquire);
        if deadline == DISARMED {
            return;
        }
        if let Some(t) = lock(&self.timer).as_mut() {
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
            slot @ None => slot.insert(PosixTimer::for_current_thread().map_err(host_err)?),
        };
        self.tick.deadline.store(deadline, Ordering::Release);
        t.arm_at(self.clock.to_monotonic(deadline))
            .map_err(host_err)
    }

    fn disarm(&mut self) -> Result<(), HostTimerError> {
        self.tick.deadline.store(DISARMED, Ordering::Release);
        match lock(&self.tick.timer).as_mut() {
            Some(t) => t.disarm().map_err(host_err),
            None => Ok(()),
        }
    }
}

/// An absolute VM-clock timerfd that one thread waits on and any thread may arm.
pub struct SharedTimerFd {
    fd: TimerFd,
    clock: VmClock,
    /// The VM-clock deadline armed (a thaw of the clock re-arms it).
    deadline: AtomicU64,
}

impl SharedTimerFd {
    /// A disarmed timerfd on `clock`'s time base whose reads block (the central thread's).
    pub fn new(clock: VmClock) -> std::io::Result<Arc<Self>> {
        Ok(Self::registered(TimerFd::new()?, clock))
    }

    /// A disarmed timerfd on `clock`'s time base to wait on with poll (a vCPU's wake-up).
    pub fn for_poll(clock: VmClock) -> std::io::Result<Arc<Self>> {
        Ok(Self::registered(TimerFd::nonblocking()?, clock))
    }

    fn registered(fd: TimerFd, clock: VmClock) -> Arc<Self> {
        let this = Arc::new(Self {
            fd,
            clock: clock.clone(),
            deadline: AtomicU64::new(DISARMED),
        });
        clock.on_thaw(Arc::downgrade(&(this.clone() as Arc<dyn Rearm>)));
        this
    }

    /// The fd, to poll.
    pub fn fd(&self) -> &TimerFd {
        &self.fd
    }

    /// Arms for an absolute VM-clock deadline.
    pub fn arm_at(&self, deadline: Nanos) -> Result<(), HostTimerError> {
        self.deadline.store(deadline, Ordering::Release);
        self.fd
            .arm_at(self.clock.to_monotonic(deadline))
            .map_err(host_err)
    }

    /// Disarms.
    pub fn disarm_now(&self) -> Result<(), HostTimerError> {
        self.deadline.store(DISARMED, Ordering::Release);
        self.fd.disarm().map_err(host_err)
    }

    /// Blocks until the timer expires.
    pub fn wait(&self) -> std::io::Result<u64> {
        self.fd.wait()
    }
}

impl Rearm for SharedTimerFd {
    fn rearm(&self, clock: &VmClock) {
        let deadline = self.deadline.load(Ordering::Acquire);
        if deadline == DISARMED {
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
