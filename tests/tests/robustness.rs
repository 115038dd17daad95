//! Integration tests of issue 33, "nothing lost, nobody starved": one test per fault lull
//! used to take badly, each asserting what lull now promises (docs/RELIABILITY.md).
//!
//! - Files: an output path that is an input is refused before anything is written (the input
//!   is unchanged); a disk image is locked for the VM's life (the same image twice in one
//!   lull, or in two lulls, is refused and the holder named); an image truncated under a
//!   running VM fails the guest's next write (the guest sees the I/O error, the file is not
//!   re-grown, the metrics count it).
//! - Inputs: `--config /dev/zero` and a JSON array are refused at once; unaligned memory and
//!   knobs that would be ignored are refused with the rule; a serial file that cannot be
//!   written stops lull with a message; too few file descriptors is status 4 with what to
//!   raise; `vm.create` refuses a directory as kernel (400) and a VM whose boot failed can be
//!   created again.
//! - Processes: a `lull bench` stopped by SIGTERM, or killed by SIGKILL, leaves none of its
//!   VMs running; a SIGTERM pending from lull's first instruction ends the run with status 12
//!   and its metrics.
//!
//! Tests that boot need `/dev/kvm` and are reported as ignored where it is missing; the
//! others need only the lull binary (lull refuses before it touches KVM).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lull_tests::exit_status::{BAD_INPUT, USER_STOP};
use lull_tests::{
    api_call as api, kit_dir, kit_file, kvm_trial, lull_bin, run_lull, run_lull_in,
    start_api_server, take_metrics, temp_path, Arguments, Failed, RunResult, Trial,
};

const DEADLINE: Duration = Duration::from_secs(60);

fn arg(p: &Path) -> String {
    p.display().to_string()
}

/// A fresh file of `bytes` filled with `fill`, named for the test.
fn file(name: &str, bytes: usize, fill: u8) -> Result<PathBuf, Failed> {
    let path = temp_path(name);
    std::fs::write(&path, vec![fill; bytes]).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Fails unless lull exited 4 and its stderr says every one of `needles`.
fn refused(r: &RunResult, needles: &[&str]) -> Result<(), Failed> {
    r.expect_code(BAD_INPUT)?;
    match needles.iter().find(|n| !r.stderr.contains(*n)) {
        Some(n) => Err(r.failure(&format!("the refusal does not say {n:?}"))),
        None => Ok(()),
    }
}

/// A copy of the kit's `hello` guest, so that a test may point outputs at it.
fn kernel_copy(name: &str) -> Result<(PathBuf, Vec<u8>), Failed> {
    let original = std::fs::read(kit_file("guests/hello.elf")?).map_err(|e| e.to_string())?;
    let path = temp_path(name);
    std::fs::write(&path, &original).map_err(|e| e.to_string())?;
    Ok((path, original))
}

fn metrics_at_the_kernel_is_refused() -> Result<(), Failed> {
    let (kernel, original) = kernel_copy("clash-kernel.elf")?;
    let r = run_lull(
        &["run", "--kernel", &arg(&kernel), "--metrics", &arg(&kernel)],
        DEADLINE,
    );
    let kept = std::fs::read(&kernel).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&kernel);
    refused(&r?, &["--metrics", "--kernel", "same file"])?;
    if kept != original {
        return Err("the kernel changed".into());
    }
    Ok(())
}

fn serial_file_at_a_disk_image_is_refused() -> Result<(), Failed> {
    let (kernel, _) = kernel_copy("clash-serial.elf")?;
    let image = file("clash-serial.img", 64 << 10, 0x5a)?;
    let r = run_lull(
        &[
            "run",
            "--kernel",
            &arg(&kernel),
            "--disk",
            &format!("path={}", arg(&image)),
            "--serial",
            &format!("file={}", arg(&image)),
        ],
        DEADLINE,
    );
    let kept = std::fs::read(&image).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&image);
    let _ = std::fs::remove_file(&kernel);
    refused(&r?, &["--serial", "--disk", "same file"])?;
    if kept.len() != 64 << 10 || kept.iter().any(|b| *b != 0x5a) {
        return Err("the disk image changed".into());
    }
    Ok(())
}

