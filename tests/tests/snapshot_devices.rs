//! Device state across a snapshot and a restore (issue 31): the kit's `virtio-blk` guest with
//! `snapshot_ms=` writes a pattern to its disk and flushes, prints a marker, and halts (woken
//! by a LAPIC timer) while the test pauses the VM, checks the pattern is in the image,
//! snapshots it and ends that lull. `lull run --restore DIR --resume` then runs it on: the
//! guest reads the pattern back through the same virtqueue, which only works if the device
//! continues at its saved indices (a device from reset ignores the notification: the guest
//! fails with no interrupt), compares it, runs its usual checks on the disk and passes. The
//! console is the saving run's `--serial file=`, given again to the restore (appended to), so
//! the test sees that the restored run did not boot again. With a rate-limited disk, the
//! limiter's buckets travel too: the snapshot restored into a new lull (`vm.restore`, left
//! paused) and snapshotted again holds the same buckets (tokens, unspent burst, refill
//! fraction), which the guest's requests left short of full, where a limiter built afresh
//! would be full.
//! The saving run's `--metrics` file is its own: the restored run leaves it as it was.
//!
//! Before that restore, `lull run --restore DIR` refuses (status 4, named) a VM flag besides
//! `--metrics`, and a `--metrics` that is the snapshot's memory file, which it leaves intact.
//!
//! The same snapshot, its manifest edited to name a tap this host lacks, is refused with exit
//! status 4 (BAD_INPUT) and a message that names the tap by `lull run --restore`, and with
//! 500 and that message by `vm.restore`, which leaves the lull without a VM.
//!
//! Each case is a (irqchip, disk options) entry of `CASES`, in both irqchip modes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lull_tests::exit_status::{API_STOP, BAD_INPUT, GUEST_PASS};
use lull_tests::{
    api_call, kit_file, kvm_trial, run_lull, run_restored, snapshot_file, start_api_server,
    temp_path, wait_for_console, ApiLull, Arguments, Failed,
};

/// The irqchip and extra `--disk` options of each case.
const CASES: [(&str, &str); 4] = [
    ("kernel", ""),
    ("kernel", ",ops=500"),
    ("user", ""),
    ("user", ",ops=500"),
];
/// Sectors of the image (the guest needs 536).
const SECTORS: usize = 2048;
/// How long the guest waits for the snapshot (guest time; enough for a pause on a loaded
/// host: the test fails, saying so, if the guest ran past it before the pause).
const WAIT_MS: u64 = 5000;
/// The sectors the guest writes before the snapshot.
const SNAP_SECTORS: std::ops::Range<usize> = 32..40;

/// Byte `i` of sector `s` as the guest writes it (`pattern()` of virtio-blk.c).
fn pattern(sector: usize, i: usize) -> u8 {
    // The guest computes in u32 and keeps the low byte, which wider arithmetic gives too.
    ((sector * 131 + i) ^ 0x5a).to_le_bytes()[0]
}

/// Fails unless every sector in `sectors` of `image` holds the guest's pattern.
fn check_sectors(image: &Path, sectors: std::ops::Range<usize>) -> Result<(), Failed> {
    let data = std::fs::read(image).map_err(|e| format!("{}: {e}", image.display()))?;
    for s in sectors {
        for i in 0..512 {
            let got = data.get(s * 512 + i).copied();
            if got != Some(pattern(s, i)) {
                return Err(format!(
                    "image byte {i} of sector {s} is {got:?}, the guest wrote {}",
                    pattern(s, i)
                )
                .into());
            }
        }
    }
    Ok(())
}

/// Runs the guest to its marker, pauses, checks the image, snapshots into a new directory
/// and ends that lull, which writes its report to `metrics`. Returns the directory.
fn snapshot_after_flush(
    name: &str,
    irqchip: &str,
    disk: &str,
    image: &Path,
    serial: &Path,
    metrics: &Path,
) -> Result<PathBuf, Failed> {
    let kernel = kit_file("guests/virtio-blk.elf")?.display().to_string();
    let cmdline = format!("snapshot_ms={WAIT_MS}");
    let serial_flag = format!("file={}", serial.display());
    let metrics_arg = metrics.display().to_string();
    let server = start_api_server(
        name,
        &[
            "--kernel",
            &kernel,
            "--irqchip",
            irqchip,
            "--disk",
            disk,
            "--cmdline",
            &cmdline,
            "--serial",
            &serial_flag,
            "--metrics",
            &metrics_arg,
        ],
    )?;
    let lull = ApiLull::from(server);
    lull.put("vm.boot", "")?;
    wait_for_console(
        serial,
        "waiting for a snapshot",
        &[],
        Duration::from_secs(60),
    )?;
    lull.put("vm.pause", "")?;
    let text = std::fs::read_to_string(serial).unwrap_or_default();
    if text.contains("read back after the snapshot") {
        return Err(format!(
            "the guest ended its {WAIT_MS} ms wait before the pause (a very loaded host?):\n{text}"
        )
        .into());
    }
    check_sectors(image, SNAP_SECTORS)?;
    let dir = lull.snapshot_into(&format!("{name}-snapshot"))?;
    lull.shutdown(API_STOP)?;
    Ok(dir)
}

