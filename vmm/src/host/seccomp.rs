//! Seccomp filters for lull's threads: each thread that runs guest-driven code (vCPU threads,
//! the `central` timer thread, the VMM thread's event loop) installs an allow-list right before
//! its loop, so a guest that took over a thread through a bug in lull can do little more than
//! lull itself does there.
//!
//! ```text
//!   vm::run: prepare(mode) ── builds the three BPF programs once, before any thread starts
//!   vCPU thread:   apply(ThreadKind::Vcpu)   then its first KVM_RUN
//!   timer thread:  apply(ThreadKind::Timers) then its first wait on the timerfd
//!   VMM thread:    apply(ThreadKind::Vmm)    then its event loop (and lull's exit path)
//!   API server (`--api-socket`, lull's main thread):
//!                  apply_api(program(ThreadKind::Api, mode)) once its socket, epoll set and
//!                  signal handlers exist, then its loop; the `vm` thread it starts at
//!                  `vm.boot`, and every thread that one starts, inherit it
//! ```
//!
//! What every thread may do: read/write/close on descriptors it already has (virtio-net taps
//! included: attached before any filter, then only read and written), futexes, memory
//! management without `PROT_EXEC`, signals to threads of this process only (`tgkill` with
//! lull's own pid), its own exit, clocks and sleeps, `getrandom`, and open files read-only
//! (`O_RDONLY|O_CLOEXEC`: its `/proc/thread-self` statistics at exit), positioned reads and
//! writes and `fdatasync` (disk images, opened before any filter), and program timerfds and
//! POSIX timers (host ticks; the `central` model's alarm is armed by whichever thread arms a
//! guest timer). Beyond that:
//! - **vCPU**: `ioctl` with KVM's ioctl type (0xAE) only; `getcpu`, and its own CPU affinity
//!   (`sched_{get,set}affinity` of pid 0: wake placement);
//! - **timers**: nothing more;
//! - **VMM**: epoll (taps too), directory reads (`/proc/self/task` at exit),
//!   creating the `--metrics` file (`files::OUTPUT_REPLACE`: `O_NOFOLLOW`, `O_NONBLOCK`;
//!   `O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC` too), the terminal's
//!   `TCGETS`/`TCSETS` (restoring it at exit), and `KVM_IRQ_LINE` (a disk's refill timerfd
//!   fired there, or frames a tap delivered there, raise the device's line in KVM's IOAPIC).
//!
//! - **API server**: everything the three above allow, since the `vm` thread and the vCPU and
//!   timer threads are its descendants and a filter binds every descendant (filters stack:
//!   the strictest answer wins); and what building a VM takes on the `vm` thread before its
//!   own filter: opening `/dev/kvm`, disk images and taps read-write, the serial file for
//!   appending (`files::OUTPUT_APPEND`), a snapshot's memory file read-only to map it
//!   (`files::INPUT`), any KVM ioctl, `TUNSETIFF` (and `SIOCGIFINDEX` on a Unix datagram socket,
//!   which glibc's `if_nametoindex` opens to name a missing tap), eventfds, timerfds, epoll
//!   sets, signal handlers, starting threads (`clone` with `CLONE_THREAD` only; `clone3`,
//!   whose flags a filter cannot see, fails with `ENOSYS` so glibc falls back to `clone`),
//!   naming them, their timer slack, `no_new_privs` and seccomp filters of their own; with
//!   `--serial pty`, a pseudo-terminal (`pty::OPEN_FLAGS` opens of `/dev/ptmx` and
//!   `/dev/pts/N`, `TIOCSPTLCK`, `TIOCGPTN`, `TCGETS`/`TCSETS` on its other side).
//!   A tap given as an fd is checked with `TUNGETIFF` (with `IFF_VNET_HDR`, its header size
//!   read with `TUNGETVNETHDRSZ` and its offloads turned off with `TUNSETOFFLOAD`).
//!   Serving itself runs an `event-manager` loop as the VMM thread does (its epoll set made
//!   before the filter; then `epoll_ctl` and `epoll_wait`, in the VMM's list) and adds
//!   `accept4` on the listener, `sendto`/`recvfrom`/`recvmsg` (fds with a request) and
//!   `shutdown` (an idle connection closed for room) on the connections, `FIONBIO`, and
//!   `unlink` (the socket's file, at exit). `vm.restore` reads a snapshot
//!   (`files::INPUT`) and `vm.snapshot` writes one: new files (`files::CREATE_NEW`), the
//!   manifest `rename`d into place, the old snapshot's files `unlink`ed.
//!
//! No thread may `execve`, `fork`, open sockets (but the API server's datagram one above), `ptrace`, signal other processes,
//! `mmap` executable memory or open a file for writing (the VMM thread: only by creating one).
//!
//! `--seccomp on` (the default) kills the whole process (`SECCOMP_RET_KILL_PROCESS`, status
//! 128 + SIGSYS = 159 in a shell) at the first syscall outside the list: a thread that makes
//! one is not doing what lull does, so it is treated as taken over, and returning an error to
//! it could let it probe. `--seccomp log` allows the syscall and has the kernel log it
//! (`SECCOMP_RET_LOG`, visible with `dmesg` or the audit log) to find what a new code path
//! needs; `--seccomp off` installs nothing.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::config::knobs::SeccompMode;

