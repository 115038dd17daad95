//! Restores of a `pause-timers` snapshot into a new lull: `--irqchip kernel`, and `--irqchip
//! user` with each timer model, the snapshot taken in the phase of the guest's timers its test
//! names; and the snapshots lull refuses.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lull_tests::exit_status::{BAD_INPUT, GUEST_PASS};
use lull_tests::{
    api_call, run_lull, run_restored, snapshot_file, snapshot_into, start_api_server, temp_path,
    Failed,
};

use super::paused_vm::{activity, PausedVm};

/// Timers per phase of the guest (`count=`): each phase lasts 0.5 s or more (10-11 ms timers),
/// time for the test to pause in the one it wants on a loaded host.
const COUNT: u32 = 50;

/// A phase of `pause-timers` on each vCPU: `COUNT` TSC-deadline timers, then `COUNT` one-shot
/// ones, then a periodic timer for `COUNT` ticks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
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
/// finishes its timers, every one once and none early (its console is the same file, given
/// again to each restore: a snapshot's own console file is not reused). Then the
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
    let (saved, serial) = save_mid_flight(extra, name, phase)?;
    let dir = &saved.dir;
    restored_by_api_passes(name, dir, &serial, held)?;
    saved.report_kept("the run restored by vm.restore")?;
    restored_by_run_passes(dir, &serial)?;
    saved.report_kept("lull run --restore")?;
    restored_by_ch_remote_passes(name, dir, &serial)?;
    saved.report_kept("the run restored by vm.restore with resume")?;
    restored_by_ch_cli_passes(dir, &serial)?;
    let _ = std::fs::remove_file(&saved.metrics);
    Ok(saved.dir)
}

/// A snapshot of a guest in flight, and the report its saving run wrote at its end.
struct Saved {
    /// The snapshot.
    dir: PathBuf,
    /// The saving run's `--metrics` file.
    metrics: PathBuf,
    /// What it held once that run ended.
    report: Vec<u8>,
}

impl Saved {
    /// Fails if the saving run's report changed since it ended: `by` wrote over it.
    fn report_kept(&self, by: &str) -> Result<(), Failed> {
        match std::fs::read(&self.metrics) {
            Ok(now) if now == self.report => Ok(()),
            _ => Err(format!("{by} wrote over the saving run's --metrics file").into()),
        }
    }
}

/// `pause-timers` started with `extra`, paused (in `phase` if given, which the snapshot must
/// show), snapshotted and its lull ended: the snapshot and the guest's console file.
fn save_mid_flight(
    extra: &[&str],
    name: &str,
    phase: Option<Phase>,
) -> Result<(Saved, PathBuf), Failed> {
    let metrics = temp_path(&format!("{name}-1.json"));
    let metrics_arg = metrics.display().to_string();
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
    let report = std::fs::read(&metrics).map_err(|e| format!("the saving run's report: {e}"))?;
    let saved = Saved {
        dir,
        metrics,
        report,
    };
    Ok((saved, serial))
}

/// `, "serial": "file=SERIAL"`: the field that gives a restored VM `serial` as its console.
fn serial_field(serial: &Path) -> String {
    format!(r#", "serial": "file={}""#, serial.display())
}

/// `vm.restore` of `dir` into a new lull: the VM is paused, a second `vm.restore` is refused,
/// its vCPUs do not run while it is `held`, and once resumed the guest passes. Ends that lull
/// and removes its console file `serial`: what the file holds next is the next run's.
fn restored_by_api_passes(
    name: &str,
    dir: &Path,
    serial: &Path,
    held: Duration,
) -> Result<(), Failed> {
    let (mut second, status, text) =
        restore_into_new_lull_with(&format!("{name}-2"), dir, &serial_field(serial))?;
    if status != 204 {
        return Err(format!("vm.restore: status {status}: {text}").into());
    }
    second.serial = serial.to_path_buf();
    if second.info()?["state"] != "Paused" {
        return Err(format!("a restored VM is not paused: {}", second.info()?).into());
    }
    let again = format!(r#"{{"source_url": "file://{}"}}"#, dir.display());
    // A lull that has a VM refuses another restore: 404, as Cloud Hypervisor's API
    // description says.
    let (status, text) = api_call(&second.socket, "PUT", "vm.restore", &again)?;
    if status != 404 {
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
    second.finish()
}

/// The same snapshot with `lull run --restore DIR --resume` (no API): the guest passes
/// again; without --resume lull refuses (a VM nobody could resume).
fn restored_by_run_passes(dir: &Path, serial: &Path) -> Result<(), Failed> {
    let dir_arg = dir.display().to_string();
    run_lull(&["run", "--restore", &dir_arg], Duration::from_secs(60))?.expect_code(BAD_INPUT)?;
    let run = run_restored(dir, serial, Duration::from_secs(120))?;
    run.expect_code(GUEST_PASS)?;
    let text = std::fs::read_to_string(serial).map_err(|e| e.to_string())?;
    if !text.contains("pause-timers: PASS") {
        return Err(format!("lull run --restore: the guest did not pass again:\n{text}").into());
    }
    let _ = std::fs::remove_file(serial);
    Ok(())
}

/// Once more through vm.restore with the body `ch-remote restore` sends, `resume` on: the
/// VM runs at once, and the guest passes without a vm.resume.
fn restored_by_ch_remote_passes(name: &str, dir: &Path, serial: &Path) -> Result<(), Failed> {
    let ch_remote = format!(
        r#", "prefault": true, "memory_restore_mode": "Copy", "net_fds": null, "resume": true{}"#,
        serial_field(serial)
    );
    let (mut fourth, status, text) =
        restore_into_new_lull_with(&format!("{name}-4"), dir, &ch_remote)?;
    if status != 204 {
        return Err(format!("vm.restore with resume: status {status}: {text}").into());
    }
    fourth.serial = serial.to_path_buf();
    fourth.guest_passes()?;
    fourth.finish()
}

/// And through Cloud Hypervisor's command line, `resume=true` and no API socket.
fn restored_by_ch_cli_passes(dir: &Path, serial: &Path) -> Result<(), Failed> {
    let source = format!(
        "source_url=file://{},resume=true,serial=file={}",
        dir.display(),
        serial.display()
    );
    let run = run_lull(&["ch", "--restore", &source], Duration::from_secs(120))?;
    run.expect_code(GUEST_PASS)?;
    let text = std::fs::read_to_string(serial).map_err(|e| e.to_string())?;
    if !text.contains("pause-timers: PASS") {
        return Err(format!("lull ch --restore: the guest did not pass:\n{text}").into());
    }
    let _ = std::fs::remove_file(serial);
    Ok(())
}

/// `--irqchip kernel` restore, then a damaged snapshot (the memory file one page short) is
/// refused with a reason and leaves the new lull without a VM.
pub(crate) fn restore_kernel_irqchip() -> Result<(), Failed> {
    let zero = Duration::ZERO;
    let dir = restore_finishes_the_timers(&["--irqchip", "kernel"], "restore", None, zero)?;
    let memory = snapshot_file(&dir, "/memory_file")?;
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
        let path = snapshot_file(dir, &format!("/vcpus/{cpu}/file"))?;
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
pub(crate) fn restore_user_irqchip(
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
        let vcpu1 = snapshot_file(&dir, "/vcpus/1/file")?;
        let vcpu1 = vcpu1
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("vCPU 1's file")?;
        rewrite_state(&dir, vcpu1, |v| {
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