/// The saved buckets of the first disk's rate limiter in the snapshot in `dir`: its
/// `devices.json`'s `virtio[0].throttle.limiter`.
fn saved_buckets(dir: &Path) -> Result<serde_json::Value, Failed> {
    let path = snapshot_file(dir, "/devices/file")?;
    let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let devices: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let limiter = &devices["virtio"][0]["throttle"]["limiter"];
    if !limiter.is_object() {
        return Err(format!("no rate limiter in {}: {devices}", path.display()).into());
    }
    Ok(limiter.clone())
}

/// A rate limiter's buckets survive a restore: the snapshot in `dir` (its disk limited to
/// `ops` operations per second), restored into a new lull and snapshotted again while still
/// paused, holds the same buckets. The guest's requests left the operations bucket short of
/// full (a limiter built afresh would be full, so a restore that dropped the buckets fails).
fn buckets_survive_a_restore(name: &str, dir: &Path, ops: i64) -> Result<(), Failed> {
    let first = saved_buckets(dir)?;
    // A fresh bucket is full, 100 ms of the rate (docs/CLI.md: `refill=`), with no fraction.
    let size = ops / 10;
    let (budget, frac) = (
        first["ops"]["budget"].as_i64(),
        first["ops"]["frac"].as_u64(),
    );
    let (Some(budget), Some(frac)) = (budget, frac) else {
        return Err(format!("no ops bucket saved: {first}").into());
    };
    if budget >= size && frac == 0 {
        return Err(format!(
            "the guest's requests left the ops bucket as a new one ({budget} of {size}): \
             nothing tells a restored bucket from a new one: {first}"
        )
        .into());
    }
    let lull = ApiLull::from(start_api_server(&format!("{name}-again"), &[])?);
    lull.put(
        "vm.restore",
        &format!(r#"{{"source_url": "file://{}"}}"#, dir.display()),
    )?;
    let again = lull.snapshot_into(&format!("{name}-again-snapshot"))?;
    lull.shutdown(API_STOP)?;
    let second = saved_buckets(&again)?;
    let _ = std::fs::remove_dir_all(&again);
    for bucket in ["bytes", "ops"] {
        for field in ["budget", "burst", "frac"] {
            if first[bucket][field] != second[bucket][field] {
                return Err(format!(
                    "the restored limiter's {bucket} {field} is {}, the snapshot's {}: \
                     saved {first}, restored and saved again {second}",
                    second[bucket][field], first[bucket][field]
                )
                .into());
            }
        }
    }
    Ok(())
}

/// What `lull run --restore DIR` refuses before it builds anything (status 4, the reason
/// named): a VM flag besides `--metrics` (the VM is the snapshot's), and a `--metrics` that is
/// one of the snapshot's files, which it would overwrite: the file is left as it was.
fn restore_refuses_flags_and_clashes(dir: &Path) -> Result<(), Failed> {
    let memory = snapshot_file(dir, "/memory_file")?;
    let cases = [
        (
            ["--cpus".to_string(), "4".to_string()],
            "--cpus cannot be given with --restore".to_string(),
        ),
        (
            ["--metrics".to_string(), memory.display().to_string()],
            format!(
                "--metrics {} is the same file as --restore",
                memory.display()
            ),
        ),
    ];
    let before = std::fs::read(&memory).map_err(|e| format!("{}: {e}", memory.display()))?;
    let dir_arg = dir.display().to_string();
    for (flags, message) in &cases {
        let mut args = vec!["run", "--restore", &dir_arg, "--resume"];
        args.extend(flags.iter().map(String::as_str));
        let r = run_lull(&args, Duration::from_secs(60))?;
        if r.code()? != BAD_INPUT || !r.stderr.contains(message.as_str()) {
            return Err(r.failure(&format!("{flags:?}: want status 4 and {message:?}")));
        }
    }
    let after = std::fs::read(&memory).map_err(|e| format!("{}: {e}", memory.display()))?;
    if after != before {
        return Err("a refused --metrics changed the snapshot's memory file".into());
    }
    Ok(())
}

/// The whole case: snapshot after the flush, the refusals of [`restore_refuses_flags_and_clashes`],
/// restore into a new lull, the guest reads back and passes; then the missing-tap refusal on
/// the same snapshot.
fn blk_survives_a_restore(index: usize, irqchip: &str, options: &str) -> Result<(), Failed> {
    let name = format!("snapdev-{index}-{irqchip}");
    let image = temp_path(&format!("{name}.img"));
    let serial = temp_path(&format!("{name}.serial"));
    let _ = std::fs::remove_file(&serial);
    std::fs::write(&image, vec![0u8; SECTORS * 512]).map_err(|e| e.to_string())?;
    let disk = format!("path={}{options}", image.display());
    let first_metrics = temp_path(&format!("{name}-first.json"));
    let dir = snapshot_after_flush(&name, irqchip, &disk, &image, &serial, &first_metrics)?;
    let first_report =
        std::fs::read(&first_metrics).map_err(|e| format!("first run's report: {e}"))?;
    if let Some(ops) = options.strip_prefix(",ops=") {
        buckets_survive_a_restore(&name, &dir, ops.parse().map_err(|_| "ops is not a number")?)?;
    }
    restore_refuses_flags_and_clashes(&dir)?;
    let dir_arg = dir.display().to_string();
    let run = run_restored(&dir, &serial, Duration::from_secs(120))?;
    let text = std::fs::read_to_string(&serial).unwrap_or_default();
    let fail = |what: &str| run.failure(&format!("{what}; console:\n{text}"));
    run.expect_code(GUEST_PASS)
        .map_err(|_| fail("the restored guest did not pass"))?;
    for line in ["read back after the snapshot", "virtio-blk: PASS"] {
        if !text.contains(line) {
            return Err(fail(&format!("no {line:?}")));
        }
    }
    // The console file is appended to: the first run's lines, then the restored run's.
    if text.matches("waiting for a snapshot").count() != 1 {
        return Err(fail("the restored run booted the guest again"));
    }
    check_sectors(&image, SNAP_SECTORS)?;
    check_sectors(&image, 0..16)?;
    // The saving run's --metrics is its own output: the restored run, given none, leaves it.
    if std::fs::read(&first_metrics).ok().as_ref() != Some(&first_report) {
        return Err(fail(
            "the restored run wrote over the saving run's --metrics file",
        ));
    }
    let _ = std::fs::remove_file(&first_metrics);

    // The manifest edited to name a tap this host does not have.
    let manifest = dir.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?,
    )
    .map_err(|e| e.to_string())?;
    m["config"]["nets"] = serde_json::json!(["tap=lullnotap9"]);
    std::fs::write(&manifest, m.to_string()).map_err(|e| e.to_string())?;
    let refused = run_lull(
        &["run", "--restore", &dir_arg, "--resume"],
        Duration::from_secs(60),
    )?;
    refused.expect_code(BAD_INPUT)?;
    if !refused.stderr.contains("tap lullnotap9 does not exist") {
        return Err(refused.failure("the refusal does not name the missing tap"));
    }
    // Through the API: 500 with the reason, and the lull has no VM.
    let lull = ApiLull::from(start_api_server(&format!("{name}-refused"), &[])?);
    let socket = lull.socket();
    let body = format!(r#"{{"source_url": "file://{}"}}"#, dir.display());
    let (status, text) = api_call(socket, "PUT", "vm.restore", &body)?;
    if status != 500 || !text.contains("tap lullnotap9 does not exist") {
        return Err(format!("vm.restore naming a missing tap: status {status}: {text}").into());
    }
    let (status, text) = api_call(socket, "GET", "vm.info", "")?;
    if status != 404 {
        return Err(format!("vm.info after a refused restore: status {status}: {text}").into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&image);
    let _ = std::fs::remove_file(&serial);
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = CASES
        .iter()
        .enumerate()
        .map(|(index, &(irqchip, options))| {
            let limited = if options.is_empty() {
                ""
            } else {
                "_rate_limited"
            };
            kvm_trial(
                &format!("virtio_blk_reads_back_after_restore_{irqchip}{limited}"),
                move || blk_survives_a_restore(index, irqchip, options),
            )
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
