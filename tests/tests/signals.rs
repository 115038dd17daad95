//! How signals end lull (`docs/CLI.md`, exit status 12): SIGHUP (a closed terminal) as SIGTERM
//! does, with the run's metrics written and the API socket removed; and a SIGTERM that
//! arrives before lull has put its handlers in place is not lost to the default action (death
//! by the signal, status 143, nothing written).
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

use lull_tests::exit_status::USER_STOP;
use lull_tests::{
    kit_file, kvm_trial, lull_bin, start_api_server, take_metrics, temp_path, Arguments, Failed,
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
    ];
    libtest_mimic::run(&args, trials).exit();
}
