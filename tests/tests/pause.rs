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

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lull_schema::RunReport;
use lull_tests::exit_status::{API_STOP, BAD_INPUT, GUEST_PASS, USER_STOP};
use lull_tests::{
    api_call, kit_file, kvm_trial, report_from, run_lull, snapshot_into, start_api_server,
    temp_path, wait_for_console, Arguments, Failed,
};

/// Longer than the guest's longest timer (10 ms + 1 ms per vCPU).
const LONG_PAUSE: Duration = Duration::from_millis(300);
/// The guest's longest timer, in ns (CPU 1's: 10 ms + 1 ms).
const LONGEST_TIMER_NS: i64 = 11_000_000;

/// Timers per phase of the guest (`count=`).
const COUNT: u32 = 20;

/// A phase of `pause-timers` on each vCPU: `COUNT` TSC-deadline timers, then `COUNT` one-shot
/// ones, then a periodic timer for `COUNT` ticks.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Deadline,
    OneShot,
    Periodic,
}

impl Phase {
    /// The vCPU's timer fires before the phase (lull's `lapic_timer_fires`).
    fn fires_before(self) -> u64 {
        u64::from(COUNT)
            * match self {
                Phase::Deadline => 0,
                Phase::OneShot => 1,
                Phase::Periodic => 2,
            }
    }

    /// The LAPIC timer mode of the phase, as a snapshot's vCPU file names it.
    fn mode(self) -> &'static str {
        match self {
            Phase::Deadline => "TscDeadline",
            Phase::OneShot => "OneShot",
            Phase::Periodic => "Periodic",
        }
    }
}

/// A lull serving the API with `pause-timers` created; killed if the test fails early.
struct PausedVm {
    child: Option<Child>,
    socket: PathBuf,
    serial: PathBuf,
    log: mpsc::Receiver<String>,
}

impl PausedVm {
    /// Starts lull with the guest (`count` timers per phase) on 2 vCPUs, `extra` flags.
    fn start(name: &str, count: u32, extra: &[&str]) -> Result<Self, Failed> {
        let kernel = kit_file("guests/pause-timers.elf")?;
        let serial = temp_path(&format!("{name}.serial"));
        let _ = std::fs::remove_file(&serial);
        let cmdline = format!("count={count} ns=10000000 spread_ns=1000000");
        let serial_flag = format!("file={}", serial.display());
        let kernel = kernel.display().to_string();
        let mut args = vec![
            "--kernel",
            &kernel,
            "--cpus",
            "2",
            "--cmdline",
            &cmdline,
            "--serial",
            &serial_flag,
        ];
        args.extend_from_slice(extra);
        let server = start_api_server(name, &args)?;
        Ok(Self {
            child: Some(server.child),
            socket: server.socket,
            serial,
            log: server.log,
        })
    }

    /// Fails unless `method endpoint` answers `want`; the body.
    fn expect(&self, method: &str, endpoint: &str, want: u16) -> Result<String, Failed> {
        let (status, body) = api_call(&self.socket, method, endpoint, "")?;
        if status != want {
            return Err(
                format!("{method} {endpoint}: status {status}, want {want}: {body}").into(),
            );
        }
        Ok(body)
    }

    fn info(&self) -> Result<serde_json::Value, Failed> {
        let body = self.expect("GET", "vm.info", 200)?;
        serde_json::from_str(&body).map_err(|e| format!("vm.info: {e}: {body}").into())
    }

    fn counters(&self) -> Result<RunReport, Failed> {
        let body = self.expect("GET", "vm.counters", 200)?;
        report_from(&body).map_err(|e| format!("vm.counters: {e}").into())
    }

    fn serial_text(&self) -> String {
        std::fs::read_to_string(&self.serial).unwrap_or_default()
    }

    /// Waits up to 60 s for the guest's console to show `line`.
    fn wait_for_line(&self, line: &str) -> Result<(), Failed> {
        wait_for_console(&self.serial, line, &[], Duration::from_secs(60)).map(drop)
    }

