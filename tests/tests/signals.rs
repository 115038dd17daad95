//! How signals end lull (`docs/CLI.md`, exit status 12): SIGHUP (a closed terminal) as SIGTERM
//! does, with the run's metrics written and the API socket removed; and a SIGTERM that
//! arrives before lull has put its handlers in place is not lost to the default action (death
//! by the signal, status 143, nothing written).
//!
//! And a lull stopped by SIGSTOP for longer than 2^32 TSC ticks (1.65 s at 2.6 GHz): `idle-sim` reports
//! the lateness of the timer that came due meanwhile exactly (its max used to be clamped at
//! 2^32 ticks though its header said max is exact).
//!
//! The early signal is made certain, not raced: lull starts traced (`PTRACE_TRACEME` before
//! `execve`), runs system call by system call until its first `rt_sigaction` for SIGINT,
//! SIGTERM or SIGHUP (the first handler being put in place), and gets its SIGTERM there,
//! before that call returns, after which the tracer lets it go.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lull_tests::exit_status::{GUEST_PASS, USER_STOP};
use lull_tests::{
    kit_file, kvm_trial, lull_bin, start_api_server, take_metrics, temp_path, wait_for_console,
    Arguments, Failed,
};
use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

/// How long lull may take to end after its signal.
const DEADLINE: Duration = Duration::from_secs(120);

/// Waits up to [`DEADLINE`] for `child`: its exit code, or a failure (killed if it is late,
/// or if it died by a signal) carrying its stderr.
fn wait_for(mut child: Child, what: &str) -> Result<i32, Failed> {
    let mut stderr = child.stderr.take();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match rx.recv_timeout(DEADLINE) {
        Ok(status) => status.map_err(|e| format!("waiting for lull: {e}"))?,
        Err(_) => {
            let _ = kill(
                Pid::from_raw(pid.try_into().unwrap_or(i32::MAX)),
                Signal::SIGKILL,
            );
            return Err(format!("lull did not end within {DEADLINE:?} of {what}").into());
        }
    };
    let mut log = String::new();
    if let Some(stderr) = stderr.as_mut() {
        let _ = stderr.read_to_string(&mut log);
    }
    status
        .code()
        .ok_or_else(|| format!("lull died by {what}: {status}\n--- stderr:\n{log}").into())
}

/// SIGHUP to a lull serving a booted VM: it stops the VM and ends lull as SIGTERM does.
fn sighup_ends_lull_as_sigterm_does() -> Result<(), Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?;
    let metrics = temp_path("signals-hup.json");
    let _ = std::fs::remove_file(&metrics);
    let metrics_arg = metrics.display().to_string();
    let server = start_api_server(
        "signals-hup",
        &[
            "--kernel",
            kernel.to_str().ok_or("kit path is not UTF-8")?,
            "--cmdline",
            "duration_ms=600000",
            "--serial",
            "off",
            "--metrics",
            &metrics_arg,
        ],
    )?;
    let socket = server.socket.clone();
    let mut child = server.child;
    let booted = lull_tests::api_put(&socket, "vm.boot", "");
    if let Err(e) = booted {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    let pid = Pid::from_raw(child.id().try_into().map_err(|_| "pid out of range")?);
    kill(pid, Signal::SIGHUP).map_err(|e| format!("cannot send SIGHUP: {e}"))?;
    let code = wait_for(child, "SIGHUP")?;
    let report = take_metrics(&metrics)?;
    if code != USER_STOP || report.stop_reason != "stopped by SIGHUP" {
        return Err(format!(
            "after SIGHUP: exit {code} (want {USER_STOP}), stop reason {:?}",
            report.stop_reason
        )
        .into());
    }
    if socket.symlink_metadata().is_ok() {
        let _ = std::fs::remove_file(&socket);
        return Err(format!("{} is left behind after SIGHUP", socket.display()).into());
    }
    Ok(())
}

/// Runs the traced `child` up to the entry of its first `rt_sigaction` for a stop signal,
/// sends it SIGTERM there, and lets it go.
fn sigterm_before_the_first_handler(pid: Pid) -> Result<(), Failed> {
    let stop_signals = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP].map(|s| s as u64);
    let mut pass_on = None;
    match waitpid(pid, None).map_err(|e| format!("waitpid: {e}"))? {
        WaitStatus::Stopped(_, Signal::SIGTRAP) => {} // at its execve
        other => return Err(format!("lull did not stop at its execve: {other:?}").into()),
    }
    loop {
        ptrace::syscall(pid, pass_on.take()).map_err(|e| format!("PTRACE_SYSCALL: {e}"))?;
        match waitpid(pid, None).map_err(|e| format!("waitpid: {e}"))? {
            WaitStatus::Stopped(_, Signal::SIGTRAP) => {}
            WaitStatus::Stopped(_, sig) => {
                pass_on = Some(sig);
                continue;
            }
            other => return Err(format!("lull ended while traced: {other:?}").into()),
        }
        let regs = ptrace::getregs(pid).map_err(|e| format!("PTRACE_GETREGS: {e}"))?;
        if regs.orig_rax == libc::SYS_rt_sigaction as u64 && stop_signals.contains(&regs.rdi) {
            kill(pid, Signal::SIGTERM).map_err(|e| format!("cannot send SIGTERM: {e}"))?;
            return ptrace::detach(pid, None).map_err(|e| format!("PTRACE_DETACH: {e}").into());
        }
    }
}

