//! The filters at work: each case forks a child that installs one thread kind's real filter
//! and makes one syscall; the parent reads how the child ended. A refused syscall ends the
//! child by SIGSYS (`--seccomp on`); with `--seccomp log` the same syscall goes through.

use crate::seccomp::*;

/// What the child does after installing its filter.
#[derive(Debug, Clone, Copy)]
enum Probe {
    /// Only allowed calls: getpid, a read-only open of /proc, disk-image I/O (pwrite and
    /// fdatasync on no descriptor: they fail, are allowed), a KVM-type ioctl (fails, is
    /// allowed), for a vCPU its own CPU affinity read and set and getcpu, exit 0.
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
    /// sched_setaffinity of another task (init): forbidden (a vCPU sets its own only).
    AffinityOfOtherTask,
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
    // Out buffers of the affinity and getcpu probes, made before the fork.
    let mut cpu_set = std::mem::MaybeUninit::<libc::cpu_set_t>::zeroed();
    let mut cpu = std::mem::MaybeUninit::<libc::c_uint>::zeroed();
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
        // argv, invalid descriptors where the call is meant to fail, out buffers of the sizes
        // passed; the other task's affinity probe passes an empty set, which the kernel would
        // refuse); the child then exits.
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
                        let size = std::mem::size_of::<libc::cpu_set_t>();
                        let set: *mut libc::cpu_set_t = cpu_set.as_mut_ptr();
                        if libc::syscall(libc::SYS_sched_getaffinity, 0, size, set) < 0
                            || libc::syscall(libc::SYS_sched_setaffinity, 0, size, set) != 0
                            || libc::syscall(libc::SYS_getcpu, cpu.as_mut_ptr(), 0, 0) != 0
                        {
                            libc::_exit(103);
                        }
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
                Probe::AffinityOfOtherTask => {
                    let size = std::mem::size_of::<libc::cpu_set_t>();
                    let set: *mut libc::cpu_set_t = cpu_set.as_mut_ptr();
                    libc::syscall(libc::SYS_sched_setaffinity, 1, size, set);
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
        (ThreadKind::Vcpu, Probe::AffinityOfOtherTask),
        (ThreadKind::Timers, Probe::AffinityOfOtherTask),
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
