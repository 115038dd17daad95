//! No file lull writes can be turned against the host, and a crafted snapshot cannot hang it
//! (issue 45). Each case fails on a lull that follows links, trusts a snapshot's paths or
//! overwrites a snapshot in place:
//!
//! - `vm.snapshot` into a directory where `manifest.json`, `memory` and the state files'
//!   former names are links to a file of the host, and where the VM's own kernel sits under
//!   the name `memory` (a hard link): neither is written, and the snapshot restores.
//! - `vm.snapshot` over a snapshot whose memory file a VM restored from it maps (the test holds
//!   `LOCK_SH` on it, as such a VM does): refused with the reason, the directory unchanged.
//! - A lull killed (SIGXFSZ: its file size limit) while writing a snapshot over an older one:
//!   the older snapshot still restores and its guest passes.
//! - A snapshot whose manifest names a console file: the restore does not create it (a restore
//!   writes only where its caller says); one whose memory regions overlap: refused by name;
//!   one whose kernel or disk is a FIFO: refused at once.
//! - A `manifest.json` that is a FIFO: `lull run --restore` and `vm.restore` refuse it at
//!   once, and the API keeps answering.
//! - `lull ch --log-file` naming the kernel, the `--serial file=` or a `--disk` image: refused
//!   before anything is written; a log file that is a link is not followed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lull_tests::exit_status::{API_STOP, BAD_INPUT, GUEST_PASS};
use lull_tests::{
    api_call, kit_file, kvm_trial, read_json, run_lull, run_restored, snapshot_file,
    start_api_server, start_api_server_in, temp_path, wait_for_console, ApiLull, Arguments, Failed,
    Trial,
};

/// Timers per phase of `pause-timers`: it runs ~3 x N x 10 ms, long enough to be paused
/// while it runs, short enough to finish soon after a restore.
const COUNT: u32 = 100;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Failed + '_ {
    move |e| format!("{}: {e}", path.display()).into()
}

/// A copy of the `pause-timers` guest in a temp file named after `name` (so that a test may
/// link it and see whether lull wrote it).
fn own_kernel(name: &str) -> Result<PathBuf, Failed> {
    let kernel = temp_path(&format!("{name}.elf"));
    let _ = std::fs::remove_file(&kernel);
    let kit = kit_file("guests/pause-timers.elf")?;
    std::fs::copy(&kit, &kernel).map_err(io(&kernel))?;
    Ok(kernel)
}

/// A lull serving its API with `pause-timers` (kernel `kernel`) booted and paused while it
/// runs; its console file. `wrapper` runs lull under a command (`sh -c 'ulimit ...'`).
fn paused_guest(name: &str, kernel: &Path, wrapper: &[&str]) -> Result<(ApiLull, PathBuf), Failed> {
    let serial = temp_path(&format!("{name}.serial"));
    let _ = std::fs::remove_file(&serial);
    let serial_flag = format!("file={}", serial.display());
    let cmdline = format!("count={COUNT} ns=10000000 spread_ns=1000000");
    let kernel = kernel.display().to_string();
    let args = [
        "--kernel",
        &kernel,
        "--memory",
        "64M",
        "--cmdline",
        &cmdline,
        "--serial",
        &serial_flag,
    ];
    let lull = ApiLull::from(start_api_server_in(wrapper, name, &args)?);
    lull.put("vm.boot", "")?;
    wait_for_console(
        &serial,
        "pause-timers: running",
        &[],
        Duration::from_secs(60),
    )?;
    lull.put("vm.pause", "")?;
    Ok((lull, serial))
}