/// Which of lull's threads a filter is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// A vCPU thread (either irqchip mode).
    Vcpu,
    /// The `central` timer model's thread.
    Timers,
    /// The VMM thread: event loop, then lull's exit path.
    Vmm,
    /// The API server (lull's main thread with `--api-socket`) and the threads it starts.
    Api,
}

/// Why a filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The filter does not compile (a lull bug).
    #[error("Cannot build the seccomp filter: {0}; run with --seccomp off and report it")]
    Build(#[from] seccompiler::BackendError),
    /// The kernel refused the filter.
    #[error(
        "Cannot install the seccomp filter: {0}; the kernel may lack seccomp (use --seccomp off)"
    )]
    Install(#[from] seccompiler::Error),
}

/// The programs [`prepare`] built for this process.
struct Prepared {
    mode: SeccompMode,
    vcpu: BpfProgram,
    timers: BpfProgram,
    vmm: BpfProgram,
}

static PREPARED: OnceLock<Prepared> = OnceLock::new();

const KVMIO: u64 = 0xAE;
const TCGETS: u64 = 0x5401;
const TCSETS: u64 = 0x5402;
/// `FIONBIO`: a new connection made non-blocking.
const FIONBIO: u64 = 0x5421;
/// `TUNSETIFF` (`_IOW('T', 202, int)`): a virtio-net device's tap attached.
const TUNSETIFF: u64 = 0x4004_54ca;
/// `TUNGETIFF` (`_IOR('T', 210, int)`): a tap fd received or inherited is checked.
const TUNGETIFF: u64 = 0x8004_54d2;
/// `SIOCGIFINDEX`: glibc's `if_nametoindex` (is a tap that cannot be attached there at all?).
const SIOCGIFINDEX: u64 = 0x8933;
/// `KVM_IRQ_LINE` (`_IOW(KVMIO, 0x61, struct kvm_irq_level)`): a disk's refill timer fired on
/// the VMM thread (`--device-timers timerfd` with `--irqchip kernel`) raises the disk's line,
/// and a net's frames delivered there (its tap readable) raise the net's.
const KVM_IRQ_LINE: u64 = 0x4008_ae61;

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SeccompError> {
    Ok(SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        op,
        value,
    )?)
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    Ok(SeccompRule::new(conditions)?)
}

fn flag(value: libc::c_int) -> u64 {
    u64::from(value.unsigned_abs())
}

