//! Kicking a vCPU thread out of KVM_RUN: a real-time signal whose handler sets the thread's
//! `kvm_run.immediate_exit`, so a kick that lands just before KVM_RUN is not lost either.
//!
//! The same signal is the target of each vCPU's host tick (a POSIX timer with
//! `SIGEV_THREAD_ID`), so "my timer is due" and "you have mail" look alike to the vCPU: KVM_RUN
//! returns `EINTR` and the run loop looks at its mailbox and timers.

use std::cell::Cell;
use std::sync::Once;

use kvm_bindings::kvm_run;

thread_local! {
    /// This thread's `kvm_run` page, or null on threads that run no vCPU.
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

/// The kick signal.
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 1
}

extern "C" fn on_kick(_num: libc::c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    let run = KVM_RUN.with(Cell::get);
    if !run.is_null() {
        // SAFETY: `run` is this thread's kvm_run mapping, registered by `register_vcpu_thread`
        // and valid until the VcpuFd is dropped, which happens only after
        // `unregister_vcpu_thread`; a volatile byte store is async-signal-safe.
        unsafe { std::ptr::addr_of_mut!((*run).immediate_exit).write_volatile(1) };
    }
}

/// Installs the kick handler (once per process).
pub fn install_handler() -> Result<(), vmm_sys_util::errno::Error> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = vmm_sys_util::signal::register_signal_handler(kick_signal(), on_kick);
    });
    result
}

/// Makes kicks of this thread set `run.immediate_exit`.
pub fn register_vcpu_thread(run: *mut kvm_run) {
    KVM_RUN.with(|c| c.set(run));
}

/// `kvm_run.cr8` of this thread's vCPU as KVM left it at the last exit (the guest's CR8
/// without an in-kernel LAPIC), readable while the exit borrows the rest of the page; `None`
/// on a thread with no registered vCPU.
pub fn registered_cr8() -> Option<u64> {
    let run = KVM_RUN.with(Cell::get);
    if run.is_null() {
        return None;
    }
    // SAFETY: `run` is this thread's kvm_run mapping, registered by `register_vcpu_thread` and
    // valid until `unregister_vcpu_thread` (see `on_kick`); `cr8` lies outside the exit union
    // an exit borrows, and the volatile read makes no reference to it.
    Some(unsafe { std::ptr::addr_of!((*run).cr8).read_volatile() })
}

/// Stops kicks of this thread touching its `kvm_run` (before the VcpuFd goes away).
pub fn unregister_vcpu_thread() {
    KVM_RUN.with(|c| c.set(std::ptr::null_mut()));
}

/// This thread's kernel id, for `SIGEV_THREAD_ID` and `tgkill`.
pub fn current_tid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Sends the kick signal to thread `tid` of this process.
pub fn kick_thread(tid: libc::pid_t) {
    // SAFETY: tgkill only sends a signal; a stale tid of an exited thread gets ESRCH.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, kick_signal()) };
}

/// Blocks the kick signal on this thread, so that kicks of it stay pending (tests).
#[cfg(test)]
pub fn block_kicks() {
    vmm_sys_util::signal::block_signal(kick_signal()).expect("block the kick signal");
}

/// Consumes a kick pending on this thread (blocked with [`block_kicks`]); true if there was one.
#[cfg(test)]
pub fn take_pending_kick() -> bool {
    let set = vmm_sys_util::signal::create_sigset(&[kick_signal()]).expect("a sigset");
    let now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: sigtimedwait reads `set` and `now`, which outlive the call, and writes no
    // siginfo (null); with a zero timeout it only takes a signal already pending.
    unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &now) == kick_signal() }
}