/// `vm.snapshot` into `dir`: the status and the body.
fn snapshot(lull: &ApiLull, dir: &Path) -> Result<(u16, String), Failed> {
    let body = format!(r#"{{"destination_url": "file://{}"}}"#, dir.display());
    api_call(lull.socket(), "PUT", "vm.snapshot", &body)
}

/// A fresh directory at the temp path `name`.
fn fresh_dir(name: &str) -> Result<PathBuf, Failed> {
    let dir = temp_path(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    Ok(dir)
}

/// Fails unless `lull run --restore DIR --resume` runs the guest to its PASS, its console at
/// `serial` (given again: a restore does not reuse the snapshot's).
fn restores_and_passes(dir: &Path, serial: &Path) -> Result<(), Failed> {
    let _ = std::fs::remove_file(serial);
    let run = run_restored(dir, serial, Duration::from_secs(120))?;
    let text = std::fs::read_to_string(serial).unwrap_or_default();
    if run.code()? != GUEST_PASS || !text.contains("pause-timers: PASS") {
        return Err(run.failure(&format!("the restored guest did not pass:\n{text}")));
    }
    Ok(())
}

/// The names in `dir` with each file's content, sorted.
fn contents(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, Failed> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        all.push((
            name.unwrap_or_default(),
            std::fs::read(&path).map_err(io(&path))?,
        ));
    }
    all.sort();
    Ok(all)
}

/// Links planted in the destination (`manifest.json`, `memory` and the state files' former
/// names, to a victim file) and the
/// VM's own kernel hard-linked there as `memory`: nothing of theirs is written, and each
/// snapshot restores.
fn snapshot_writes_through_no_link_and_over_no_input() -> Result<(), Failed> {
    let name = "opfiles-links";
    let kernel = own_kernel(name)?;
    let kernel_bytes = std::fs::read(&kernel).map_err(io(&kernel))?;
    let (lull, serial) = paused_guest(name, &kernel, &[])?;
    let victim = temp_path(&format!("{name}.victim"));
    std::fs::write(&victim, b"a host file").map_err(io(&victim))?;
    let linked = fresh_dir(&format!("{name}-linked"))?;
    let planted_names = [
        "manifest.json",
        "memory",
        "vcpu-0.json",
        "kvm-vm.json",
        "devices.json",
    ];
    for planted in planted_names {
        std::os::unix::fs::symlink(&victim, linked.join(planted)).map_err(io(&linked))?;
    }
    let (status, text) = snapshot(&lull, &linked)?;
    if status != 204 {
        return Err(format!("vm.snapshot beside planted links: {status} {text}").into());
    }
    let own = fresh_dir(&format!("{name}-own"))?;
    std::fs::hard_link(&kernel, own.join("memory")).map_err(io(&own))?;
    let (status, text) = snapshot(&lull, &own)?;
    if status != 204 {
        return Err(format!("vm.snapshot beside the VM's kernel: {status} {text}").into());
    }
    lull.shutdown(API_STOP)?;
    if std::fs::read(&victim).map_err(io(&victim))? != b"a host file" {
        return Err("vm.snapshot wrote through a link planted in its destination".into());
    }
    if std::fs::read(&kernel).map_err(io(&kernel))? != kernel_bytes {
        return Err("vm.snapshot overwrote the VM's own kernel".into());
    }
    restores_and_passes(&linked, &serial)?;
    restores_and_passes(&own, &serial)?;
    for path in [&kernel, &victim, &serial] {
        let _ = std::fs::remove_file(path);
    }
    let _ = std::fs::remove_dir_all(&linked);
    let _ = std::fs::remove_dir_all(&own);
    Ok(())
}

/// A snapshot whose memory file is locked shared (by a VM restored from it: here the test)
/// is not replaced; once the lock is gone, it is, and its old files go.
fn a_mapped_snapshot_is_not_replaced() -> Result<(), Failed> {
    use nix::fcntl::{Flock, FlockArg};
    let name = "opfiles-mapped";
    let kernel = own_kernel(name)?;
    let (lull, serial) = paused_guest(name, &kernel, &[])?;
    let dir = fresh_dir(&format!("{name}-snapshot"))?;
    let (status, text) = snapshot(&lull, &dir)?;
    if status != 204 {
        return Err(format!("the first vm.snapshot: {status} {text}").into());
    }
    // (A lull before format 3 named it `memory`.)
    let memory = snapshot_file(&dir, "/memory_file").unwrap_or_else(|_| dir.join("memory"));
    let file = std::fs::File::open(&memory).map_err(io(&memory))?;
    let shared = Flock::lock(file, FlockArg::LockSharedNonblock)
        .map_err(|(_, e)| format!("LOCK_SH on {}: {e}", memory.display()))?;
    let before = contents(&dir)?;
    let (status, text) = snapshot(&lull, &dir)?;
    if status != 500 || !text.contains("mapped by a running VM restored from it") {
        return Err(format!("vm.snapshot over a mapped snapshot: {status} {text}").into());
    }
    if contents(&dir)? != before {
        return Err("a refused vm.snapshot changed the directory".into());
    }
    drop(shared);
    let (status, text) = snapshot(&lull, &dir)?;
    if status != 204 || memory.exists() {
        return Err(format!("vm.snapshot once unlocked: {status} {text}").into());
    }
    lull.shutdown(API_STOP)?;
    restores_and_passes(&dir, &serial)?;
    let _ = std::fs::remove_file(&kernel);
    let _ = std::fs::remove_file(&serial);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A lull killed halfway through writing a snapshot over an older one (its file size limit is
/// below the memory file's size: SIGXFSZ) leaves the older snapshot whole: it restores.
fn a_snapshot_killed_halfway_leaves_the_old_one() -> Result<(), Failed> {
    let name = "opfiles-killed";
    let kernel = own_kernel(name)?;
    let (first, serial) = paused_guest(name, &kernel, &[])?;
    let dir = fresh_dir(&format!("{name}-snapshot"))?;
    let (status, text) = snapshot(&first, &dir)?;
    if status != 204 {
        return Err(format!("the first vm.snapshot: {status} {text}").into());
    }
    first.shutdown(API_STOP)?;
    // The second lull may write files of at most 2 MiB (the state files), not 64 MiB of memory.
    let limited = ["sh", "-c", "ulimit -f 2048; exec \"$0\" \"$@\""];
    let (second, second_serial) = paused_guest(&format!("{name}-2"), &kernel, &limited)?;
    let second_manifest = snapshot(&second, &dir);
    drop(second);
    if let Ok((204, _)) = second_manifest {
        return Err("the size-limited lull wrote its snapshot: the test proves nothing".into());
    }
    state_files_match(&dir)?;
    restores_and_passes(&dir, &serial)?;
    for path in [&kernel, &serial, &second_serial] {
        let _ = std::fs::remove_file(path);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Fails unless every state file the manifest in `dir` names has the size and checksum the
/// manifest gives it (what a half-written snapshot beside an old manifest breaks).
fn state_files_match(dir: &Path) -> Result<(), Failed> {
    let manifest = read_json(&dir.join("manifest.json"))?;
    let vcpus = manifest["vcpus"].as_array().cloned().unwrap_or_default();
    let entries = vcpus
        .iter()
        .chain([&manifest["kvm_vm"], &manifest["devices"]]);
    for entry in entries {
        let name = entry["file"]
            .as_str()
            .ok_or("a state file without a name")?;
        let path = dir.join(name);
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let fits = entry["bytes"].as_u64() == u64::try_from(bytes.len()).ok()
            && entry["fnv64"].as_u64() == Some(vmm::snapshot::fnv64(&bytes));
        if !fits {
            return Err(
                format!("{name} is not the file the manifest names: a mixed snapshot").into(),
            );
        }
    }
    Ok(())
}

/// A manifest that names a console file the restore's caller did not: not created; memory
/// regions that overlap (adding up to the memory size): refused by name, status 4; a kernel
/// or a disk that is a FIFO: refused at once, status 4.
fn a_restore_trusts_no_path_or_layout_of_the_snapshot() -> Result<(), Failed> {
    let name = "opfiles-trust";
    let kernel = own_kernel(name)?;
    let (lull, serial) = paused_guest(name, &kernel, &[])?;
    let dir = fresh_dir(&format!("{name}-snapshot"))?;
    let (status, text) = snapshot(&lull, &dir)?;
    if status != 204 {
        return Err(format!("vm.snapshot: {status} {text}").into());
    }
    lull.shutdown(API_STOP)?;
    let manifest_path = dir.join("manifest.json");
    let original = std::fs::read(&manifest_path).map_err(io(&manifest_path))?;
    let planted = temp_path(&format!("{name}.planted"));
    let _ = std::fs::remove_file(&planted);
    let mut manifest = read_json(&manifest_path)?;
    manifest["config"]["serial"] = format!("file={}", planted.display()).into();
    std::fs::write(&manifest_path, manifest.to_string()).map_err(io(&manifest_path))?;
    let dir_arg = dir.display().to_string();
    let run = run_lull(
        &["run", "--restore", &dir_arg, "--resume"],
        Duration::from_secs(120),
    )?;
    run.expect_code(GUEST_PASS)?;
    if planted.exists() {
        return Err(run.failure("the restore created the console file its manifest named"));
    }
    // Nor anywhere else unasked: the console is off unless the caller gives one.
    if run.stdout.contains("pause-timers") {
        return Err(run.failure("the console of a restore given no --serial was not off"));
    }

    let mut manifest: serde_json::Value =
        serde_json::from_slice(&original).map_err(|e| e.to_string())?;
    let bytes = manifest["memory_bytes"].as_u64().ok_or("no memory_bytes")?;
    manifest["regions"] = serde_json::json!([
        {"guest_addr": 0, "bytes": bytes / 2},
        {"guest_addr": 0, "bytes": bytes / 2},
    ]);
    std::fs::write(&manifest_path, manifest.to_string()).map_err(io(&manifest_path))?;
    let run = run_lull(
        &["run", "--restore", &dir_arg, "--resume"],
        Duration::from_secs(60),
    )?;
    if run.code()? != BAD_INPUT || !run.stderr.contains("regions are not the layout") {
        return Err(run.failure("overlapping regions: want status 4, named"));
    }

    // A kernel or a disk that is a FIFO nobody writes: refused at once, not waited on.
    let fifo = temp_path(&format!("{name}.fifo"));
    let _ = std::fs::remove_file(&fifo);
    mkfifo(&fifo)?;
    let fifo_arg = fifo.display().to_string();
    let as_kernel = |m: &mut serde_json::Value| m["config"]["kernel"] = fifo_arg.clone().into();
    let as_disk = |m: &mut serde_json::Value| {
        m["config"]["disks"] = serde_json::json!([format!("path={fifo_arg},readonly=on")]);
        m["disks"] = serde_json::json!([{"path": fifo_arg, "bytes": 0}]);
    };
    for (what, change) in [
        ("kernel", &as_kernel as &dyn Fn(&mut serde_json::Value)),
        ("disk", &as_disk),
    ] {
        let mut manifest: serde_json::Value =
            serde_json::from_slice(&original).map_err(|e| e.to_string())?;
        change(&mut manifest);
        std::fs::write(&manifest_path, manifest.to_string()).map_err(io(&manifest_path))?;
        let run = run_lull(
            &["run", "--restore", &dir_arg, "--resume"],
            Duration::from_secs(20),
        )?;
        if run.code()? != BAD_INPUT || !run.stderr.contains("not a regular file") {
            return Err(run.failure(&format!("a FIFO {what}: want status 4 at once, named")));
        }
    }
    let _ = std::fs::remove_file(&fifo);
    let _ = std::fs::remove_file(&kernel);
    let _ = std::fs::remove_file(&serial);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) -> Result<(), Failed> {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU)
        .map_err(|e| format!("mkfifo {}: {e}", path.display()).into())
}

/// A `manifest.json` that is a FIFO nobody writes: `lull run --restore` refuses it at once
/// (status 4), and so does `vm.restore`, after which the API still answers.
fn a_fifo_manifest_is_refused_at_once() -> Result<(), Failed> {
    let dir = fresh_dir("opfiles-fifo")?;
    mkfifo(&dir.join("manifest.json"))?;
    let dir_arg = dir.display().to_string();
    let run = run_lull(
        &["run", "--restore", &dir_arg, "--resume"],
        Duration::from_secs(20),
    )?;
    if run.code()? != BAD_INPUT || !run.stderr.contains("FIFO") {
        return Err(run.failure("a FIFO manifest: want status 4 at once, named"));
    }
    let lull = ApiLull::from(start_api_server("opfiles-fifo", &[])?);
    let body = format!(r#"{{"source_url": "file://{dir_arg}"}}"#);
    let (tx, rx) = std::sync::mpsc::channel();
    let socket = lull.socket().to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(api_call(&socket, "PUT", "vm.restore", &body));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok((500, text))) if text.contains("FIFO") => {}
        Ok(answer) => return Err(format!("vm.restore of a FIFO manifest: {answer:?}").into()),
        Err(_) => return Err("vm.restore of a FIFO manifest did not answer in 20 s".into()),
    }
    let (status, _) = api_call(lull.socket(), "GET", "vmm.ping", "")?;
    if status != 200 {
        return Err(format!("vmm.ping after the refused restore: {status}").into());
    }
    lull.shutdown(0)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `lull ch --log-file` naming the kernel, the serial file or a disk image is refused (status
/// 4) and the file is left as it was; a log file that is a link is not followed.
fn log_file_clashes_are_refused() -> Result<(), Failed> {
    let name = "opfiles-log";
    let kernel = own_kernel(name)?;
    let kernel_bytes = std::fs::read(&kernel).map_err(io(&kernel))?;
    let other = temp_path(&format!("{name}.other"));
    std::fs::write(&other, b"other").map_err(io(&other))?;
    let link = temp_path(&format!("{name}.link"));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&other, &link).map_err(io(&link))?;
    let (k, o, l) = (
        kernel.display().to_string(),
        other.display().to_string(),
        link.display().to_string(),
    );
    let (serial, disk) = (format!("file={o}"), format!("path={o}"));
    let cmdline = format!("count={COUNT}");
    let cases: [(&[&str], &str); 4] = [
        (&["--log-file", &k], "--log-file"),
        (&["--log-file", &o, "--serial", &serial], "--log-file"),
        (&["--log-file", &o, "--disk", &disk], "--log-file"),
        (&["--log-file", &l], "symbolic link"),
    ];
    for (flags, named) in cases {
        let mut args = vec![
            "ch",
            "-v",
            "--kernel",
            &k,
            "--memory",
            "size=64M",
            "--cmdline",
        ];
        args.push(&cmdline);
        args.extend_from_slice(flags);
        let run = run_lull(&args, Duration::from_secs(60))?;
        if run.code()? != BAD_INPUT || !run.stderr.contains(named) {
            return Err(run.failure(&format!("{flags:?}: want status 4, naming {named}")));
        }
        let same = std::fs::read(&kernel).map_err(io(&kernel))? == kernel_bytes
            && std::fs::read(&other).map_err(io(&other))? == b"other";
        if !same {
            return Err(run.failure(&format!("{flags:?} changed a file")));
        }
    }
    for path in [&kernel, &other, &link] {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        kvm_trial(
            "snapshot_writes_through_no_link_and_over_no_input",
            snapshot_writes_through_no_link_and_over_no_input,
        ),
        kvm_trial(
            "a_mapped_snapshot_is_not_replaced",
            a_mapped_snapshot_is_not_replaced,
        ),
        kvm_trial(
            "a_snapshot_killed_halfway_leaves_the_old_one",
            a_snapshot_killed_halfway_leaves_the_old_one,
        ),
        kvm_trial(
            "a_restore_trusts_no_path_or_layout_of_the_snapshot",
            a_restore_trusts_no_path_or_layout_of_the_snapshot,
        ),
        Trial::test(
            "a_fifo_manifest_is_refused_at_once",
            a_fifo_manifest_is_refused_at_once,
        ),
        kvm_trial("log_file_clashes_are_refused", log_file_clashes_are_refused),
    ];
    libtest_mimic::run(&args, trials).exit();
}
