//! The kit's Linux across a snapshot (issue 31): it boots with its in-kernel `timers` workload
//! (`resources/linux/lull_workload.c`: one kthread per CPU sleeping on a pinned hrtimer),
//! is paused mid-workload, snapshotted, its lull ended, and restored into a new lull with
//! `lull run --restore DIR --resume`; the workload must end with its own PASS, every CPU with
//! exactly the number of timer events its intervals give, in every irqchip mode that restore
//! supports.
//!
//! The workload's intervals are all [`INTERVAL_MS`] long, over [`SECONDS`]: each CPU's thread
//! arms a timer at the start and one more (cut at the end) when the first fires, so every CPU
//! counts exactly 2 events, and a timer is pending on every CPU through the whole workload,
//! the snapshot included. A timer lost across the restore leaves its thread asleep (the
//! workload fails: "a timer thread did not finish"); one fired twice or early does not run the
//! callback again (Linux's hrtimer runs a callback only once the guest clock has passed its
//! expiry), so "none early" is the guest kernel's own check, and the count is the test's.
//! Where KVM cannot move the guest TSC (PVM hosts), guest time runs on through the pause and
//! the restore; the intervals are longer than that gap, so the workload's lateness bound
//! (1 s) still holds.
//!
//! The restored workload reads lull's restore count (port 0xf8, 1 after this restore) when
//! its first timer fires (more than a second after its thread last looked) and starts its
//! window again: "restored count=1" on the console, counters cleared, the event that saw the
//! restore dropped, [`SECONDS`] more of the same intervals, so again [`EVENTS_PER_CPU`] per
//! CPU. A timer lost across the restore still leaves its thread asleep past the new window's
//! end (the workload fails), and a restore count lull never reports fails the test.

use std::time::Duration;

use libtest_mimic::{Completion, Trial};
use lull_tests::exit_status::{API_STOP, GUEST_PASS};
use lull_tests::{
    kit_file, kvm_unavailable, linux_cmdline, run_restored, start_api_server, temp_path,
    wait_for_console, ApiLull, Arguments, Failed,
};

/// The workload's length (guest seconds).
const SECONDS: u32 = 16;
/// Every timer interval of the workload.
const INTERVAL_MS: u32 = 8000;
/// Timer events per CPU: one per interval, the last cut at the workload's end.
const EVENTS_PER_CPU: u32 = SECONDS * 1000 / INTERVAL_MS;
/// vCPUs of the VM.
const CPUS: u32 = 2;
/// Longest wait for the kit's Linux to boot or finish (it is emulated on PVM hosts).
const LINUX_DEADLINE: Duration = Duration::from_secs(600);
/// Wall time from the workload's start line to the pause: its threads arm their first timers
/// at once (guest time runs with wall time until the pause), and those are due
/// [`INTERVAL_MS`] later; the test checks afterwards that the pause fell inside the workload.
const INTO_THE_WORKLOAD: Duration = Duration::from_secs(2);

/// The irqchip modes (restore supports both).
const MODES: [&str; 2] = ["kernel", "user"];

/// The `events=` of the workload's `timers cpu=CPU events=...` line.
fn events_of(console: &str, cpu: &str) -> Option<u32> {
    let prefix = format!("lull-workload: timers cpu={cpu} events=");
    let line = console.lines().find_map(|l| l.split_once(&prefix))?.1;
    line.split_whitespace().next()?.parse().ok()
}

/// Boot, pause mid-workload, snapshot, end the lull, restore with `--resume`: PASS.
fn linux_timers_survive_a_snapshot(mode: &str) -> Result<(), Failed> {
    let name = format!("snapshot-linux-{mode}");
    let kernel = kit_file("linux/vmlinux")?.display().to_string();
    let cmdline = linux_cmdline(&format!(
        "lull.workload=timers,seconds={SECONDS},cpus={CPUS},mix=1:{INTERVAL_MS}"
    ))?;
    let serial = temp_path(&format!("{name}.serial"));
    let _ = std::fs::remove_file(&serial);
    let serial_flag = format!("file={}", serial.display());
    let cpus = CPUS.to_string();
    let args = [
        "--kernel",
        &kernel,
        "--cmdline",
        &cmdline,
        "--cpus",
        &cpus,
        "--memory",
        "64M",
        "--irqchip",
        mode,
        "--serial",
        &serial_flag,
    ];
    let first = ApiLull::from(start_api_server(&name, &args)?);
    first.put("vm.boot", "")?;
    wait_for_console(
        &serial,
        "lull-workload: start kind=timers",
        &["lull-workload: FAIL"],
        LINUX_DEADLINE,
    )?;
    std::thread::sleep(INTO_THE_WORKLOAD);
    first.put("vm.pause", "")?;
    let before = std::fs::read_to_string(&serial).map_err(|e| e.to_string())?;
    if before.contains("lull-workload: timers cpu=") {
        return Err(format!("the workload ended before the pause:\n{before}").into());
    }
    let dir = first.snapshot_into(&format!("{name}.snapshot"))?;
    first.shutdown(API_STOP)?;

    let run = run_restored(&dir, &serial, LINUX_DEADLINE)?;
    let console = std::fs::read_to_string(&serial).map_err(|e| e.to_string())?;
    let fail = |why: &str| -> Failed {
        format!("{why}; lull's stderr:\n{}\nconsole:\n{console}", run.stderr).into()
    };
    if !console.contains("lull-workload: PASS") {
        return Err(fail("the restored workload did not pass"));
    }
    if !console.contains("lull-workload: restored count=1: the window starts again") {
        return Err(fail(
            "the workload did not see the restore count change to 1",
        ));
    }
    let code = run.code()?;
    if code != GUEST_PASS {
        return Err(fail(&format!("lull exited with {code}, want {GUEST_PASS}")));
    }
    for cpu in 0..CPUS {
        let events = events_of(&console, &cpu.to_string());
        if events != Some(EVENTS_PER_CPU) {
            return Err(fail(&format!(
                "cpu {cpu}: {events:?} timer events, want {EVENTS_PER_CPU}"
            )));
        }
    }
    if events_of(&console, "all") != Some(EVENTS_PER_CPU * CPUS) {
        return Err(fail("the total of timer events is not the CPUs' sum"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&serial);
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = MODES
        .iter()
        .map(|mode| {
            let name = format!("linux_timers_workload_passes_across_a_snapshot_irqchip_{mode}");
            Trial::ignorable_test(name, move || match kvm_unavailable() {
                Some(reason) => Ok(Completion::ignored_with(reason)),
                None => linux_timers_survive_a_snapshot(mode).map(|()| Completion::Completed),
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