fn one_image_as_two_writable_disks_is_refused() -> Result<(), Failed> {
    let (kernel, _) = kernel_copy("twice.elf")?;
    let image = file("twice.img", 64 << 10, 0)?;
    let disk = format!("path={}", arg(&image));
    let r = run_lull(
        &[
            "run",
            "--kernel",
            &arg(&kernel),
            "--disk",
            &disk,
            "--disk",
            &format!("{disk},readonly=on"),
        ],
        DEADLINE,
    );
    let _ = std::fs::remove_file(&image);
    let _ = std::fs::remove_file(&kernel);
    refused(&r?, &["in use by this lull", "given as two disks"])
}

/// lull with piped stdout, the lines of which arrive on the receiver.
fn spawn_lull(args: &[&str]) -> Result<(Child, mpsc::Receiver<String>), Failed> {
    let mut child = Command::new(lull_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start lull: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    Ok((child, rx))
}

/// Waits for a line containing `marker`; returns the lines seen (`Err` with them if none).
fn wait_for(lines: &mpsc::Receiver<String>, marker: &str) -> Result<Vec<String>, Vec<String>> {
    let deadline = Instant::now() + DEADLINE;
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                let found = line.contains(marker);
                seen.push(line);
                if found {
                    return Ok(seen);
                }
            }
            Err(_) => return Err(seen),
        }
    }
}

/// Sends `signal` (`-TERM`, `-KILL`) to `pid`.
fn kill(signal: &str, pid: u32) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status();
}

fn a_second_lull_cannot_take_a_disk_in_use() -> Result<(), Failed> {
    let kernel = arg(&kit_file("guests/virtio-blk.elf")?);
    let image = file("held.img", 1 << 20, 0)?;
    let disk = format!("path={}", arg(&image));
    let (mut first, lines) = spawn_lull(&[
        "run",
        "--kernel",
        &kernel,
        "--cmdline",
        "idle=1",
        "--disk",
        &disk,
    ])?;
    let result = (|| -> Result<(), Failed> {
        wait_for(&lines, "virtio-blk: idle after writes")
            .map_err(|seen| format!("the first guest never went idle: {seen:?}"))?;
        let holder = format!("in use by process {} (lull)", first.id());
        for second in [disk.clone(), format!("{disk},readonly=on")] {
            let r = run_lull(&["run", "--kernel", &kernel, "--disk", &second], DEADLINE)?;
            refused(&r, &[&holder])?;
        }
        Ok(())
    })();
    kill("-TERM", first.id());
    let status = first.wait().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&image);
    result?;
    match status.code() {
        Some(USER_STOP) => Ok(()),
        other => Err(format!("the first lull exited {other:?} after SIGTERM").into()),
    }
}

