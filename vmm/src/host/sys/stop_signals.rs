//! SIGINT and SIGTERM: a handler that writes an eventfd the VMM thread's event loop watches,
//! so a stop request is handled as an ordinary event (with which signal it was).
//!
//! [`install_early`] puts the handler in place at the start of `lull run`, before anything
//! that takes time (KVM, loading the guest): a signal then is only noted, and the first
//! [`install`] (the event loop's, or the API server's) finds it and wakes its loop at once, so
//! an early SIGTERM still ends the run as a stop by the user (status 12, metrics written). It
//! also unblocks both signals, which a parent may have left blocked in lull's mask.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Eventfd the handler writes to (-1 until set).
static SIGNAL_EVENT_FD: AtomicI32 = AtomicI32::new(-1);
/// The last stop signal received (0: none).
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(
    num: libc::c_int,
    _info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    LAST_SIGNAL.store(num, Ordering::Relaxed);
    let fd = SIGNAL_EVENT_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; `fd` is an eventfd that lives for the whole
        // process (leaked on purpose), and `one` is 8 readable bytes.
        unsafe { libc::write(fd, std::ptr::addr_of!(one).cast(), 8) };
    }
}

fn register() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        vmm_sys_util::signal::register_signal_handler(sig, on_stop_signal)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    }
    Ok(())
}

/// Installs the handlers with no eventfd yet (a signal is noted for the first [`install`]) and
/// unblocks SIGINT and SIGTERM on this thread (threads started later inherit its mask).
pub fn install_early() -> std::io::Result<()> {
    register()?;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        vmm_sys_util::signal::unblock_signal(sig)
            .map_err(|e| std::io::Error::other(format!("cannot unblock signal {sig}: {e}")))?;
    }
    Ok(())
}

/// Installs SIGINT/SIGTERM handlers that wake the VMM thread; returns the eventfd they write.
/// If a signal came after [`install_early`] and before the first call of this, the eventfd is
/// written at once.
pub fn install() -> std::io::Result<EventFd> {
    let evt = EventFd::new(EFD_NONBLOCK)?;
    let raw = evt.try_clone()?;
    let before = SIGNAL_EVENT_FD.swap(raw.as_raw_fd(), Ordering::Relaxed);
    std::mem::forget(raw); // the handler may run until the process exits
    register()?;
    if before < 0 && last_signal().is_some() {
        evt.write(1)?;
    }
    Ok(evt)
}

/// The last stop signal received, if any (`libc::SIGINT` or `libc::SIGTERM`).
pub fn last_signal() -> Option<libc::c_int> {
    match LAST_SIGNAL.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}