/// Calls every thread may make with any arguments.
const ANY: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getrandom,
    libc::SYS_statx,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_lseek,
    libc::SYS_pread64,
    // Disk images (opened before the filters): virtio-blk requests on the vCPU threads,
    // their sync at stop on the VMM thread.
    libc::SYS_pwrite64,
    libc::SYS_fdatasync,
    libc::SYS_fcntl,
    // Timerfds: the central model's (armed by the vCPU that arms a timer, the timer thread
    // and the VMM thread at stop) and each vCPU's wake-up (re-armed by other vCPUs).
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    // POSIX timers: each vCPU's host tick, and the timer thread's alarm, which the VMM
    // thread also arms to stop it.
    libc::SYS_timer_create,
    libc::SYS_timer_settime,
    libc::SYS_timer_gettime,
    libc::SYS_timer_delete,
];

/// The allow-list of `kind`: syscall number to the rules of which one must match (an empty
/// list allows every call).
fn rules(kind: ThreadKind) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &sys in ANY {
        map.insert(sys, Vec::new());
    }
    // Memory is never made executable.
    let prot_exec = flag(libc::PROT_EXEC);
    for sys in [libc::SYS_mmap, libc::SYS_mprotect] {
        let no_exec = cond(2, SeccompCmpOp::MaskedEq(prot_exec), 0)?;
        map.insert(sys, vec![rule(vec![no_exec])?]);
    }
    // Signals only to threads of this process (kicks).
    let pid = u64::from(std::process::id());
    map.insert(
        libc::SYS_tgkill,
        vec![rule(vec![cond(0, SeccompCmpOp::Eq, pid)?])?],
    );
    // Files: read-only opens everywhere (thread statistics in /proc).
    let mut opens = vec![rule(vec![cond(
        2,
        SeccompCmpOp::Eq,
        flag(libc::O_RDONLY | libc::O_CLOEXEC),
    )?])?];
    let (vcpu, vmm, api) = match kind {
        ThreadKind::Vcpu => (true, false, false),
        ThreadKind::Timers => (false, false, false),
        ThreadKind::Vmm => (false, true, false),
        ThreadKind::Api => (true, true, true),
    };
    let mut ioctls = Vec::new();
    if vcpu {
        vcpu_rules(&mut map, &mut ioctls)?;
    }
    if vmm {
        vmm_rules(&mut map, &mut opens, &mut ioctls)?;
    }
    if api {
        api_rules(&mut map, &mut opens, &mut ioctls)?;
    }
    if !ioctls.is_empty() {
        let rules = ioctls
            .into_iter()
            .map(|c| rule(vec![c]))
            .collect::<Result<Vec<_>, _>>()?;
        map.insert(libc::SYS_ioctl, rules);
    }
    map.insert(libc::SYS_openat, opens);
    Ok(map)
}

/// What a vCPU thread adds: KVM's vCPU ioctls, its blocking wait, wake placement, its timer
/// slack.
fn vcpu_rules(
    map: &mut BTreeMap<i64, Vec<SeccompRule>>,
    ioctls: &mut Vec<SeccompCondition>,
) -> Result<(), SeccompError> {
    ioctls.push(cond(1, SeccompCmpOp::MaskedEq(0xFF00), KVMIO << 8)?);
    // A blocked vCPU waits on its kick eventfd and wake-up timerfd.
    map.insert(libc::SYS_ppoll, Vec::new());
    // Wake placement: the thread's own host CPU (getcpu, when glibc has no rseq area
    // or vDSO to answer from) and its own CPU affinity (pid 0: itself, no other).
    map.insert(libc::SYS_getcpu, Vec::new());
    for sys in [libc::SYS_sched_getaffinity, libc::SYS_sched_setaffinity] {
        map.insert(sys, vec![rule(vec![cond(0, SeccompCmpOp::Eq, 0)?])?]);
    }
    // `--timer-slack`: the thread sets its own timer slack when the irqchip attaches.
    let timer_slack = flag(libc::PR_SET_TIMERSLACK);
    map.insert(
        libc::SYS_prctl,
        vec![rule(vec![cond(0, SeccompCmpOp::Eq, timer_slack)?])?],
    );
    Ok(())
}