fn a_truncated_disk_fails_the_guests_next_write() -> Result<(), Failed> {
    let kernel = arg(&kit_file("guests/virtio-blk.elf")?);
    let image = file("shrink.img", 1 << 20, 0)?;
    let metrics = temp_path("shrink.json");
    let (mut lull, lines) = spawn_lull(&[
        "run",
        "--kernel",
        &kernel,
        "--cmdline",
        "rate_ms=600000",
        "--disk",
        &format!("path={}", arg(&image)),
        "--metrics",
        &arg(&metrics),
    ])?;
    // The guest's checks are done; from here it only writes sectors 24-535 until it fails.
    let ready = wait_for(&lines, "virtio-blk: error statuses right");
    if ready.is_ok() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .and_then(|f| f.set_len(4096))
            .map_err(|e| e.to_string())?;
    }
    let failed = ready.and_then(|_| wait_for(&lines, "virtio-blk: FAIL: rate write"));
    if failed.is_err() {
        kill("-KILL", lull.id());
    }
    let status = lull.wait().map_err(|e| e.to_string())?;
    let size = std::fs::metadata(&image).map(|m| m.len()).ok();
    let _ = std::fs::remove_file(&image);
    let seen = failed.map_err(|seen| format!("the guest's writes did not fail: {seen:?}"))?;
    let report = take_metrics(&metrics)?;
    if report.disk_shrunk_image_errors < 1 {
        return Err(format!("no shrink error counted: {report:?}").into());
    }
    if size != Some(4096) {
        return Err(format!("the image was re-grown to {size:?} bytes").into());
    }
    // The guest's fail() exits through the test port with an odd status other than 1.
    match status.code() {
        Some(c) if c % 2 == 1 && c != 1 => Ok(()),
        other => Err(format!("lull exited {other:?}: {seen:?}").into()),
    }
}

fn config_from_a_device_is_refused_unread() -> Result<(), Failed> {
    let r = run_lull(&["run", "--config", "/dev/zero"], DEADLINE)?;
    refused(&r, &["/dev/zero", "not a regular file"])
}

fn config_that_is_an_array_is_refused() -> Result<(), Failed> {
    let path = file("array.json", 0, 0)?;
    std::fs::write(&path, "[]").map_err(|e| e.to_string())?;
    let r = run_lull(&["run", "--config", &arg(&path)], DEADLINE);
    let _ = std::fs::remove_file(&path);
    refused(&r?, &["JSON object"])
}

fn unaligned_memory_is_refused() -> Result<(), Failed> {
    let r = run_lull(&["run", "--memory", "33554433"], DEADLINE)?;
    refused(&r, &["--memory", "multiple of 4 KiB"])
}

fn knobs_that_would_be_ignored_are_refused() -> Result<(), Failed> {
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["--irqchip", "kernel", "--timer-model", "central"],
            &["--timer-model central", "--irqchip user"],
        ),
        (
            &["--irqchip", "kernel", "--timer-model", "push"],
            &["--timer-model push"],
        ),
        (
            &[
                "--irqchip",
                "kernel",
                "--idle-inject",
                "percent=20,period=50",
            ],
            &["--idle-inject"],
        ),
        (
            &["--cpu-quota", "quota=200,period=100"],
            &["--cpu-quota", "never apply"],
        ),
    ];
    for (flags, needles) in cases {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        refused(&run_lull(&args, DEADLINE)?, needles)?;
    }
    Ok(())
}

fn a_serial_file_that_cannot_be_written_stops_lull_and_says_so() -> Result<(), Failed> {
    let kernel = arg(&kit_file("guests/hello.elf")?);
    let r = run_lull(
        &["run", "--kernel", &kernel, "--serial", "file=/dev/full"],
        DEADLINE,
    )?;
    refused(&r, &["/dev/full", "cannot write the serial console"])
}

fn too_few_file_descriptors_is_bad_input_with_what_to_raise() -> Result<(), Failed> {
    let kernel = arg(&kit_file("guests/hello.elf")?);
    // Five: stdin, stdout, stderr and two more; KVM alone needs three (system, VM, vCPU).
    let r = run_lull_in(
        &["sh", "-c", "ulimit -n 5 && exec \"$@\"", "sh"],
        &["run", "--kernel", &kernel, "--serial", "off"],
        DEADLINE,
    )?;
    refused(&r, &["Too many open files", "ulimit -n"])
}

