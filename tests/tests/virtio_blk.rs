//! Integration tests: virtio-blk over MMIO (`--disk`), driven by the kit's `virtio-blk` guest
//! (resources/guests/src/virtio-blk.c) under both irqchips, and the disk image files checked
//! from the host after lull has exited: after the guest's own exit, and after SIGTERM while
//! the guest sits halted right after writes it never flushed.
//!
//! The kit's Linux (its own virtio-mmio and virtio-blk drivers) mounts an ext4 root, built by
//! the test with `mkfs.ext4 -d`, from a `--disk`, runs its in-kernel workload on it, and the
//! host checks the image afterwards (superblock mount count, `e2fsck`).
//!
//! A rate-limited disk (`bandwidth=`) under the guest's timed write loop stays within its limit
//! under both irqchips, its refills as global timers (user) or timerfds (kernel).
//!
//! Tests that boot need `/dev/kvm`; where it is missing they are reported as ignored with the
//! reason, never as passed. The bad-`--disk` tests need no KVM (lull refuses before it).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lull_schema::RunReport;
use lull_tests::exit_status::{BAD_INPUT, USER_STOP};
use lull_tests::{
    kit_file, kvm_trial, linux_cmdline, lull_bin, run_lull, temp_path, Arguments, Failed,
    RunResult, Trial,
};

const DEADLINE: Duration = Duration::from_secs(60);
/// The tiny Linux kernel needs ~0.5-3 minutes to reach its root on a PVM host; allow 10.
const LINUX_DEADLINE: Duration = Duration::from_secs(600);
/// Where ext4 keeps the superblock's mount count: superblock at 1024, `s_mnt_count` at 0x34.
const EXT4_MOUNT_COUNT: usize = 1024 + 0x34;
/// Sectors of the writable image (the guest needs at least 536).
const SECTORS: usize = 2048;
/// What the read-only image holds (and must still hold after the guest tried to write).
const RO_FILL: u8 = 0xa5;

/// Byte `i` of sector `s` as the guest writes it (its `pattern()`).
fn pattern(sector: usize, i: usize) -> u8 {
    ((sector * 131 + i) ^ 0x5a).to_le_bytes()[0]
}

/// Fails unless `sectors` of `image` hold the guest's pattern and every other sector is zero.
fn check_image(image: &Path, sectors: &[usize]) -> Result<(), Failed> {
    let data = std::fs::read(image).map_err(|e| format!("{}: {e}", image.display()))?;
    if data.len() != SECTORS * 512 {
        return Err(format!("the image is {} bytes, not {}", data.len(), SECTORS * 512).into());
    }
    for (s, sector) in data.chunks(512).enumerate() {
        let written = sectors.contains(&s);
        for (i, &byte) in sector.iter().enumerate() {
            let want = if written { pattern(s, i) } else { 0 };
            if byte != want {
                return Err(format!(
                    "{}: sector {s} byte {i} is {byte:#x}, expected {want:#x}",
                    image.display()
                )
                .into());
            }
        }
    }
    Ok(())
}

