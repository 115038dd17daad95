//! A POSIX timer that sends the kick signal to the thread that created it (`SIGEV_THREAD_ID`),
//! armed at absolute CLOCK_MONOTONIC times: a vCPU thread's host tick, which interrupts
//! KVM_RUN when one of its timers is due.
//!
//! Hand-written, not nix's `Timer`: nix's `SigevNotify::SigevThreadId` takes its `Signal`
//! enum, which has no real-time signals, and the kick is `SIGRTMIN + 1`; nix's `Timer` is not
//! `Send` either, so the `unsafe impl Send` below would stay.

use super::clock::{one_shot, timespec};
use super::kick;

/// A POSIX timer signalling its creating thread with [`kick::kick_signal`].
#[derive(Debug)]
pub struct PosixTimer {
    id: libc::timer_t,
}

// SAFETY: a `timer_t` is a process-wide timer id, usable from any thread; the signal always
// goes to the thread that created it, whichever thread arms it.
unsafe impl Send for PosixTimer {}

impl PosixTimer {
    /// Creates a disarmed timer that signals the calling thread.
    pub fn for_current_thread() -> std::io::Result<Self> {
        // SAFETY: sigevent is plain data; zeroed is a valid starting value.
        let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = kick::kick_signal();
        sev.sigev_notify_thread_id = kick::current_tid();
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: `sev` and `id` are valid for the call; the timer signals this thread.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut id) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { id })
    }

    /// Arms for the absolute CLOCK_MONOTONIC time `at_ns` (at least 1: zero would disarm).
    pub fn arm_at(&mut self, at_ns: u64) -> std::io::Result<()> {
        self.settime(timespec(at_ns.max(1)), libc::TIMER_ABSTIME)
    }

    /// Disarms.
    pub fn disarm(&mut self) -> std::io::Result<()> {
        self.settime(timespec(0), 0)
    }

    fn settime(&mut self, value: libc::timespec, flags: libc::c_int) -> std::io::Result<()> {
        let spec = one_shot(value);
        // SAFETY: `id` is a live timer of this process and `spec` a valid itimerspec.
        if unsafe { libc::timer_settime(self.id, flags, &spec, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for PosixTimer {
    fn drop(&mut self) {
        // SAFETY: `id` is a live timer created by this struct and deleted once.
        unsafe { libc::timer_delete(self.id) };
    }
}