fn vm_create_checks_inputs_and_a_failed_boot_can_be_recreated() -> Result<(), Failed> {
    let server = start_api_server("create", &[])?;
    let (mut lull, socket) = (server.child, server.socket);
    let bad_elf = file("create-bad.elf", 64, 0)?;
    let result = (|| -> Result<(), Failed> {
        let dir = std::env::temp_dir();
        let as_kernel = serde_json::json!({ "kernel": dir }).to_string();
        let (status, body) = api(&socket, "PUT", "vm.create", &as_kernel)?;
        if status != 400 || !body.contains(&arg(&dir)) {
            return Err(format!("vm.create of a directory: {status} {body}").into());
        }
        let (status, _) = api(&socket, "GET", "vm.info", "")?;
        if status != 404 {
            return Err(format!("a refused VM was created: vm.info {status}").into());
        }
        // An ELF header that the probe takes but the loader cannot: the boot fails.
        std::fs::write(&bad_elf, [0x7f, b'E', b'L', b'F', 2, 1, 1, 0])
            .map_err(|e| e.to_string())?;
        let cfg = serde_json::json!({ "kernel": bad_elf, "serial": "off" }).to_string();
        for (method, endpoint, body, want) in [
            ("PUT", "vm.create", cfg.as_str(), 204),
            ("PUT", "vm.boot", "", 500),
            ("PUT", "vm.create", cfg.as_str(), 204),
            ("PUT", "vm.create", cfg.as_str(), 500),
        ] {
            let (status, text) = api(&socket, method, endpoint, body)?;
            if status != want {
                return Err(format!("{endpoint}: {status}, want {want}: {text}").into());
            }
        }
        Ok(())
    })();
    let _ = api(&socket, "PUT", "vmm.shutdown", "");
    let status = lull.wait().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&bad_elf);
    result?;
    if status.code() != Some(0) {
        return Err(format!("lull exited {status} after vmm.shutdown").into());
    }
    Ok(())
}

/// Processes (other than zombies) whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(needle)
        })
        .collect()
}

/// Polls `done` until it holds or [`DEADLINE`] passes.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