/// What the VMM thread adds: its epoll loop, the terminal and IRQ-line ioctls, the opens
/// of its directories and output files.
fn vmm_rules(
    map: &mut BTreeMap<i64, Vec<SeccompRule>>,
    opens: &mut Vec<SeccompRule>,
    ioctls: &mut Vec<SeccompCondition>,
) -> Result<(), SeccompError> {
    for sys in [
        libc::SYS_epoll_wait,
        libc::SYS_epoll_pwait,
        libc::SYS_epoll_ctl,
        libc::SYS_getdents64,
    ] {
        map.insert(sys, Vec::new());
    }
    ioctls.extend(
        [TCGETS, TCSETS, KVM_IRQ_LINE]
            .into_iter()
            .map(|request| cond(1, SeccompCmpOp::Eq, request))
            .collect::<Result<Vec<_>, _>>()?,
    );
    for flags in [
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_DIRECTORY,
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
        super::files::OUTPUT_REPLACE,
    ] {
        opens.push(rule(vec![cond(2, SeccompCmpOp::Eq, flag(flags))?])?);
    }
    Ok(())
}

/// What the API server adds to the union of the other threads' lists (see the top of file).
fn api_rules(
    map: &mut BTreeMap<i64, Vec<SeccompRule>>,
    opens: &mut Vec<SeccompRule>,
    ioctls: &mut Vec<SeccompCondition>,
) -> Result<(), SeccompError> {
    for sys in [
        // Serving.
        libc::SYS_accept4,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        // Closing an idle connection for room: its reading shut down first.
        libc::SYS_shutdown,
        // Requests with fds (SCM_RIGHTS: vm.add-net's tap).
        libc::SYS_recvmsg,
        libc::SYS_unlink,
        // vm.snapshot: the new manifest renamed over the old one.
        libc::SYS_rename,
        // Building a VM and starting its threads; its disk images are locked for its life.
        libc::SYS_flock,
        libc::SYS_epoll_create1,
        libc::SYS_eventfd2,
        libc::SYS_timerfd_create,
        libc::SYS_rt_sigaction,
        libc::SYS_set_robust_list,
        libc::SYS_rseq,
        libc::SYS_clone3,
    ] {
        map.insert(sys, Vec::new());
    }
    // Any thread's affinity may be read (glibc reads a new thread's own, by its tid).
    map.insert(libc::SYS_sched_getaffinity, Vec::new());
    let thread = flag(libc::CLONE_THREAD);
    map.insert(
        libc::SYS_clone,
        vec![rule(vec![cond(
            0,
            SeccompCmpOp::MaskedEq(thread),
            thread,
        )?])?],
    );
    let prctls = [
        libc::PR_SET_NAME,
        libc::PR_SET_TIMERSLACK,
        libc::PR_SET_NO_NEW_PRIVS,
    ]
    .into_iter()
    .map(|option| rule(vec![cond(0, SeccompCmpOp::Eq, flag(option))?]))
    .collect::<Result<Vec<_>, _>>()?;
    map.insert(libc::SYS_prctl, prctls);
    let filter_mode = u64::from(libc::SECCOMP_SET_MODE_FILTER);
    map.insert(
        libc::SYS_seccomp,
        vec![rule(vec![cond(0, SeccompCmpOp::Eq, filter_mode)?])?],
    );
    let datagram = flag(libc::SOCK_DGRAM | libc::SOCK_CLOEXEC);
    map.insert(
        libc::SYS_socket,
        vec![rule(vec![
            cond(0, SeccompCmpOp::Eq, flag(libc::AF_UNIX))?,
            cond(1, SeccompCmpOp::Eq, datagram)?,
        ])?],
    );
    // `--serial pty`: the pseudo-terminal opened on the `vm` thread (`super::pty`).
    for request in [
        FIONBIO,
        TUNSETIFF,
        TUNGETIFF,
        SIOCGIFINDEX,
        super::pty::TIOCSPTLCK,
        super::pty::TIOCGPTN,
        // A tap fd given with IFF_VNET_HDR: its header size, its offloads turned off.
        super::sys::tap::TUNGETVNETHDRSZ,
        super::sys::tap::TUNSETOFFLOAD,
    ] {
        ioctls.push(cond(1, SeccompCmpOp::Eq, request)?);
    }
    for flags in [
        libc::O_RDWR | libc::O_CLOEXEC,
        libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        super::files::OUTPUT_APPEND,
        super::files::CREATE_NEW,
        super::files::INPUT,
        super::pty::OPEN_FLAGS,
    ] {
        opens.push(rule(vec![cond(2, SeccompCmpOp::Eq, flag(flags))?])?);
    }
    Ok(())
}

