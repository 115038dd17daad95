//! Pause and resume through the management API (`vm.pause`, `vm.resume`), with the
//! `pause-timers` guest: every vCPU runs TSC-deadline, one-shot and periodic LAPIC timers and
//! counts each interrupt. The VM is paused in the middle (also for longer than its longest
//! timer), and in a loop of many pauses; the guest then checks that every timer fired, none
//! early and none twice, and lull's counters show that no vCPU ran and no timer fired (lull's
//! global timers included) while the VM was paused, and that global timers fire again after.
//! What lull says guest time did over each pause is checked against the guest's lateness: if
//! it stood still no timer is as late as a pause, if it ran on (PVM hosts) the timers pending
//! over a long pause are late by it. A snapshot of the paused VM is written and the guest runs
//! on unharmed; it is restored into a new lull (`--irqchip kernel`, and `--irqchip user` with
//! each timer model, snapshotted in the phase its test names: TSC-deadline, one-shot or
//! periodic, as the snapshot's LAPICs show), where the guest finishes its timers, also after
//! the restored VM stayed paused longer than its longest timer.

use std::sync::mpsc;
use std::time::Duration;

use lull_schema::RunReport;
use lull_tests::exit_status::{API_STOP, USER_STOP};
use lull_tests::{api_call, kvm_trial, snapshot_file, temp_path, Arguments, Failed};

#[path = "pause/paused_vm.rs"]
mod paused_vm;
#[path = "pause/restore.rs"]
mod restore;

use paused_vm::{activity, max_lateness_ns, PausedVm};
use restore::{restore_kernel_irqchip, restore_user_irqchip, Phase};

/// Longer than the guest's longest timer (10 ms + 1 ms per vCPU).
const LONG_PAUSE: Duration = Duration::from_millis(300);
/// The guest's longest timer, in ns (CPU 1's: 10 ms + 1 ms).
const LONGEST_TIMER_NS: i64 = 11_000_000;

/// State errors first (as Cloud Hypervisor answers them), then pauses in the middle of the
/// guest's timers, one longer than its longest timer; the guest counts every timer.
fn pauses_keep_every_timer(extra: &[&str], name: &str) -> Result<(), Failed> {
    let vm = PausedVm::start(name, 20, extra)?;
    vm.expect("PUT", "vm.pause", 405)?;
    vm.expect("PUT", "vm.resume", 405)?;
    vm.expect("PUT", "vm.boot", 204)?;
    // Cloud Hypervisor's API description: resuming a VM that is not paused is 405.
    vm.expect("PUT", "vm.resume", 405)?;
    vm.wait_for_line("pause-timers: running")?;
    vm.pause_for(Duration::from_millis(20))?;
    vm.expect("PUT", "vm.pause", 204)?;
    vm.expect("PUT", "vm.pause", 500)?;
    vm.expect("PUT", "vm.resume", 204)?;
    vm.pause_for(LONG_PAUSE)?;
    vm.pause_for(LONG_PAUSE)?;
    let globals = |r: &RunReport| r.vcpus.iter().map(|v| v.global_timer_fires).sum::<u64>();
    let at_last_resume = globals(&vm.counters()?);
    let console = vm.guest_passes()?;
    if extra.contains(&"--global-timers") && globals(&vm.counters()?) <= at_last_resume {
        return Err("the global timers did not fire again after the resume".into());
    }
    // Four resumes: the short pause's, the one of the state errors, the two long pauses'.
    let late = max_lateness_ns(&console).ok_or("no max_late_ns line")?;
    let pause = i64::try_from(LONG_PAUSE.as_nanos()).unwrap_or(i64::MAX);
    if vm.time_stood_still(4)? {
        // Guest time did not run while paused: no timer can be as late as a pause.
        if late >= pause {
            return Err(format!("a timer was {late} ns late: guest time ran while paused").into());
        }
    } else if late < pause - LONGEST_TIMER_NS {
        // Guest time ran on (the TSC could not be moved back): the timer each vCPU had armed
        // came due during a long pause and fired only after it, late by the rest of the pause
        // at least (more where the next pause came before the guest took it).
        return Err(format!(
            "lull said guest time ran on over a {LONG_PAUSE:?} pause, yet no timer was more \
             than {late} ns late"
        )
        .into());
    }
    vm.expect("PUT", "vm.pause", 405)?;
    vm.finish()
}

/// Pause and resume `cycles` times in a row while the guest's timers run: none lost, none
/// early, none twice.
fn many_pauses_lose_nothing(cycles: u32) -> Result<(), Failed> {
    let vm = PausedVm::start("pause-loop", 400, &[])?;
    vm.expect("PUT", "vm.boot", 204)?;
    vm.wait_for_line("pause-timers: running")?;
    for i in 0..cycles {
        let (status, body) = api_call(&vm.socket, "PUT", "vm.pause", "")?;
        if status != 204 {
            return Err(
                format!("pause {i}: status {status}: {body} (the guest ended first?)").into(),
            );
        }
        vm.expect("PUT", "vm.resume", 204)?;
    }
    if vm.serial_text().contains("pause-timers: timers ") {
        return Err("the guest finished before the pauses did: make it run longer".into());
    }
    vm.guest_passes()?;
    vm.finish()
}