/// A fresh image of `bytes` filled with `fill`, named for the test.
fn image(name: &str, bytes: usize, fill: u8) -> Result<PathBuf, Failed> {
    let path = temp_path(name);
    std::fs::write(&path, vec![fill; bytes]).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// What the guest prints for GET_ID: the image's file name, cut to 20 bytes.
fn expected_id(image: &Path) -> String {
    let name = image
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.chars().take(20).collect()
}

fn disk_arg(path: &Path, readonly: bool) -> String {
    let ro = if readonly { ",readonly=on" } else { "" };
    format!("path={}{ro}", path.display())
}

/// `lull run --irqchip IRQCHIP --kernel KERNEL EXTRA...` until it exits or `deadline`.
fn run_guest(
    irqchip: &str,
    kernel: &Path,
    extra: &[&str],
    deadline: Duration,
) -> Result<RunResult, Failed> {
    let kernel = kernel.display().to_string();
    let mut args = vec!["run", "--irqchip", irqchip, "--kernel", &kernel];
    args.extend_from_slice(extra);
    run_lull(&args, deadline)
}

/// The guest's checks on a writable and a read-only disk; then the images from the host.
fn guest_passes(irqchip: &'static str) -> Result<(), Failed> {
    let kernel = kit_file("guests/virtio-blk.elf")?;
    let rw = image(&format!("rw-{irqchip}.img"), SECTORS * 512, 0)?;
    let ro = image(&format!("ro-{irqchip}.img"), 64 << 10, RO_FILL)?;
    let disks = [disk_arg(&rw, false), disk_arg(&ro, true)];
    let r = run_guest(
        irqchip,
        &kernel,
        &["--disk", &disks[0], "--disk", &disks[1]],
        DEADLINE,
    )?;
    let result = (|| {
        r.expect_stdout("virtio-blk: PASS")?;
        r.expect_code(1)?;
        let id_line = format!("virtio-blk: id {}", expected_id(&rw));
        if !r.stdout.lines().any(|l| l.trim_end() == id_line) {
            return Err(r.failure(&format!("no line {id_line:?}")));
        }
        let mut written: Vec<usize> = (0..16).collect();
        written.push(SECTORS - 1);
        check_image(&rw, &written)?;
        let ro_data = std::fs::read(&ro).map_err(|e| format!("{}: {e}", ro.display()))?;
        if ro_data.iter().any(|b| *b != RO_FILL) {
            return Err(r.failure("the read-only image changed"));
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&rw);
    let _ = std::fs::remove_file(&ro);
    result
}

/// SIGTERM while the guest is halted after writes it did not flush: the data is in the file
/// once lull has exited.
fn writes_survive_sigterm(irqchip: &'static str) -> Result<(), Failed> {
    let kernel = kit_file("guests/virtio-blk.elf")?;
    let rw = image(&format!("sigterm-{irqchip}.img"), SECTORS * 512, 0)?;
    let result = run_until_idle_then_term(irqchip, &kernel, &rw).and_then(|()| {
        let mut written: Vec<usize> = (0..24).collect();
        written.push(SECTORS - 1);
        check_image(&rw, &written)
    });
    let _ = std::fs::remove_file(&rw);
    result
}

fn run_until_idle_then_term(irqchip: &str, kernel: &Path, rw: &Path) -> Result<(), Failed> {
    let mut child = Command::new(lull_bin())
        .args(["run", "--irqchip", irqchip, "--kernel"])
        .arg(kernel)
        .args(["--cmdline", "idle=1", "--disk", &disk_arg(rw, false)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start lull: {e}"))?;
    let pid = child.id().to_string();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("virtio-blk: idle after writes") {
                let _ = tx.send(());
            }
            lines.push(line);
        }
        lines
    });
    let idle = rx.recv_timeout(DEADLINE).is_ok();
    let signal = if idle { "-TERM" } else { "-KILL" };
    let _ = Command::new("kill").args([signal, &pid]).status();
    let status = child.wait().map_err(|e| format!("waiting for lull: {e}"))?;
    let lines = reader.join().unwrap_or_default().join("\n");
    if !idle {
        return Err(format!("the guest never reported its idle state:\n{lines}").into());
    }
    match status.code() {
        Some(USER_STOP) => Ok(()),
        other => {
            Err(format!("lull exited {other:?} after SIGTERM, want {USER_STOP}:\n{lines}").into())
        }
    }
}

/// The ext4 mount count of `image`.
fn mount_count(image: &Path) -> Result<u16, Failed> {
    let data = std::fs::read(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let bytes = data
        .get(EXT4_MOUNT_COUNT..EXT4_MOUNT_COUNT + 2)
        .ok_or("the image has no ext4 superblock")?;
    Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
}

/// Runs an e2fsprogs tool (`mkfs.ext4`, `e2fsck`) and fails with its output unless it succeeds.
fn e2fs(tool: &str, args: &[&std::ffi::OsStr]) -> Result<(), Failed> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {tool} (e2fsprogs): {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{tool} {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .into())
}

/// A fresh 32 MiB ext4 image at `root` holding the root directory the kit's Linux needs when
/// its in-kernel workload runs in place of init: `/dev`, where the kernel mounts devtmpfs.
fn make_root_image(root: &Path) -> Result<(), Failed> {
    let tree = root.with_extension("d");
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(tree.join("dev")).map_err(|e| format!("{}: {e}", tree.display()))?;
    let _ = std::fs::remove_file(root);
    let result = e2fs(
        "mkfs.ext4",
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-L".as_ref(),
            "lullroot".as_ref(),
            "-d".as_ref(),
            tree.as_os_str(),
            root.as_os_str(),
            "32M".as_ref(),
        ],
    );
    let _ = std::fs::remove_dir_all(&tree);
    result
}

/// The kit's Linux mounts an ext4 root from virtio-blk: its driver finds the device on the
/// command line lull extends and reads the capacity, the kernel mounts `/dev/vda` read-write
/// (writing the superblock) and devtmpfs on its `/dev` (a directory lookup on the disk), and
/// the in-kernel workload runs on that root and PASSes. The image afterwards: mount count up
/// by one, and `e2fsck -fn` finds it consistent (the workload ends the VM without unmounting,
/// so what the kernel wrote must already be in the file).
fn linux_mounts_an_ext4_root(irqchip: &'static str) -> Result<(), Failed> {
    let kernel = kit_file("linux/vmlinux")?;
    let root = temp_path(&format!("root-{irqchip}.ext4"));
    let result = make_root_image(&root).and_then(|()| {
        let before = mount_count(&root)?;
        let cmdline = linux_cmdline("root=/dev/vda rw lull.workload=idle,seconds=2,cpus=1")?;
        let disk = disk_arg(&root, false);
        let extra = [
            "--cmdline",
            &cmdline,
            "--disk",
            &disk,
            "--cpus",
            "1",
            "--memory",
            "64M",
        ];
        let r = run_guest(irqchip, &kernel, &extra, LINUX_DEADLINE)?;
        r.expect_stdout("virtio_blk virtio0: [vda] 65536 512-byte logical blocks")?;
        r.expect_stdout("EXT4-fs (vda): mounted filesystem")?;
        r.expect_stdout("VFS: Mounted root (ext4 filesystem)")?;
        r.expect_stdout("devtmpfs: mounted")?;
        r.expect_stdout("lull-workload: PASS")?;
        // The workload writes 0 to port 0xf4 on PASS: status (0 << 1) | 1.
        r.expect_code(1)?;
        let after = mount_count(&root)?;
        if after != before + 1 {
            return Err(r.failure(&format!(
                "the superblock's mount count went from {before} to {after}, not up by one"
            )));
        }
        e2fs("e2fsck", &["-f".as_ref(), "-n".as_ref(), root.as_os_str()])
    });
    let _ = std::fs::remove_file(&root);
    result
}

/// A `--disk` lull cannot use is refused before any guest runs, with a message that says why.
/// `--disk ...,bandwidth=` the limiter's rate, in bytes a second (400 KiB).
const RATE: u64 = 400 << 10;
/// The bandwidth bucket: 100 ms of the rate (the default `refill=`).
const BUCKET: u64 = RATE / 10;

/// A rate-limited disk under the guest's timed write loop (`rate_ms`, every request waited
/// for halted) with two vCPUs, the AP spinning: the guest never gets more than the rate over
/// its loop plus the bucket and one request (the safe direction: no timing upper bound), gets
/// something (no starvation), and every request the limiter held back got its refill timer.
/// In `pull` the refills are global timers that the spinning AP expires; with
/// `--irqchip kernel` they are timerfds on the VMM thread.
fn rate_limit_holds(irqchip: &'static str) -> Result<(), Failed> {
    let kernel = kit_file("guests/virtio-blk.elf")?;
    let rw = image(&format!("rate-{irqchip}.img"), SECTORS * 512, 0)?;
    let metrics = temp_path(&format!("rate-{irqchip}.json"));
    let disk = format!("{},bandwidth={RATE}", disk_arg(&rw, false));
    let metrics_arg = metrics.display().to_string();
    let r = run_guest(
        irqchip,
        &kernel,
        &[
            "--cpus",
            "2",
            "--disk",
            &disk,
            "--cmdline",
            "rate_ms=1000 ap=spin",
            "--metrics",
            &metrics_arg,
        ],
        DEADLINE,
    );
    let _ = std::fs::remove_file(&rw);
    let r = r?;
    let report = lull_tests::take_metrics(&metrics)?;
    r.expect_stdout("virtio-blk: PASS")?;
    r.expect_code(1)?;
    rate_within_limit(&r)?;
    refills_all_fired(&r, &report, irqchip)?;
    Ok(())
}

/// The guest's rate line: no more than the rate over its loop plus the bucket and one
/// request, and something (no starvation).
fn rate_within_limit(r: &RunResult) -> Result<(), Failed> {
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("virtio-blk: rate "))
        .ok_or_else(|| r.failure("no rate line"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| -> Result<u64, Failed> {
        let w = words.get(i).ok_or_else(|| r.failure("short rate line"))?;
        w.parse()
            .map_err(|_| r.failure(&format!("{w:?} in the rate line")))
    };
    // "virtio-blk: rate <bytes> bytes in <ns> ns, ..."
    let (bytes, ns) = (number(2)?, number(5)?);
    let allowed = RATE * ns / 1_000_000_000 + BUCKET + 4096;
    if bytes > allowed {
        return Err(r.failure(&format!(
            "{bytes} bytes in {ns} ns: more than the {allowed} the limit allows"
        )));
    }
    if bytes < 4 * 4096 {
        return Err(r.failure(&format!("only {bytes} bytes in {ns} ns: starved")));
    }
    Ok(())
}

/// Every request the limiter held back got its refill timer, of the irqchip's mode; in
/// `pull` (`user`) none woke a halted vCPU.
fn refills_all_fired(r: &RunResult, report: &RunReport, irqchip: &str) -> Result<(), Failed> {
    let timers = report.device_timers.as_ref();
    let device = timers.and_then(|t| t.devices.first());
    let (requested, fired) = (device.map(|d| d.requested), device.map(|d| d.fired));
    let want_mode = if irqchip == "user" {
        "hierarchy"
    } else {
        "timerfd"
    };
    if timers.map(|t| t.mode.as_str()) != Some(want_mode)
        || requested.is_none_or(|n| n == 0)
        || requested != fired
    {
        return Err(r.failure(&format!(
            "device timers: {timers:?} (want mode {want_mode}, refills asked for and all fired)"
        )));
    }
    if irqchip == "user" {
        // Structural, not a rate: every refill is asked for by a request the BSP then waits
        // for, and completes before the BSP ends the loop, all while the AP spins (started
        // before the first request, stopped after the last completion). An active vCPU is the
        // hierarchy's migrator however late the host runs it, so no refill can fall to a
        // halted vCPU (that all refills fired was checked above).
        let woken: u64 = report
            .vcpus
            .iter()
            .take(2)
            .map(|v| v.wakeups.global_timer)
            .sum();
        if woken != 0 {
            return Err(r.failure(&format!(
                "{woken} wake-up(s) of a halted vCPU by a device timer while the AP ran"
            )));
        }
    }
    Ok(())
}

fn bad_disks_are_refused() -> Result<(), Failed> {
    let odd = image("odd.img", 1000, 0)?;
    let cases = [
        (
            "path=/nonexistent/lull-disk.img".to_string(),
            "Cannot open disk image",
        ),
        (disk_arg(&odd, false), "multiple of 512"),
        ("readonly=on".to_string(), "is not a disk"),
        (
            format!("{},bandwidth=fast", disk_arg(&odd, false)),
            "is not a size",
        ),
    ];
    let mut result = Ok(());
    for (arg, message) in &cases {
        let r: RunResult = run_lull(&["run", "--disk", arg], DEADLINE)?;
        let expected_code = if arg.starts_with("path=") && !arg.contains("bandwidth") {
            BAD_INPUT
        } else {
            2
        };
        if r.code()? != expected_code || !r.stderr.contains(message) {
            result = Err(r.failure(&format!(
                "--disk {arg}: want exit {expected_code} and {message:?} on stderr"
            )));
            break;
        }
    }
    let _ = std::fs::remove_file(&odd);
    result
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = vec![Trial::test("bad_disks_are_refused", bad_disks_are_refused)];
    for irqchip in ["user", "kernel"] {
        trials.push(kvm_trial(&format!("guest_passes_{irqchip}"), move || {
            guest_passes(irqchip)
        }));
        trials.push(kvm_trial(
            &format!("writes_survive_sigterm_{irqchip}"),
            move || writes_survive_sigterm(irqchip),
        ));
        trials.push(kvm_trial(
            &format!("rate_limit_holds_{irqchip}"),
            move || rate_limit_holds(irqchip),
        ));
    }
    // Two Linux boots (~30-60 s of a core each here), one per irqchip.
    for irqchip in ["user", "kernel"] {
        trials.push(kvm_trial(
            &format!("linux_mounts_an_ext4_root_{irqchip}"),
            move || linux_mounts_an_ext4_root(irqchip),
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
