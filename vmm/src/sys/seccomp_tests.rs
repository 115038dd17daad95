//! The filters at work: each case forks a child that installs one thread kind's real filter
//! and makes one syscall; the parent reads how the child ended. A refused syscall ends the
//! child by SIGSYS (`--seccomp on`); with `--seccomp log` the same syscall goes through.

use crate::seccomp::*;

/// What the child does after installing its filter.
#[derive(Debug, Clone, Copy)]
enum Probe {
    /// Only allowed calls: getpid, a read-only open of /proc, disk-image I/O (pwrite and
    /// fdatasync on no descriptor: they fail, are allowed), a KVM-type ioctl (fails, is
    /// allowed), exit 0.
    Allowed,
    /// socket(2): forbidden for every thread.
    Socket,
    /// execve(2): forbidden for every thread.
    Exec,
    /// open for writing without O_CREAT: forbidden for every thread.
    OpenForWriting,
    /// A terminal ioctl: forbidden for vCPU threads.
    TerminalIoctl,
    /// kill(2) of another process (init): forbidden (tgkill only, and only to lull).
    SignalOtherProcess,
}

/// How the child ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    Exited(i32),
    Signalled(i32),
}

fn run_child(kind: ThreadKind, mode: SeccompMode, probe: Probe) -> Ended {
    let program = program(kind, mode).unwrap().unwrap();
    let path = c"/proc/self/status";
    let bin = c"/bin/true";
    let argv = [bin.as_ptr(), std::ptr::null()];
    // SAFETY: the child only makes raw system calls on data prepared before the fork (no
    // allocation, no locks) and leaves with _exit; the parent only waits for it.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        if seccompiler::apply_filter(&program).is_err() {
            // SAFETY: _exit is async-signal-safe and ends the forked child.
            unsafe { libc::_exit(100) };
        }
        // SAFETY: plain system calls with valid arguments (a NUL-terminated path, a null-ended
        // argv, invalid descriptors where the call is meant to fail); the child then exits.
        unsafe {
            match probe {
                Probe::Allowed => {
                    libc::syscall(libc::SYS_getpid);
                    let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        libc::_exit(101);
                    }
                    libc::close(fd);
                    let byte = [0u8; 1];
                    libc::pwrite(-1, byte.as_ptr().cast(), 1, 0);
                    libc::pread(-1, std::ptr::null_mut(), 0, 0);
                    libc::fdatasync(-1);
                    if kind == ThreadKind::Vcpu {
                        libc::ioctl(-1, 0xAE80); // KVM_RUN on no fd: EBADF, but allowed
                    }
                }
                Probe::Socket => {
                    libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0);
                }
                Probe::Exec => {
                    libc::execv(bin.as_ptr(), argv.as_ptr());
                    libc::_exit(102);
                }
                Probe::OpenForWriting => {
                    libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                }
                Probe::TerminalIoctl => {
                    libc::ioctl(0, libc::TCGETS, std::ptr::null_mut::<libc::termios>());
                }
                Probe::SignalOtherProcess => {
                    libc::kill(1, 0);
                }
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above; `status` is a valid out pointer.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    if libc::WIFSIGNALED(status) {
        Ended::Signalled(libc::WTERMSIG(status))
    } else {
        Ended::Exited(libc::WEXITSTATUS(status))
    }
}

#[test]
fn allowed_syscalls_pass_under_every_filter() {
    for kind in [ThreadKind::Vcpu, ThreadKind::Timers, ThreadKind::Vmm] {
        assert_eq!(
            run_child(kind, SeccompMode::On, Probe::Allowed),
            Ended::Exited(0),
            "{kind:?}"
        );
    }
}

#[test]
fn a_forbidden_syscall_kills_the_process() {
    let cases = [
        (ThreadKind::Vcpu, Probe::Socket),
        (ThreadKind::Vcpu, Probe::Exec),
        (ThreadKind::Vcpu, Probe::OpenForWriting),
        (ThreadKind::Vcpu, Probe::TerminalIoctl),
        (ThreadKind::Vcpu, Probe::SignalOtherProcess),
        (ThreadKind::Timers, Probe::Socket),
        (ThreadKind::Vmm, Probe::Socket),
        (ThreadKind::Vmm, Probe::Exec),
        (ThreadKind::Vmm, Probe::OpenForWriting),
    ];
    for (kind, probe) in cases {
        assert_eq!(
            run_child(kind, SeccompMode::On, probe),
            Ended::Signalled(libc::SIGSYS),
            "{kind:?} {probe:?}"
        );
    }
}

#[test]
fn log_mode_lets_the_syscall_through() {
    assert_eq!(
        run_child(ThreadKind::Vcpu, SeccompMode::Log, Probe::Socket),
        Ended::Exited(0)
    );
    assert_eq!(program(ThreadKind::Vcpu, SeccompMode::Off).unwrap(), None);
}