/// Starts `lull bench density` with two VMs in its own work dir, stops it with `signal` once
/// both VMs run, and checks that none of them is left.
fn a_stopped_bench_leaves_no_vm(signal: &'static str, want: Option<i32>) -> Result<(), Failed> {
    kit_file("guests/idle-sim.elf")?;
    let work = temp_path(&format!("bench-stop{signal}"));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let needle = arg(&work);
    let mut bench = Command::new(lull_bin())
        .args([
            "bench",
            "density",
            "--vms",
            "2",
            "--cpus",
            "1",
            "--duration",
            "10m",
            // The VMs start at once: no power baseline window before them.
            "--power-baseline",
            "off",
        ])
        .args([
            "--modes",
            "pull",
            "--kit",
            &arg(&kit_dir()),
            "--work-dir",
            &needle,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start lull bench: {e}"))?;
    let bench_pid = bench.id();
    let vms = || {
        let mut p = processes_mentioning(&needle);
        p.retain(|pid| *pid != bench_pid);
        p
    };
    let started = eventually(|| vms().len() >= 2);
    kill(signal, bench_pid);
    let status = bench.wait().map_err(|e| e.to_string())?;
    let gone = eventually(|| vms().is_empty());
    let left = vms();
    for pid in &left {
        kill("-KILL", *pid);
    }
    let _ = std::fs::remove_dir_all(&work);
    if !started {
        return Err("lull bench never had its two VMs running".into());
    }
    if !gone {
        return Err(format!("VMs outlived lull bench ({signal}): {left:?}").into());
    }
    if status.code() != want {
        return Err(format!("lull bench exited {status} after {signal}, want {want:?}").into());
    }
    Ok(())
}

fn an_early_sigterm_ends_the_run_with_12_and_metrics() -> Result<(), Failed> {
    let kernel = arg(&kit_file("guests/idle-sim.elf")?);
    let metrics = temp_path("early-term.json");
    let _ = std::fs::remove_file(&metrics);
    // SIGTERM blocked from before lull's first instruction (env execs lull with the mask),
    // so the signal sent below is pending when lull starts: the earliest a signal can come.
    let mut lull = Command::new("env")
        .arg("--block-signal=TERM")
        .arg(lull_bin())
        .args([
            "run",
            "--kernel",
            &kernel,
            "--cmdline",
            "duration_ms=600000",
        ])
        .args(["--serial", "off", "--metrics", &arg(&metrics)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start env lull: {e}"))?;
    let pid = lull.id();
    let bin = std::fs::canonicalize(lull_bin()).map_err(|e| e.to_string())?;
    let exec_d =
        eventually(|| std::fs::read_link(format!("/proc/{pid}/exe")).ok() == Some(bin.clone()));
    kill(if exec_d { "-TERM" } else { "-KILL" }, pid);
    let ended = eventually(|| matches!(lull.try_wait(), Ok(Some(_))));
    if !ended {
        kill("-KILL", pid);
    }
    let status = lull.wait().map_err(|e| e.to_string())?;
    let mut stderr = String::new();
    if let Some(mut e) = lull.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    if !exec_d {
        return Err("env never ran lull".into());
    }
    if status.code() != Some(USER_STOP) {
        return Err(format!("lull exited {status} after an early SIGTERM:\n{stderr}").into());
    }
    let report = take_metrics(&metrics)?;
    if report.stop_reason != "stopped by SIGTERM" || report.exit_status != USER_STOP {
        return Err(format!("metrics after an early SIGTERM: {report:?}").into());
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let tests = vec![
        Trial::test(
            "files/metrics_at_the_kernel_is_refused",
            metrics_at_the_kernel_is_refused,
        ),
        Trial::test(
            "files/serial_file_at_a_disk_image_is_refused",
            serial_file_at_a_disk_image_is_refused,
        ),
        Trial::test(
            "files/one_image_as_two_disks_is_refused",
            one_image_as_two_writable_disks_is_refused,
        ),
        kvm_trial(
            "files/a_second_lull_cannot_take_a_disk_in_use",
            a_second_lull_cannot_take_a_disk_in_use,
        ),
        kvm_trial(
            "files/a_truncated_disk_fails_the_guests_next_write",
            a_truncated_disk_fails_the_guests_next_write,
        ),
        Trial::test(
            "inputs/config_from_a_device_is_refused_unread",
            config_from_a_device_is_refused_unread,
        ),
        Trial::test(
            "inputs/config_that_is_an_array_is_refused",
            config_that_is_an_array_is_refused,
        ),
        Trial::test(
            "inputs/unaligned_memory_is_refused",
            unaligned_memory_is_refused,
        ),
        Trial::test(
            "inputs/knobs_that_would_be_ignored_are_refused",
            knobs_that_would_be_ignored_are_refused,
        ),
        kvm_trial(
            "inputs/a_serial_file_that_cannot_be_written_stops_lull",
            a_serial_file_that_cannot_be_written_stops_lull_and_says_so,
        ),
        kvm_trial(
            "inputs/too_few_file_descriptors_is_bad_input",
            too_few_file_descriptors_is_bad_input_with_what_to_raise,
        ),
        Trial::test(
            "inputs/vm_create_checks_inputs_and_a_failed_boot_can_be_recreated",
            vm_create_checks_inputs_and_a_failed_boot_can_be_recreated,
        ),
        kvm_trial("processes/a_bench_stopped_by_sigterm_leaves_no_vm", || {
            a_stopped_bench_leaves_no_vm("-TERM", Some(USER_STOP))
        }),
        kvm_trial("processes/a_bench_killed_by_sigkill_leaves_no_vm", || {
            a_stopped_bench_leaves_no_vm("-KILL", None)
        }),
        kvm_trial(
            "processes/an_early_sigterm_ends_the_run_with_12_and_metrics",
            an_early_sigterm_ends_the_run_with_12_and_metrics,
        ),
    ];
    libtest_mimic::run(&args, tests).exit();
}
