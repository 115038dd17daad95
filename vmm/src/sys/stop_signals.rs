//! SIGINT and SIGTERM: a handler that writes an eventfd the VMM thread's event loop watches,
//! so a stop request is handled as an ordinary event (with which signal it was).

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

/// Installs SIGINT/SIGTERM handlers that wake the VMM thread; returns the eventfd they write.
pub fn install() -> std::io::Result<EventFd> {
    let evt = EventFd::new(EFD_NONBLOCK)?;
    let raw = evt.try_clone()?;
    SIGNAL_EVENT_FD.store(raw.as_raw_fd(), Ordering::Relaxed);
    std::mem::forget(raw); // the handler may run until the process exits
    for sig in [libc::SIGINT, libc::SIGTERM] {
        vmm_sys_util::signal::register_signal_handler(sig, on_stop_signal)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
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
