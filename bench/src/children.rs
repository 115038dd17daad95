//! `lull bench`'s child processes (lull and QEMU VMs) never outlive it.
//!
//! - Every child is started through [`guard`]: between fork and exec it asks the kernel for
//!   SIGTERM when its parent dies (`PR_SET_PDEATHSIG`; bench forks from its main thread, which
//!   lives until bench ends), gives up if bench is already gone or stopping, and unblocks
//!   SIGINT and SIGTERM (bench blocks them in its own threads, and a mask is inherited).
//! - [`forward_stop_signals`] blocks SIGINT and SIGTERM in bench's threads and waits for them
//!   on a thread of its own. On one, it sends SIGTERM to every child (lull stops its VM and
//!   writes its metrics), waits for each to exit (SIGKILL after [`GRACE`]), and ends bench
//!   with [`crate::EXIT_STOPPED`]. Children are found in /proc by their parent's pid, so a
//!   child spawned anywhere in bench is found; one forked while bench stops fails its exec.
//!
//! The system calls go through `nix`; the one `unsafe` left is [`CommandExt::pre_exec`]
//! itself, whose closure runs between fork and exec (its SAFETY comment says what it does).

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::prctl;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::{getppid, Pid};

/// How long a child may take to exit after SIGTERM before it is killed.
pub const GRACE: Duration = Duration::from_secs(20);

/// Set once bench stops: a child forked after it fails before its exec.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// SIGINT and SIGTERM, as a signal set.
fn stop_set() -> SigSet {
    [Signal::SIGINT, Signal::SIGTERM].into_iter().collect()
}

/// Makes `cmd`'s child die with bench (see the module comment).
pub fn guard(cmd: &mut Command) -> &mut Command {
    let parent = std::process::id();
    let set = stop_set();
    let setup = move || -> io::Result<()> {
        prctl::set_pdeathsig(Signal::SIGTERM)?;
        let ppid = getppid().as_raw();
        if u32::try_from(ppid).ok() != Some(parent) || STOPPING.load(Ordering::Relaxed) {
            return Err(io::Error::other("lull bench is stopping"));
        }
        set.thread_unblock()?;
        Ok(())
    };
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes three system calls (prctl, getppid,
    // pthread_sigmask, each a thin nix wrapper that allocates nothing) and an atomic load,
    // and allocates nothing on its success path.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(setup)
    }
}

/// Blocks SIGINT and SIGTERM in this thread (and the threads it starts) and stops bench's
/// children and bench on the first of them (see the module comment). Call it before bench
/// starts a thread or a child.
pub fn forward_stop_signals() -> io::Result<()> {
    let set = stop_set();
    set.thread_block()?;
    std::thread::Builder::new()
        .name("bench-signals".into())
        .spawn(move || {
            let signal = loop {
                if let Ok(signal) = set.wait() {
                    break signal;
                }
            };
            let name = if signal == Signal::SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            };
            STOPPING.store(true, Ordering::Relaxed);
            let stopped = stop_children();
            eprintln!("lull bench: {name}: stopped {stopped} child process(es); no result");
            std::process::exit(i32::from(crate::EXIT_STOPPED));
        })?;
    Ok(())
}

/// Sends SIGTERM to every live child, waits for them (SIGKILL after [`GRACE`]); returns how
/// many there were.
fn stop_children() -> usize {
    let mut stopped = std::collections::BTreeSet::new();
    let deadline = Instant::now() + GRACE;
    loop {
        let live = live_children();
        if live.is_empty() {
            return stopped.len();
        }
        let signal = if Instant::now() < deadline {
            Signal::SIGTERM
        } else {
            Signal::SIGKILL
        };
        for pid in &live {
            if stopped.insert(*pid) || signal == Signal::SIGKILL {
                // `pid` is a child of this process that has not been reaped (a zombie is not
                // listed), so it is ours; one that exited meanwhile is simply gone.
                let _ = kill(Pid::from_raw(*pid), signal);
            }
        }
        // The children need a moment to stop their VMs; a zombie is not listed again.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pids of this process's children that have not exited (zombies left out).
fn live_children() -> Vec<libc::pid_t> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parent_if_live(&stat))
                == Some(me)
        })
        .collect()
}

/// The parent pid in a /proc/PID/stat line, unless the process is a zombie.
fn parent_if_live(stat: &str) -> Option<u32> {
    // "1234 (name with spaces) S 1000 ..."
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    (state != "Z" && state != "X").then_some(ppid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_the_parent_of_live_processes() {
        assert_eq!(parent_if_live("12 (lull) S 7 12 7 0"), Some(7));
        assert_eq!(parent_if_live("12 (a) b) R 9 1"), Some(9));
        assert_eq!(parent_if_live("12 (lull) Z 7 12"), None);
        assert_eq!(parent_if_live("garbage"), None);
    }

    #[test]
    fn a_guarded_child_runs_and_is_listed_while_it_lives() {
        let mut child = guard(Command::new("sleep").arg("30")).spawn().unwrap();
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        assert!(live_children().contains(&pid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!live_children().contains(&pid));
    }
}