/// A SIGTERM that reaches lull before its first stop-signal handler is in place still ends
/// the run as a stop by the user: status 12, metrics written.
fn an_early_sigterm_is_not_lost() -> Result<(), Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?;
    let metrics = temp_path("signals-early.json");
    let _ = std::fs::remove_file(&metrics);
    let mut command = Command::new(lull_bin());
    command
        .args(["run", "--kernel"])
        .arg(&kernel)
        .args([
            "--cmdline",
            "duration_ms=600000",
            "--serial",
            "off",
            "--metrics",
        ])
        .arg(&metrics)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the hook makes one system call (ptrace(PTRACE_TRACEME)), which is
    // async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(|| ptrace::traceme().map_err(std::io::Error::from));
    }
    let child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", lull_bin().display()))?;
    let pid = Pid::from_raw(child.id().try_into().map_err(|_| "pid out of range")?);
    if let Err(e) = sigterm_before_the_first_handler(pid) {
        let _ = kill(pid, Signal::SIGKILL);
        return Err(e);
    }
    let code = wait_for(child, "a SIGTERM before its handlers")?;
    let report = take_metrics(&metrics)?;
    if code != USER_STOP || report.stop_reason != "stopped by SIGTERM" {
        return Err(format!(
            "early SIGTERM: exit {code} (want {USER_STOP}), stop reason {:?}",
            report.stop_reason
        )
        .into());
    }
    Ok(())
}

/// How long lull is held stopped: more than 2^32 TSC ticks at any TSC rate above 1.44 GHz.
const HELD: Duration = Duration::from_secs(3);

/// vCPU 0's thread blocked this many more times after idle-sim's first line: its timers run
/// (it halts on each), so a stop from now on holds one of them. The timers are 50 ms apart:
/// with 1 ms ones the guest was between a timer's fire and its next arm for a third of the
/// time (its handler and bookkeeping are emulated here), and a stop that fell there held no
/// timer, one run in three to five.
const TIMERS_RUNNING: u64 = 2;

/// The voluntary context switches of the thread of `pid` named `name`.
fn thread_blocks(pid: u32, name: &str) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            let line = status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?;
            return line.trim().parse().ok();
        }
    }
    None
}

/// Waits until `pid`'s `vcpu0` thread has blocked `more` more times than now (up to
/// [`DEADLINE`]).
fn wait_for_halts(pid: u32, more: u64) -> Result<(), Failed> {
    let first = thread_blocks(pid, "vcpu0").ok_or("lull has no vcpu0 thread")?;
    let end = std::time::Instant::now() + DEADLINE;
    while thread_blocks(pid, "vcpu0").unwrap_or(0) < first + more {
        if std::time::Instant::now() > end {
            return Err(format!("vcpu0 did not block {more} times within {DEADLINE:?}").into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// The `max` of idle-sim's `idle-sim: lateness_ns ... max D ...` line, in ns.
fn lateness_max_ns(console: &str) -> Option<u64> {
    let line = console
        .lines()
        .find(|l| l.starts_with("idle-sim: lateness_ns"))?;
    let mut words = line.split_whitespace();
    words.find(|w| *w == "max")?;
    words.next()?.parse().ok()
}

/// idle-sim under a lull held stopped (SIGSTOP) for [`HELD`] while its 50 ms timers run: the
/// timer due meanwhile fires about [`HELD`] late, and the reported max says so.
fn a_lateness_over_2_pow_32_ticks_is_reported_exactly() -> Result<(), Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?;
    let console = temp_path("signals-held.console");
    let _ = std::fs::remove_file(&console);
    let child = Command::new(lull_bin())
        .args(["run", "--kernel"])
        .arg(&kernel)
        .args([
            "--cmdline",
            "duration_ms=5000 mix=100:50 ipi_pct=0",
            "--cpus",
            "1",
        ])
        .arg("--serial")
        .arg(format!("file={}", console.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", lull_bin().display()))?;
    let pid = Pid::from_raw(child.id().try_into().map_err(|_| "pid out of range")?);
    // idle-sim's first line comes just before its timers start: its end, printed character
    // by character through the serial port, marks the start.
    let started = wait_for_console(&console, "eoi register", &[], DEADLINE)
        .and_then(|_| wait_for_halts(child.id(), TIMERS_RUNNING));
    if let Err(e) = started {
        let _ = kill(pid, Signal::SIGKILL);
        return Err(e);
    }
    kill(pid, Signal::SIGSTOP).map_err(|e| format!("cannot send SIGSTOP: {e}"))?;
    // The stimulus itself (how long the host withholds the vCPU), not a wait for an event.
    std::thread::sleep(HELD);
    kill(pid, Signal::SIGCONT).map_err(|e| format!("cannot send SIGCONT: {e}"))?;
    let code = wait_for(child, "the run")?;
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_file(&console);
    let max = lateness_max_ns(&text).ok_or_else(|| format!("no lateness line:\n{text}"))?;
    let least = u64::try_from(HELD.as_nanos() * 8 / 10).unwrap_or(u64::MAX);
    if code != GUEST_PASS || max < least {
        return Err(format!(
            "held stopped {HELD:?}: exit {code} (want {GUEST_PASS}), lateness max {max} ns \
             (want at least {least}):\n{text}"
        )
        .into());
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        kvm_trial(
            "signals_sighup_ends_lull_as_sigterm_does",
            sighup_ends_lull_as_sigterm_does,
        ),
        kvm_trial(
            "signals_a_sigterm_before_the_handlers_is_not_lost",
            an_early_sigterm_is_not_lost,
        ),
        kvm_trial(
            "signals_idle_sim_reports_a_lateness_over_2_pow_32_ticks_exactly",
            a_lateness_over_2_pow_32_ticks_is_reported_exactly,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
