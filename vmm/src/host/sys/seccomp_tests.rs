//! The filters at work: each case forks a child that installs one thread kind's real filter
//! (the API server's with its `clone3` answer, as `seccomp::apply_api` installs them) and
//! makes one syscall; the parent reads how the child ended. A refused syscall ends the child
//! by SIGSYS (`--seccomp on`); with `--seccomp log` the same syscall goes through.

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use seccompiler::BpfProgram;

use crate::config::knobs::SeccompMode;
use crate::host::seccomp::*;

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
    /// fork(2) (clone without CLONE_THREAD): forbidden for every thread, the API server's too.
    Fork,
    /// What the API server does: accept4 on a listening socket (made before the fork), FIONBIO,
    /// sendto/recvfrom on a connection, the connection added to and removed from an epoll set
    /// (its event manager's epoll_ctl) and an epoll wait, clone3 answered ENOSYS, unlink of a
    /// missing file, an O_RDWR open of /dev/null (how /dev/kvm and disks are opened).
    ApiServes,
    /// An O_RDWR open: forbidden for every thread but the API server (and its descendants).
    OpenReadWrite,
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

/// A directory of its own for one child's sockets. The tests run in parallel: with one
/// directory for all, a test that removed it while it was empty for a moment (its own socket
/// gone) made another's bind fail (ENOENT).
fn socket_dir() -> std::path::PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("lull-seccomp-api-{}-{n}", std::process::id());
    let dir = std::env::temp_dir().join(name);
    // Left by an earlier process that had this PID.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    dir
}

/// The file the probes open, read-only or for writing.
const STATUS: &CStr = c"/proc/self/status";
/// The program the exec probe runs.
const TRUE_BIN: &CStr = c"/bin/true";
/// A file that does not exist (the API server's unlink of a stale socket).
const MISSING: &CStr = c"/nonexistent/lull-seccomp-probe";
/// What the O_RDWR opens open (as /dev/kvm and disks are opened).
const DEV_NULL: &CStr = c"/dev/null";

/// What the child's probes use, made before the fork (the child must not allocate).
struct Prepared {
    /// The API probe's listener, with one pending connection.
    listen_fd: RawFd,
    /// An epoll instance for the API probe's wait.
    epoll_fd: RawFd,
    /// Out buffer of the affinity probes.
    cpu_set: MaybeUninit<libc::cpu_set_t>,
    /// Out buffer of the getcpu probe.
    cpu: MaybeUninit<libc::c_uint>,
}

fn run_child(kind: ThreadKind, mode: SeccompMode, probe: Probe) -> Ended {
    let program = program(kind, mode).unwrap().unwrap();
    // The API probe's sockets: a listener with one pending connection, and that client.
    let dir = socket_dir();
    let sock = dir.join(format!("{probe:?}-{kind:?}-{mode:?}.sock"));
    let _ = std::fs::remove_file(&sock);
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let client = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let _ = std::fs::remove_file(&sock);
    let epoll = vmm_sys_util::epoll::Epoll::new().unwrap();
    let mut prepared = Prepared {
        listen_fd: listener.as_raw_fd(),
        epoll_fd: epoll.as_raw_fd(),
        cpu_set: MaybeUninit::zeroed(),
        cpu: MaybeUninit::zeroed(),
    };
    // SAFETY: the child only makes raw system calls on data prepared before the fork (no
    // allocation, no locks) and leaves with _exit; the parent only waits for it.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        child(kind, &program, probe, &mut prepared);
    }
    drop(client);
    drop(listener);
    let _ = std::fs::remove_dir(&dir);
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

