//! Host timers behind `timer::HostTimer`: each vCPU's host tick is a POSIX timer that sends
//! the kick signal to the vCPU's own thread (`SIGEV_THREAD_ID`), armed at absolute
//! CLOCK_MONOTONIC deadlines; the `central` model's thread sleeps on a futex with a timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::Duration;

use timer::{Clock, HostTimer, HostTimerError, Nanos, NEVER};

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

/// The `central` model's timer thread alarm: any thread may move its deadline; the timer
/// thread sleeps until it (a futex wait with a timeout). Arming costs an atomic store, and a
/// wake-up of the timer thread only when the deadline moves earlier, so the model never makes
/// a system call while it holds its queue lock for a later deadline.
pub struct TimerThreadAlarm {
    deadline: AtomicU64,
    thread: OnceLock<Thread>,
    clock: VmClock,
}

impl TimerThreadAlarm {
    /// A disarmed alarm on `clock`'s time base.
    pub fn new(clock: VmClock) -> Self {
        Self {
            deadline: AtomicU64::new(NEVER),
            thread: OnceLock::new(),
            clock,
        }
    }

    /// Called by the timer thread when it starts.
    pub fn bind_current_thread(&self) {
        let _ = self.thread.set(std::thread::current());
    }

    /// Sets the deadline (VM clock); wakes the timer thread if it moved earlier.
    pub fn arm_at(&self, deadline: Nanos) {
        let old = self.deadline.swap(deadline, Ordering::SeqCst);
        if deadline < old {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// Disarms (the timer thread sleeps until armed again).
    pub fn disarm_now(&self) {
        self.deadline.store(NEVER, Ordering::SeqCst);
    }

    /// Blocks the timer thread until the deadline has passed.
    pub fn wait(&self) {
        loop {
            let deadline = self.deadline.load(Ordering::SeqCst);
            let now = self.clock.now();
            if deadline <= now {
                return;
            }
            if deadline == NEVER {
                std::thread::park();
            } else {
                std::thread::park_timeout(Duration::from_nanos(deadline - now));
            }
        }
    }
}

/// The `central` timer thread's host timer, a handle on the shared alarm.
pub struct CentralHostTimer(pub std::sync::Arc<TimerThreadAlarm>);

impl HostTimer for CentralHostTimer {
    fn arm(&mut self, deadline: Nanos) -> Result<(), HostTimerError> {
        self.0.arm_at(deadline);
        Ok(())
    }

    fn disarm(&mut self) -> Result<(), HostTimerError> {
        self.0.disarm_now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarm_wakes_its_thread_at_the_deadline_and_earlier_when_moved() {
        let clock = VmClock::new();
        let alarm = std::sync::Arc::new(TimerThreadAlarm::new(clock));
        alarm.arm_at(clock.now() + 5_000_000);
        let waiter = {
            let alarm = alarm.clone();
            std::thread::spawn(move || {
                alarm.bind_current_thread();
                alarm.wait();
                clock.now()
            })
        };
        // Moving the deadline earlier (to now) ends the wait without waiting 5 ms more.
        alarm.arm_at(clock.now());
        let woke = waiter.join().unwrap();
        assert!(woke >= alarm.deadline.load(Ordering::SeqCst));
    }
}
