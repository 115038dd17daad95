//! An absolute CLOCK_MONOTONIC timerfd that one thread waits on and any thread may arm.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::clock::{one_shot, timespec};

/// A one-shot timerfd on CLOCK_MONOTONIC.
#[derive(Debug)]
pub struct TimerFd {
    fd: OwnedFd,
}

impl TimerFd {
    /// A disarmed timerfd whose reads block until it expires.
    pub fn new() -> std::io::Result<Self> {
        Self::with_flags(libc::TFD_CLOEXEC)
    }

    /// A disarmed timerfd whose reads never block (for waiting with poll).
    pub fn nonblocking() -> std::io::Result<Self> {
        Self::with_flags(libc::TFD_CLOEXEC | libc::TFD_NONBLOCK)
    }

    fn with_flags(flags: libc::c_int) -> std::io::Result<Self> {
        // SAFETY: timerfd_create has no memory arguments; the result is checked.
        let raw = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, flags) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { fd })
    }

    /// Arms for the absolute CLOCK_MONOTONIC time `at_ns` (at least 1: zero would disarm).
    pub fn arm_at(&self, at_ns: u64) -> std::io::Result<()> {
        self.settime(timespec(at_ns.max(1)), libc::TFD_TIMER_ABSTIME)
    }

    /// Disarms.
    pub fn disarm(&self) -> std::io::Result<()> {
        self.settime(timespec(0), 0)
    }

    fn settime(&self, value: libc::timespec, flags: libc::c_int) -> std::io::Result<()> {
        let spec = one_shot(value);
        // SAFETY: the fd is a timerfd owned by self and `spec` is a valid itimerspec.
        let rc = unsafe {
            libc::timerfd_settime(self.fd.as_raw_fd(), flags, &spec, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consumes an expiry without blocking (a nonblocking timerfd); false if there was none.
    pub fn consume(&self) -> bool {
        let mut count = 0u64;
        // SAFETY: reads at most 8 bytes into `count` from a timerfd owned by self.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), std::ptr::addr_of_mut!(count).cast(), 8) };
        n == 8
    }

    /// Blocks until the timer expires; returns the number of expiries.
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

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
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

    /// What a blocked vCPU relies on when it leaves an expiry unread (`irqchip/user/wait.rs`):
    /// programming the timer again, armed or disarmed, drops it, so a wait after that is not
    /// woken by it.
    #[test]
    fn reprogramming_drops_an_unread_expiry() {
        let kick = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let t = TimerFd::nonblocking().unwrap();
        let readable = |t: &TimerFd| {
            let w = crate::sys::poll::wait(&kick, Some(t), Some(std::time::Duration::ZERO));
            w.unwrap().wake
        };
        let fired = |t: &TimerFd| crate::sys::poll::wait(&kick, Some(t), None).unwrap().wake;
        t.arm_at(1).unwrap();
        assert!(fired(&t), "an expired deadline fires");
        t.arm_at(u64::MAX / 2).unwrap();
        assert!(!readable(&t), "re-arming left the expiry readable");
        t.arm_at(1).unwrap();
        assert!(fired(&t));
        t.disarm().unwrap();
        assert!(!readable(&t), "disarming left the expiry readable");
    }
}