/// `vm.snapshot` of a paused VM mid-flight: refused while it runs, then a snapshot directory
/// with a manifest of this format, the memory file at the VM's size and one state file per
/// vCPU; the guest then runs on and still counts every timer.
fn snapshot_of_a_paused_vm() -> Result<(), Failed> {
    let vm = PausedVm::start("snapshot", 20, &[])?;
    let dir = temp_path("snapshot-dir");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let body = format!(r#"{{"destination_url": "file://{}"}}"#, dir.display());
    let snapshot = |want: u16| -> Result<(), Failed> {
        let (status, text) = api_call(&vm.socket, "PUT", "vm.snapshot", &body)?;
        if status != want {
            return Err(format!("vm.snapshot: status {status}, want {want}: {text}").into());
        }
        Ok(())
    };
    snapshot(405)?;
    vm.expect("PUT", "vm.boot", 204)?;
    vm.wait_for_line("pause-timers: running")?;
    snapshot(500)?;
    vm.expect("PUT", "vm.pause", 204)?;
    let before = activity(&vm.counters()?);
    snapshot(204)?;
    if activity(&vm.counters()?) != before {
        return Err("the vCPUs ran during the snapshot".into());
    }
    vm.expect("PUT", "vm.resume", 204)?;
    let text = std::fs::read_to_string(dir.join("manifest.json")).map_err(|e| e.to_string())?;
    let manifest: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let memory =
        std::fs::metadata(snapshot_file(&dir, "/memory_file")?).map_err(|e| e.to_string())?;
    if manifest["format_version"] != vmm::snapshot::FORMAT_VERSION
        || manifest["config"]["cpus"] != 2
        || manifest["memory_bytes"] != 256u64 << 20
        || memory.len() != 256 << 20
    {
        return Err(format!("manifest {manifest}, memory file {} bytes", memory.len()).into());
    }
    let entries = [
        &manifest["vcpus"][0],
        &manifest["vcpus"][1],
        &manifest["kvm_vm"],
        &manifest["devices"],
    ];
    for entry in entries {
        let name = entry["file"]
            .as_str()
            .ok_or("a state file without a name")?;
        let bytes = std::fs::read(dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
        if u64::try_from(bytes.len()).ok() != entry["bytes"].as_u64() {
            return Err(format!("{name} is not the manifest's size").into());
        }
    }
    vm.guest_passes()?;
    let _ = std::fs::remove_dir_all(&dir);
    vm.finish()
}

/// A VM paused at once after its boot (its APs may still wait for their SIPI) resumes and
/// pauses again, then stops while paused: by `vm.shutdown` (lull then exits 14 at
/// `vmm.shutdown`) or by SIGTERM (lull exits 12).
fn a_paused_vm_stops(by_signal: bool) -> Result<(), Failed> {
    let mut vm = PausedVm::start(
        if by_signal {
            "pause-sigterm"
        } else {
            "pause-stop"
        },
        20,
        &[],
    )?;
    vm.expect("PUT", "vm.boot", 204)?;
    vm.expect("PUT", "vm.pause", 204)?;
    vm.expect("PUT", "vm.resume", 204)?;
    vm.expect("PUT", "vm.pause", 204)?;
    let mut child = vm.child.take().ok_or("no lull")?;
    let want = if by_signal {
        let pid = child.id().to_string();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .map_err(|e| e.to_string())?;
        if !killed.success() {
            return Err("kill -TERM failed".into());
        }
        USER_STOP
    } else {
        vm.expect("PUT", "vm.shutdown", 204)?;
        let state = vm.info()?["state"].clone();
        if state != "Shutdown" {
            return Err(format!("state {state} after vm.shutdown of a paused VM").into());
        }
        vm.expect("PUT", "vmm.shutdown", 204)?;
        API_STOP
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(status)) if status.code() == Some(want) => Ok(()),
        Ok(status) => Err(format!("lull ended with {status:?}, want {want}").into()),
        Err(_) => Err("a paused lull did not stop within 30 s".into()),
    }
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        kvm_trial("pause_user_irqchip_keeps_every_timer", || {
            pauses_keep_every_timer(&["--global-timers", "4,period=5"], "pause-user")
        }),
        kvm_trial("pause_central_timer_thread_keeps_every_timer", || {
            pauses_keep_every_timer(&["--timer-model", "central"], "pause-central")
        }),
        kvm_trial("pause_kernel_irqchip_keeps_every_timer", || {
            pauses_keep_every_timer(&["--irqchip", "kernel"], "pause-kernel")
        }),
        kvm_trial(
            "snapshot_of_a_paused_vm_holds_memory_and_vcpus",
            snapshot_of_a_paused_vm,
        ),
        kvm_trial("pause_then_vm_shutdown_stops_the_paused_vm", || {
            a_paused_vm_stops(false)
        }),
        kvm_trial("pause_then_sigterm_stops_the_paused_vm", || {
            a_paused_vm_stops(true)
        }),
        kvm_trial(
            "restore_of_a_kernel_irqchip_snapshot_finishes_its_timers",
            restore_kernel_irqchip,
        ),
        kvm_trial(
            "restore_user_irqchip_pull_with_global_timers_tsc_deadlines",
            || {
                let extra = ["--timer-model", "pull", "--global-timers", "4,period=5"];
                let zero = Duration::ZERO;
                restore_user_irqchip(&extra, "restore-pull", Phase::Deadline, zero, true)
            },
        ),
        kvm_trial("restore_user_irqchip_push_one_shots", || {
            let extra = ["--timer-model", "push"];
            restore_user_irqchip(
                &extra,
                "restore-push",
                Phase::OneShot,
                Duration::ZERO,
                false,
            )
        }),
        kvm_trial(
            "restore_user_irqchip_central_periodic_held_past_the_longest_timer",
            || {
                let extra = ["--timer-model", "central"];
                restore_user_irqchip(
                    &extra,
                    "restore-central",
                    Phase::Periodic,
                    LONG_PAUSE,
                    false,
                )
            },
        ),
        kvm_trial("pause_a_thousand_times_loses_nothing", || {
            many_pauses_lose_nothing(1000)
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}
