//! Waiting for a blocked vCPU's events: its kick eventfd, its wake-up timerfd, a timeout.
//!
//! `ppoll` stays hand-written, not nix's: nix's `PollFd` borrows an `AsFd`, which
//! vmm-sys-util's `EventFd` (the kick) does not implement, so it would take the same `unsafe`
//! (`BorrowedFd::borrow_raw`) in another place, and change this function for its callers on
//! the halt path; the system call would be the same.

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use super::clock::timespec;

/// What ended a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Woken {
    /// The kick fd became readable.
    pub kick: bool,
    /// The wake-up timer fd became readable.
    pub wake: bool,
    /// A signal interrupted the wait (EINTR).
    pub interrupted: bool,
}

/// Blocks until `kick` or (if given) `wake` is readable, the timeout passes (`None`: no
/// timeout) or a signal arrives.
pub fn wait(
    kick: &impl AsRawFd,
    wake: Option<&dyn AsRawFd>,
    timeout: Option<Duration>,
) -> std::io::Result<Woken> {
    let fd = |raw: RawFd| libc::pollfd {
        fd: raw,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [fd(kick.as_raw_fd()), fd(wake.map_or(-1, |w| w.as_raw_fd()))];
    let count = if wake.is_some() { 2 } else { 1 };
    let ts = timeout.map(|t| timespec(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)));
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` holds `count` (<= 2) initialised pollfds that live across the call;
    // `ts_ptr` is null or points to `ts`, alive until the call returns; a null sigmask keeps
    // the thread's mask.
    let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), count, ts_ptr, std::ptr::null()) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(Woken {
                interrupted: true,
                ..Woken::default()
            });
        }
        return Err(e);
    }
    Ok(Woken {
        kick: fds[0].revents & libc::POLLIN != 0,
        wake: count == 2 && fds[1].revents & libc::POLLIN != 0,
        interrupted: false,
    })
}
