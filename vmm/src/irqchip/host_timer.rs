//! Host timers behind `timer::HostTimer`: each vCPU's host tick is a POSIX timer that sends
//! the kick signal to the vCPU's own thread (`SIGEV_THREAD_ID`), armed at absolute
//! CLOCK_MONOTONIC deadlines; the `central` model's thread waits on a timerfd.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use timer::{HostTimer, HostTimerError, Nanos};

use super::clock::{timespec, VmClock};
use super::kick;

fn last_os_error() -> HostTimerError {
    HostTimerError::TimerFd(vmm_sys_util::errno::Error::last())
}

/// A POSIX timer created on first use by the thread that arms it, signalling that thread.
pub struct ThreadTickTimer {
    clock: VmClock,
    id: Option<libc::timer_t>,
}

// SAFETY: a `timer_t` is a process-wide timer id, usable from any thread; the timer is only
// armed by its owner (the vCPU thread it signals) but may be moved there after creation.
unsafe impl Send for ThreadTickTimer {}

impl ThreadTickTimer {
    /// A timer on `clock`'s time base, not yet created.
    pub fn new(clock: VmClock) -> Self {
        Self { clock, id: None }
    }

    fn timer_id(&mut self) -> Result<libc::timer_t, HostTimerError> {
        if let Some(id) = self.id {
            return Ok(id);
        }
        // SAFETY: sigevent is plain data; zeroed is a valid starting value.
        let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = kick::kick_signal();
        sev.sigev_notify_thread_id = kick::current_tid();
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: `sev` and `id` are valid for the call; the timer signals this thread.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut id) } != 0 {
            return Err(last_os_error());
        }
        self.id = Some(id);
        Ok(id)
    }

    fn settime(&mut self, value: libc::timespec, flags: libc::c_int) -> Result<(), HostTimerError> {
        let id = self.timer_id()?;
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: `id` is a live timer of this process and `spec` a valid itimerspec.
        if unsafe { libc::timer_settime(id, flags, &spec, std::ptr::null_mut()) } != 0 {
            return Err(last_os_error());
        }
        Ok(())
    }
}

impl HostTimer for ThreadTickTimer {
    fn arm(&mut self, deadline: Nanos) -> Result<(), HostTimerError> {
        // A zero it_value would disarm: an absolute time of at least 1 ns always fires.
        let at = self.clock.to_monotonic(deadline).max(1);
        self.settime(timespec(at), libc::TIMER_ABSTIME)
    }

    fn disarm(&mut self) -> Result<(), HostTimerError> {
        if self.id.is_none() {
            return Ok(());
        }
        self.settime(
            libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            0,
        )
    }
}

impl Drop for ThreadTickTimer {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            // SAFETY: `id` is a live timer created by this struct and deleted once.
            unsafe { libc::timer_delete(id) };
        }
    }
}

/// An absolute CLOCK_MONOTONIC timerfd that one thread waits on and any thread may arm.
pub struct SharedTimerFd {
    fd: OwnedFd,
    clock: VmClock,
}

impl SharedTimerFd {
    /// A disarmed timerfd on `clock`'s time base.
    pub fn new(clock: VmClock) -> std::io::Result<Self> {
        // SAFETY: timerfd_create has no memory arguments; the result is checked.
        let raw = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { fd, clock })
    }

    fn settime(&self, value: libc::timespec, flags: libc::c_int) -> Result<(), HostTimerError> {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: the fd is a timerfd owned by self and `spec` is a valid itimerspec.
        let rc = unsafe {
            libc::timerfd_settime(self.fd.as_raw_fd(), flags, &spec, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(last_os_error());
        }
        Ok(())
    }

    /// Arms for an absolute VM-clock deadline.
    pub fn arm_at(&self, deadline: Nanos) -> Result<(), HostTimerError> {
        let at = self.clock.to_monotonic(deadline).max(1);
        self.settime(timespec(at), libc::TFD_TIMER_ABSTIME)
    }

    /// Disarms.
    pub fn disarm_now(&self) -> Result<(), HostTimerError> {
        self.settime(
            libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            0,
        )
    }

    /// Blocks until the timer expires.
    pub fn wait(&self) -> std::io::Result<u64> {
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into `count` from a timerfd owned by self.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), std::ptr::addr_of_mut!(count).cast(), 8) };
        if n == 8 {
            Ok(count)
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// The `central` timer thread's host timer, a handle on a shared timerfd.
pub struct CentralHostTimer(pub std::sync::Arc<SharedTimerFd>);

impl HostTimer for CentralHostTimer {
    fn arm(&mut self, deadline: Nanos) -> Result<(), HostTimerError> {
        self.0.arm_at(deadline)
    }

    fn disarm(&mut self) -> Result<(), HostTimerError> {
        self.0.disarm_now()
    }
}