/// The forked child: installs `program` as a thread of `kind` does, makes `probe`'s calls and
/// exits: 0, or 100-106 where a step that must work failed (unless a filter killed it).
fn child(kind: ThreadKind, program: &BpfProgram, probe: Probe, prepared: &mut Prepared) -> ! {
    let installed = if kind == ThreadKind::Api {
        apply_api(program).is_ok()
    } else {
        seccompiler::apply_filter(program).is_ok()
    };
    if !installed {
        // SAFETY: _exit is async-signal-safe and ends the forked child.
        unsafe { libc::_exit(100) };
    }
    // SAFETY: plain system calls with valid arguments (a NUL-terminated path, a null-ended
    // argv, invalid descriptors where the call is meant to fail, out buffers of the sizes
    // passed; the other task's affinity probe passes an empty set, which the kernel would
    // refuse); the child then exits.
    unsafe {
        match probe {
            Probe::Allowed => allowed_calls(kind, prepared),
            Probe::Socket => {
                libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0);
            }
            Probe::Exec => {
                let argv = [TRUE_BIN.as_ptr(), std::ptr::null()];
                libc::execv(TRUE_BIN.as_ptr(), argv.as_ptr());
                libc::_exit(102);
            }
            Probe::OpenForWriting => {
                libc::open(STATUS.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            }
            Probe::Fork => {
                if libc::fork() == 0 {
                    libc::_exit(0);
                }
            }
            Probe::ApiServes => api_calls(prepared),
            Probe::OpenReadWrite => {
                libc::open(DEV_NULL.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            }
            Probe::TerminalIoctl => {
                libc::ioctl(0, libc::TCGETS, std::ptr::null_mut::<libc::termios>());
            }
            Probe::SignalOtherProcess => {
                libc::kill(1, 0);
            }
            Probe::AffinityOfOtherTask => {
                let size = std::mem::size_of::<libc::cpu_set_t>();
                let set: *mut libc::cpu_set_t = prepared.cpu_set.as_mut_ptr();
                libc::syscall(libc::SYS_sched_setaffinity, 1, size, set);
            }
        }
        libc::_exit(0);
    }
}

/// [`Probe::Allowed`]'s calls in the child; exits 101 or 103 if one that must work fails.
fn allowed_calls(kind: ThreadKind, prepared: &mut Prepared) {
    // SAFETY: as in `child`: a NUL-terminated path, invalid descriptors where the call is
    // meant to fail, out buffers of the sizes passed.
    unsafe {
        libc::syscall(libc::SYS_getpid);
        let fd = libc::open(STATUS.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
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
            let set: *mut libc::cpu_set_t = prepared.cpu_set.as_mut_ptr();
            if libc::syscall(libc::SYS_sched_getaffinity, 0, size, set) < 0
                || libc::syscall(libc::SYS_sched_setaffinity, 0, size, set) != 0
                || libc::syscall(libc::SYS_getcpu, prepared.cpu.as_mut_ptr(), 0, 0) != 0
                || libc::prctl(libc::PR_SET_TIMERSLACK, 1_000_000, 0, 0, 0) != 0
            {
                libc::_exit(103);
            }
        }
    }
}

/// [`Probe::ApiServes`]'s calls in the child; exits 104-106 if one fails.
fn api_calls(prepared: &Prepared) {
    // SAFETY: as in `child`: descriptors made before the fork (and the one accepted here),
    // buffers of the sizes passed, NUL-terminated paths.
    unsafe {
        let conn = libc::accept4(
            prepared.listen_fd,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        );
        let on: libc::c_int = 1;
        let mut byte = [0u8; 1];
        let mut event = libc::epoll_event { events: 0, u64: 0 };
        if conn < 0
            || libc::ioctl(conn, libc::FIONBIO, &on) != 0
            || libc::send(conn, byte.as_ptr().cast(), 1, libc::MSG_NOSIGNAL) != 1
            || libc::recv(conn, byte.as_mut_ptr().cast(), 1, 0) >= 0
            || libc::epoll_ctl(prepared.epoll_fd, libc::EPOLL_CTL_ADD, conn, &mut event) != 0
            || libc::epoll_ctl(prepared.epoll_fd, libc::EPOLL_CTL_DEL, conn, &mut event) != 0
            || libc::epoll_wait(prepared.epoll_fd, &mut event, 1, 0) != 0
        {
            libc::_exit(104);
        }
        if libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0) != -1
            || *libc::__errno_location() != libc::ENOSYS
        {
            libc::_exit(105);
        }
        libc::unlink(MISSING.as_ptr());
        let fd = libc::open(DEV_NULL.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if fd < 0 {
            libc::_exit(106);
        }
    }
}

#[test]
fn allowed_syscalls_pass_under_every_filter() {
    for kind in [
        ThreadKind::Vcpu,
        ThreadKind::Timers,
        ThreadKind::Vmm,
        ThreadKind::Api,
    ] {
        assert_eq!(
            run_child(kind, SeccompMode::On, Probe::Allowed),
            Ended::Exited(0),
            "{kind:?}"
        );
    }
}

#[test]
fn the_api_server_serves_under_its_filter() {
    assert_eq!(
        run_child(ThreadKind::Api, SeccompMode::On, Probe::ApiServes),
        Ended::Exited(0)
    );
    // The same calls kill a VMM thread: the probe does make calls that a filter can refuse.
    assert_eq!(
        run_child(ThreadKind::Vmm, SeccompMode::On, Probe::ApiServes),
        Ended::Signalled(libc::SIGSYS)
    );
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
        (ThreadKind::Vmm, Probe::OpenReadWrite),
        (ThreadKind::Vcpu, Probe::Fork),
        (ThreadKind::Api, Probe::Socket),
        (ThreadKind::Api, Probe::Exec),
        (ThreadKind::Api, Probe::Fork),
        (ThreadKind::Api, Probe::OpenForWriting),
        (ThreadKind::Api, Probe::SignalOtherProcess),
        (ThreadKind::Api, Probe::AffinityOfOtherTask),
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