    /// Pauses for `length`: the state says `Paused`, and no vCPU exits or takes a timer
    /// meanwhile (the counters at the start and the end of the pause are equal).
    fn pause_for(&self, length: Duration) -> Result<(), Failed> {
        self.expect("PUT", "vm.pause", 204)?;
        let state = self.info()?["state"].clone();
        if state != "Paused" {
            return Err(format!("vm.info state {state} after vm.pause").into());
        }
        let before = activity(&self.counters()?);
        std::thread::sleep(length);
        let after = activity(&self.counters()?);
        if before != after {
            return Err(format!("the vCPUs ran while paused: {before:?} -> {after:?}").into());
        }
        self.expect("PUT", "vm.resume", 204)?;
        Ok(())
    }

    /// Waits up to 120 s for the guest to end; fails unless it passed. Returns its console.
    fn guest_passes(&self) -> Result<String, Failed> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let info = self.info()?;
            if info["state"] == "Shutdown" {
                let text = self.serial_text();
                if info["stop_reason"] != "guest test exit (status 1)"
                    || !text.contains("pause-timers: PASS")
                {
                    return Err(format!("the guest did not pass: {info}\n{text}").into());
                }
                return Ok(text);
            }
            if Instant::now() > deadline {
                return Err(format!("the guest did not end: {}", self.serial_text()).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `vmm.shutdown`; lull must exit with the guest's status.
    fn finish(mut self) -> Result<(), Failed> {
        self.expect("PUT", "vmm.shutdown", 204)?;
        let mut child = self.child.take().ok_or("already finished")?;
        let status = child.wait().map_err(|e| e.to_string())?;
        match status.code() {
            Some(GUEST_PASS) => Ok(()),
            code => Err(format!("lull exited with {code:?}, want {GUEST_PASS}").into()),
        }
    }

    /// What lull said of guest time over its `resumes` resumes: `true` if it stood still (KVM
    /// moved the TSC back), `false` if it ran on (it cannot: PVM hosts). Fails unless every
    /// "VM resumed" line says one or the other, the same each time.
    fn time_stood_still(&self, resumes: usize) -> Result<bool, Failed> {
        let said: Vec<bool> = self
            .log
            .try_iter()
            .filter(|l| l.contains("VM resumed"))
            .map(|l| {
                if l.contains("guest time stood still") {
                    Ok(true)
                } else if l.contains("guest time ran on") {
                    Ok(false)
                } else {
                    Err(format!(
                        "lull's resume does not say what guest time did: {l}"
                    ))
                }
            })
            .collect::<Result<_, _>>()?;
        match said.first() {
            Some(&first) if said.len() == resumes && said.iter().all(|&s| s == first) => Ok(first),
            _ => Err(format!("{resumes} resumes, lull said of guest time: {said:?}").into()),
        }
    }
}

impl Drop for PausedVm {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(&self.serial);
    }
}

/// Everything a vCPU does that lull counts: it must not change while the VM is paused.
fn activity(report: &RunReport) -> Vec<[u64; 9]> {
    report
        .vcpus
        .iter()
        .map(|v| {
            [
                v.io_in,
                v.io_out,
                v.mmio_read,
                v.mmio_write,
                v.hlt,
                v.msr,
                v.injected,
                v.lapic_timer_fires,
                v.global_timer_fires,
            ]
        })
        .collect()
}

/// The guest's `max_late_ns` over all its timers.
fn max_lateness_ns(console: &str) -> Option<i64> {
    console
        .lines()
        .find(|l| l.starts_with("pause-timers: timers "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.trim().parse().ok())
}

/// State errors first (as Cloud Hypervisor answers them), then pauses in the middle of the
/// guest's timers, one longer than its longest timer; the guest counts every timer.
fn pauses_keep_every_timer(extra: &[&str], name: &str) -> Result<(), Failed> {
    let vm = PausedVm::start(name, 20, extra)?;
    vm.expect("PUT", "vm.pause", 405)?;
    vm.expect("PUT", "vm.resume", 405)?;
    vm.expect("PUT", "vm.boot", 204)?;
    vm.expect("PUT", "vm.resume", 500)?;
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
    } else if late < pause - LONGEST_TIMER_NS || late >= 2 * pause {
        // Guest time ran on (the TSC could not be moved back): the timer each vCPU had armed
        // came due during a long pause and fired at the resume, late by the rest of the pause
        // (not by a pause more: lull's clocks ran on with the guest's).
        return Err(format!(
            "lull said guest time ran on over a {LONG_PAUSE:?} pause; the latest timer was \
             {late} ns late"
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
    let memory = std::fs::metadata(dir.join("memory")).map_err(|e| e.to_string())?;
    if manifest["format_version"] != 2
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

/// `vm.restore` of `dir` on a new lull: the status and the body; the lull.
fn restore_into_new_lull(name: &str, dir: &Path) -> Result<(PausedVm, u16, String), Failed> {
    restore_into_new_lull_with(name, dir, "")
}

/// [`restore_into_new_lull`], with `more` fields of Cloud Hypervisor's `RestoreConfig` after
/// `source_url` (`, "resume": true`).
fn restore_into_new_lull_with(
    name: &str,
    dir: &Path,
    more: &str,
) -> Result<(PausedVm, u16, String), Failed> {
    let server = start_api_server(name, &[])?;
    let vm = PausedVm {
        child: Some(server.child),
        socket: server.socket,
        serial: PathBuf::new(),
        log: server.log,
    };
    let body = format!(r#"{{"source_url": "file://{}"{more}}}"#, dir.display());
    let (status, text) = api_call(&vm.socket, "PUT", "vm.restore", &body)?;
    Ok((vm, status, text))
}

/// `pause-timers` started with `extra` (an irqchip mode, a timer model), snapshotted
/// mid-flight (with `--irqchip user`, in `phase` on every vCPU, which the snapshot's LAPICs
/// must show), its lull ended, and restored into a new lull: it starts paused, stays paused
/// `held` (longer than the guest's longest timer in some runs), and once resumed the guest
/// finishes its timers, every one once and none early (its console is the same file). Then the
/// same snapshot through `lull run --restore DIR --resume`, through `vm.restore` with the
/// body `ch-remote restore` sends and `resume` on, and through `lull ch --restore
/// source_url=...,resume=true`. No restored run writes over the saving run's `--metrics` file
/// (the report of that run, not part of the VM). Returns the snapshot directory.
fn restore_finishes_the_timers(
    extra: &[&str],
    name: &str,
    phase: Option<Phase>,
    held: Duration,
) -> Result<PathBuf, Failed> {
    let first_metrics = temp_path(&format!("{name}-1.json"));
    let metrics_arg = first_metrics.display().to_string();
    let mut flags = extra.to_vec();
    flags.extend(["--metrics", &metrics_arg]);
    let first = PausedVm::start(&format!("{name}-1"), COUNT, &flags)?;
    first.expect("PUT", "vm.boot", 204)?;
    first.wait_for_line("pause-timers: running")?;
    match phase {
        Some(phase) => pause_in_phase(&first, phase)?,
        None => first.expect("PUT", "vm.pause", 204).map(drop)?,
    }
    let dir = snapshot_into(&first.socket, &format!("{name}-snapshot"))?;
    if let Some(phase) = phase {
        snapshot_caught(&dir, phase)?;
    }
    let serial = first.serial.clone();
    // 204 once the run ended and its report is written.
    first.expect("PUT", "vmm.shutdown", 204)?;
    drop(first);
    let first_report =
        std::fs::read(&first_metrics).map_err(|e| format!("the saving run's report: {e}"))?;
    let report_kept = |by: &str| -> Result<(), Failed> {
        match std::fs::read(&first_metrics) {
            Ok(now) if now == first_report => Ok(()),
            _ => Err(format!("{by} wrote over the saving run's --metrics file").into()),
        }
    };
    let (mut second, status, text) = restore_into_new_lull(&format!("{name}-2"), &dir)?;
    if status != 204 {
        return Err(format!("vm.restore: status {status}: {text}").into());
    }
    second.serial = serial;
    if second.info()?["state"] != "Paused" {
        return Err(format!("a restored VM is not paused: {}", second.info()?).into());
    }
    let again = format!(r#"{{"source_url": "file://{}"}}"#, dir.display());
    let (status, text) = api_call(&second.socket, "PUT", "vm.restore", &again)?;
    if status != 500 {
        return Err(format!("vm.restore on a lull with a VM: status {status}: {text}").into());
    }
    if !held.is_zero() {
        let before = activity(&second.counters()?);
        std::thread::sleep(held);
        let after = activity(&second.counters()?);
        if before != after {
            return Err(
                format!("the restored vCPUs ran while paused: {before:?} -> {after:?}").into(),
            );
        }
    }
    second.expect("PUT", "vm.resume", 204)?;
    second.guest_passes()?;
    let serial = second.serial.clone();
    // Ends that lull and removes its console file: what the file holds next is the next run's.
    second.finish()?;
    report_kept("the run restored by vm.restore")?;

    // The same snapshot with `lull run --restore DIR --resume` (no API): the guest passes
    // again; without --resume lull refuses (a VM nobody could resume).
    let dir_arg = dir.display().to_string();
    run_lull(&["run", "--restore", &dir_arg], Duration::from_secs(60))?.expect_code(BAD_INPUT)?;
    let run = run_lull(
        &["run", "--restore", &dir_arg, "--resume"],
        Duration::from_secs(120),
    )?;
    run.expect_code(GUEST_PASS)?;
    let text = std::fs::read_to_string(&serial).map_err(|e| e.to_string())?;
    if !text.contains("pause-timers: PASS") {
        return Err(format!("lull run --restore: the guest did not pass again:\n{text}").into());
    }
    report_kept("lull run --restore")?;
    let _ = std::fs::remove_file(&serial);

    // Once more through vm.restore with the body `ch-remote restore` sends, `resume` on: the
    // VM runs at once, and the guest passes without a vm.resume.
    let ch_remote =
        r#", "prefault": true, "memory_restore_mode": "Copy", "net_fds": null, "resume": true"#;
    let (mut fourth, status, text) =
        restore_into_new_lull_with(&format!("{name}-4"), &dir, ch_remote)?;
    if status != 204 {
        return Err(format!("vm.restore with resume: status {status}: {text}").into());
    }
    fourth.serial = serial.clone();
    fourth.guest_passes()?;
    fourth.finish()?;
    report_kept("the run restored by vm.restore with resume")?;

    // And through Cloud Hypervisor's command line, `resume=true` and no API socket.
    let source = format!("source_url=file://{},resume=true", dir.display());
    let run = run_lull(&["ch", "--restore", &source], Duration::from_secs(120))?;
    run.expect_code(GUEST_PASS)?;
    let text = std::fs::read_to_string(&serial).map_err(|e| e.to_string())?;
    if !text.contains("pause-timers: PASS") {
        return Err(format!("lull ch --restore: the guest did not pass:\n{text}").into());
    }
    let _ = std::fs::remove_file(&serial);
    let _ = std::fs::remove_file(&first_metrics);
    Ok(dir)
}

/// `--irqchip kernel` restore, then a damaged snapshot (the memory file one page short) is
/// refused with a reason and leaves the new lull without a VM.
fn restore_kernel_irqchip() -> Result<(), Failed> {
    let zero = Duration::ZERO;
    let dir = restore_finishes_the_timers(&["--irqchip", "kernel"], "restore", None, zero)?;
    let memory = dir.join("memory");
    let len = std::fs::metadata(&memory).map_err(|e| e.to_string())?.len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&memory)
        .and_then(|f| f.set_len(len - 4096))
        .map_err(|e| e.to_string())?;
    let (third, status, text) = restore_into_new_lull("restore-3", &dir)?;
    if status != 500 || !text.contains("truncated") {
        return Err(format!("a truncated snapshot: status {status}: {text}").into());
    }
    third.expect("GET", "vm.info", 404)?;
    drop(third);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Pauses the VM once every vCPU is in `phase`, a timer of the phase fired and one is left:
/// pauses, reads lull's count of each vCPU's timer fires, and resumes to try again while a
/// vCPU has not reached the phase. Fails if one passed it first (a host so loaded that the
/// guest's phases no longer overlap), or after 120 s. Returns with the VM paused.
fn pause_in_phase(vm: &PausedVm, phase: Phase) -> Result<(), Failed> {
    let (low, high) = (
        phase.fires_before(),
        phase.fires_before() + u64::from(COUNT),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        vm.expect("PUT", "vm.pause", 204)?;
        let fires: Vec<u64> = vm
            .counters()?
            .vcpus
            .iter()
            .map(|v| v.lapic_timer_fires)
            .collect();
        if fires.len() == 2 && fires.iter().all(|&f| low < f && f < high) {
            return Ok(());
        }
        if fires.iter().any(|&f| f >= high) || Instant::now() > deadline {
            return Err(format!(
                "no pause caught every vCPU in its {phase:?} phase: timer fires {fires:?}, the \
                 phase's are {low}..{high}"
            )
            .into());
        }
        vm.expect("PUT", "vm.resume", 204)?;
        // Pacing only: each try is checked on the counters above.
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Fails unless every vCPU's LAPIC in the snapshot in `dir` has its timer in `phase`'s mode.
fn snapshot_caught(dir: &Path, phase: Phase) -> Result<(), Failed> {
    for cpu in 0..2 {
        let path = dir.join(format!("vcpu-{cpu}.json"));
        let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let state: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let timer = &state["user_irqchip"]["lapic"]["timer"];
        if timer["mode"] != phase.mode() {
            return Err(format!(
                "the snapshot caught vCPU {cpu} outside its {phase:?} phase: timer {timer}"
            )
            .into());
        }
    }
    Ok(())
}

/// Rewrites state file `file` of the snapshot in `dir` with `change` applied to its JSON, and
/// its size and checksum in the manifest with it (so that only the content is wrong).
fn rewrite_state(
    dir: &Path,
    file: &str,
    change: impl FnOnce(&mut serde_json::Value),
) -> Result<(), Failed> {
    let read = |path: &Path| -> Result<serde_json::Value, Failed> {
        let text = std::fs::read(path).map_err(|e| e.to_string())?;
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()).into())
    };
    let mut state = read(&dir.join(file))?;
    change(&mut state);
    let bytes = serde_json::to_vec(&state).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(file), &bytes).map_err(|e| e.to_string())?;
    let mut manifest = read(&dir.join("manifest.json"))?;
    let entries = manifest["vcpus"]
        .as_array_mut()
        .ok_or("no vcpus in the manifest")?;
    let entry = entries
        .iter_mut()
        .find(|e| e["file"] == file)
        .ok_or_else(|| format!("no {file} in the manifest"))?;
    entry["bytes"] = bytes.len().into();
    entry["fnv64"] = vmm::snapshot::fnv64(&bytes).into();
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("manifest.json"), text).map_err(|e| e.to_string().into())
}

/// `--irqchip user` restore with `extra`, snapshotted in `phase` of its timers, held paused
/// for `held`; then (`refusals`) a vCPU
/// file whose LAPIC state is corrupt, with a matching checksum, is refused by the field's
/// name, and a snapshot of the previous format version by its version.
fn restore_user_irqchip(
    extra: &[&str],
    name: &str,
    phase: Phase,
    held: Duration,
    refusals: bool,
) -> Result<(), Failed> {
    let mut args = vec!["--irqchip", "user"];
    args.extend_from_slice(extra);
    let dir = restore_finishes_the_timers(&args, name, Some(phase), held)?;
    if refusals {
        rewrite_state(&dir, "vcpu-1.json", |v| {
            v["user_irqchip"]["lapic"]["nmis_pending"] = 9.into();
        })?;
        let (refused, status, text) = restore_into_new_lull(&format!("{name}-bad"), &dir)?;
        if status != 500 || !text.contains("vCPU 1") || !text.contains("9 NMIs pending") {
            return Err(format!("a corrupt LAPIC state: status {status}: {text}").into());
        }
        refused.expect("GET", "vm.info", 404)?;
        drop(refused);
        let manifest = dir.join("manifest.json");
        let text = std::fs::read_to_string(&manifest).map_err(|e| e.to_string())?;
        let old = text.replacen(
            &format!("\"format_version\": {}", vmm::snapshot::FORMAT_VERSION),
            "\"format_version\": 1",
            1,
        );
        std::fs::write(&manifest, old).map_err(|e| e.to_string())?;
        let (refused, status, text) = restore_into_new_lull(&format!("{name}-old"), &dir)?;
        if status != 500 || !text.contains("version 1") {
            return Err(format!("a version 1 snapshot: status {status}: {text}").into());
        }
        refused.expect("GET", "vm.info", 404)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
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
