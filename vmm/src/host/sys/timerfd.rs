//! An absolute CLOCK_MONOTONIC timerfd that one thread waits on and any thread may arm.
//!
//! The calls go through nix: the same `timerfd_create`, `timerfd_settime` and `read` system
//! calls as by hand, with nothing allocated (nix builds the `itimerspec` on the stack and turns
//! a failure into an errno), so arming and consuming cost what they did per timer event.

use std::os::fd::{AsFd, AsRawFd};

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFlags, TimerSetTimeFlags};

use super::clock::timespec;

/// A one-shot timerfd on CLOCK_MONOTONIC.
#[derive(Debug)]
pub struct TimerFd {
    fd: nix::sys::timerfd::TimerFd,
}

impl TimerFd {
    /// A disarmed timerfd whose reads block until it expires.
    pub fn new() -> std::io::Result<Self> {
        Self::with_flags(TimerFlags::TFD_CLOEXEC)
    }

    /// A disarmed timerfd whose reads never block (for waiting with poll).
    pub fn nonblocking() -> std::io::Result<Self> {
        Self::with_flags(TimerFlags::TFD_CLOEXEC | TimerFlags::TFD_NONBLOCK)
    }

    fn with_flags(flags: TimerFlags) -> std::io::Result<Self> {
        let fd = nix::sys::timerfd::TimerFd::new(ClockId::CLOCK_MONOTONIC, flags)?;
        Ok(Self { fd })
    }

    /// Arms for the absolute CLOCK_MONOTONIC time `at_ns` (at least 1: zero would disarm).
    pub fn arm_at(&self, at_ns: u64) -> std::io::Result<()> {
        let at = Expiration::OneShot(TimeSpec::from_timespec(timespec(at_ns.max(1))));
        self.fd.set(at, TimerSetTimeFlags::TFD_TIMER_ABSTIME)?;
        Ok(())
    }

    /// Disarms.
    pub fn disarm(&self) -> std::io::Result<()> {
        self.fd.unset()?;
        Ok(())
    }

    /// Reads the expiry count (8 bytes); `None` if the read returned fewer.
    fn read_count(&self) -> nix::Result<Option<u64>> {
        let mut count = [0u8; 8];
        let n = nix::unistd::read(&self.fd, &mut count)?;
        Ok((n == 8).then_some(u64::from_ne_bytes(count)))
    }

    /// Consumes an expiry without blocking (a nonblocking timerfd); false if there was none.
    pub fn consume(&self) -> bool {
        matches!(self.read_count(), Ok(Some(_)))
    }

    /// Blocks until the timer expires; returns the number of expiries.
    pub fn wait(&self) -> std::io::Result<u64> {
        match self.read_count() {
            Ok(Some(count)) => Ok(count),
            Ok(None) => Err(std::io::Error::last_os_error()),
            Err(e) => Err(e.into()),
        }
    }
}

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_fd().as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_deadline_is_read_at_once() {
        let t = TimerFd::new().unwrap();
        t.arm_at(1).unwrap();
        assert_eq!(t.wait().unwrap(), 1);
        t.disarm().unwrap();
        let n = TimerFd::nonblocking().unwrap();
        assert!(!n.consume(), "nothing expired yet");
        n.arm_at(1).unwrap();
        while !n.consume() {
            std::hint::spin_loop();
        }
    }
}