/// Builds the BPF program for `kind` in `mode` (`None` for [`SeccompMode::Off`]).
pub fn program(kind: ThreadKind, mode: SeccompMode) -> Result<Option<BpfProgram>, SeccompError> {
    let mismatch = match mode {
        SeccompMode::Off => return Ok(None),
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::On => SeccompAction::KillProcess,
    };
    let filter = SeccompFilter::new(
        rules(kind)?,
        mismatch,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )?;
    Ok(Some(filter.try_into()?))
}

/// Builds every thread's program for `mode`; call once, before any lull thread starts. A
/// second call (a second VM in one process) keeps the first mode.
pub fn prepare(mode: SeccompMode) -> Result<(), SeccompError> {
    if mode == SeccompMode::Off || PREPARED.get().is_some() {
        return Ok(());
    }
    let build =
        |kind| -> Result<BpfProgram, SeccompError> { Ok(program(kind, mode)?.unwrap_or_default()) };
    let prepared = Prepared {
        mode,
        vcpu: build(ThreadKind::Vcpu)?,
        timers: build(ThreadKind::Timers)?,
        vmm: build(ThreadKind::Vmm)?,
    };
    let _ = PREPARED.set(prepared);
    Ok(())
}

/// Installs the prepared filter of `kind` on the calling thread (nothing if [`prepare`] was
/// not called or the mode is off). It stays for the thread's life and cannot be removed.
pub fn apply(kind: ThreadKind) -> Result<(), SeccompError> {
    let Some(prepared) = PREPARED.get() else {
        return Ok(());
    };
    let program = match kind {
        ThreadKind::Vcpu => &prepared.vcpu,
        ThreadKind::Timers => &prepared.timers,
        ThreadKind::Vmm => &prepared.vmm,
        // The API server's filter is not one of a VM's: see `apply_api`.
        ThreadKind::Api => return Ok(()),
    };
    tracing::debug!(
        ?kind,
        mode = prepared.mode.name(),
        "installing seccomp filter"
    );
    seccompiler::apply_filter(program)?;
    Ok(())
}

/// Answers `clone3` with `ENOSYS` (and allows everything else): glibc then starts threads
/// with `clone`, whose flags a filter can check. Installed with the API server's filter,
/// which allows `clone3` so that this answer, not a kill, is the one that counts.
fn clone3_enosys() -> Result<BpfProgram, SeccompError> {
    let enosys = SeccompAction::Errno(libc::ENOSYS.unsigned_abs());
    let rules = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, enosys, TargetArch::x86_64)?;
    Ok(filter.try_into()?)
}

/// Installs the API server's filter `program` (built by [`program`] for [`ThreadKind::Api`])
/// on the calling thread, with the `clone3` answer it relies on. Every thread it starts from
/// then on inherits both.
pub fn apply_api(program: &BpfProgram) -> Result<(), SeccompError> {
    tracing::debug!("installing the API server's seccomp filter");
    seccompiler::apply_filter(&clone3_enosys()?)?;
    seccompiler::apply_filter(program)?;
    Ok(())
}
