//! The stop signals SIGINT, SIGTERM and SIGHUP (a closed terminal): a handler that writes an
//! eventfd the VMM thread's event loop watches, so a stop request is handled as an ordinary
//! event (with which signal it was), and every one ends lull as a stop by the user (status
//! 12, metrics written, disks synced, the API socket removed).
//!
//! No stop signal is lost to its default action (death, status 128 + N, nothing written):
//! [`block_early`] is the first thing `main` does, before any thread exists, and keeps them
//! pending; [`install_early`] then puts the handler in place and unblocks them, so a signal
//! that came in between is handled the moment it is unblocked. Until the first [`install`]
//! (the event loop's, or the API server's) a signal is only noted; that install finds it and
//! wakes its loop at once. Only a signal that arrives before `main` runs (while the program
//! is loaded) still meets the default action; a parent that must not lose one blocks it
//! before it starts lull (the mask and the pending signal survive `execve`).
//!
//! SIGHUP is left ignored if lull was started with it ignored (`nohup`): then a closed
//! terminal does not stop lull, as its caller asked.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// The signals that stop lull.
pub const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Eventfd the handler writes to (-1 until set).
static SIGNAL_EVENT_FD: AtomicI32 = AtomicI32::new(-1);
/// The last stop signal received (0: none).
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// SIGHUP was ignored when lull started: it stays ignored.
static HUP_IGNORED: AtomicBool = AtomicBool::new(false);

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

/// The stop signals lull handles: all three, but SIGHUP if it was ignored at start.
fn handled() -> impl Iterator<Item = libc::c_int> {
    let hup_ignored = HUP_IGNORED.load(Ordering::Relaxed);
    STOP_SIGNALS
        .into_iter()
        .filter(move |&sig| !(sig == libc::SIGHUP && hup_ignored))
}

fn register() -> std::io::Result<()> {
    for sig in handled() {
        vmm_sys_util::signal::register_signal_handler(sig, on_stop_signal)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    }
    Ok(())
}

/// Changes this thread's mask for the stop signals: `how` is `SIG_BLOCK` or `SIG_UNBLOCK`.
fn mask(how: libc::c_int) -> std::io::Result<()> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set it is given, which `set` has room for.
    if unsafe { libc::sigemptyset(set.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    for sig in STOP_SIGNALS {
        // SAFETY: `set` was initialised by sigemptyset above; `sig` is a valid signal number.
        if unsafe { libc::sigaddset(set.as_mut_ptr(), sig) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: `set` is initialised; a null old set is allowed (the old mask is not wanted).
    let rc = unsafe { libc::pthread_sigmask(how, set.as_ptr(), std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Whether `sig`'s disposition is "ignore" (what lull inherited, before it changes any).
fn is_ignored(sig: libc::c_int) -> std::io::Result<bool> {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::uninit();
    // SAFETY: with a null new action, sigaction only writes the current one into `old`, which
    // has room for it.
    if unsafe { libc::sigaction(sig, std::ptr::null(), old.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: sigaction succeeded, so it wrote `old` whole.
    let old = unsafe { old.assume_init() };
    Ok(old.sa_sigaction == libc::SIG_IGN)
}

/// Blocks SIGINT, SIGTERM and SIGHUP on this thread, and notes whether SIGHUP was ignored at
/// start. Call it first thing in `main`, before any thread is started: from then on a stop
/// signal waits, pending, for [`install_early`] (or, for `lull bench`, [`unblock`]).
pub fn block_early() -> std::io::Result<()> {
    mask(libc::SIG_BLOCK)?;
    HUP_IGNORED.store(is_ignored(libc::SIGHUP)?, Ordering::Relaxed);
    Ok(())
}

/// Unblocks the stop signals on this thread, with their dispositions untouched.
pub fn unblock() -> std::io::Result<()> {
    mask(libc::SIG_UNBLOCK)
}

/// Installs the handlers with no eventfd yet (a signal is noted for the first [`install`]) and
/// unblocks the stop signals on this thread (threads started later inherit its mask): one
/// that came since [`block_early`], or that a parent left pending and blocked, is handled
/// now.
pub fn install_early() -> std::io::Result<()> {
    register()?;
    unblock()
}

/// Installs the stop-signal handlers that wake the VMM thread; returns the eventfd they
/// write. If a signal came after [`install_early`] and before the first call of this, the
/// eventfd is written at once.
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

/// The last stop signal received, if any (`libc::SIGINT`, `libc::SIGTERM` or
/// `libc::SIGHUP`).
pub fn last_signal() -> Option<libc::c_int> {
    match LAST_SIGNAL.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}
