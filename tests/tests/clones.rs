//! Clones of one snapshot (issue 43): restore by mapping shares the snapshot's pages.
//!
//! The kit's `idle-sim` (1 vCPU, 64 MiB) is booted through the API, paused, snapshotted, and
//! its lull ended. Three VMs are then restored from that one snapshot, side by side:
//! - clone A, `vm.restore` with no `memory_restore_mode` (lull's default: map), resumed;
//! - clone B, `lull run --restore DIR --resume` (the CLI's default: map);
//! - clone C, `vm.restore` with `"memory_restore_mode": "Copy"`.
//!
//! While A and B run, `/proc/PID/smaps` of each shows the snapshot's memory file mapped, with
//! pages that both map (`Shared_*`, so their PSS is below their RSS) and pages each has
//! written (`Private_Dirty`: its own copies); C maps no part of the file. The memory file is
//! byte for byte what it was. Clone A is then paused; a snapshot over the one it maps is
//! refused and leaves it as it was; clone A is snapshotted elsewhere (its memory is
//! the file's pages and its own written pages together), and that snapshot restored by
//! `lull run --restore`: the guest passes there, as it does in clone B.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lull_tests::exit_status::{API_STOP, GUEST_PASS};
use lull_tests::{
    api_call, kit_file, kvm_trial, lull_bin, run_lull, snapshot_file, snapshot_into,
    start_api_server, ApiLull, Arguments, Failed,
};

/// How long the guest runs its timers (guest time): long enough for the clones to be seen
/// side by side on a loaded host, short enough for the test.
const GUEST_MS: u64 = 15_000;

/// The memory counters of the mappings of one file in one process (smaps, in KiB).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Mapped {
    rss: u64,
    pss: u64,
    shared: u64,
    private_dirty: u64,
    mappings: u32,
}

/// The sum of `/proc/PID/smaps` over the mappings of `file`.
fn mapped(pid: u32, file: &Path) -> Result<Mapped, Failed> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))
        .map_err(|e| format!("smaps of {pid}: {e}"))?;
    let name = file.display().to_string();
    let mut sum = Mapped::default();
    let mut inside = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: "start-end perms offset dev inode [path]".
            inside = line.split_whitespace().nth(5) == Some(name.as_str());
            sum.mappings += u32::from(inside);
            continue;
        }
        if !inside {
            continue;
        }
        let kib = fields
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        match first {
            "Rss:" => sum.rss += kib,
            "Pss:" => sum.pss += kib,
            "Shared_Clean:" | "Shared_Dirty:" => sum.shared += kib,
            "Private_Dirty:" => sum.private_dirty += kib,
            _ => {}
        }
    }
    Ok(sum)
}

/// Boots idle-sim through the API, pauses it, snapshots it into a new directory and ends that
/// lull: the directory.
fn snapshot_of_a_running_guest(name: &str, irqchip: &str) -> Result<PathBuf, Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?.display().to_string();
    let cmdline = format!("duration_ms={GUEST_MS}");
    let server = start_api_server(
        name,
        &[
            "--kernel",
            &kernel,
            "--irqchip",
            irqchip,
            "--memory",
            "64M",
            "--cmdline",
            &cmdline,
            "--serial",
            "off",
        ],
    )?;
    let lull = ApiLull::from(server);
    lull.put("vm.boot", "")?;
    lull.put("vm.pause", "")?;
    let dir = snapshot_into(lull.socket(), &format!("{name}-snapshot"))?;
    lull.shutdown(API_STOP)?;
    Ok(dir)
}

/// A new lull serving its API, the snapshot in `dir` restored into it with `fields` added to
/// `vm.restore`'s body, resumed: the lull and its pid.
fn restored_clone(name: &str, dir: &Path, fields: &str) -> Result<(ApiLull, u32), Failed> {
    let server = start_api_server(name, &[])?;
    let pid = server.child.id();
    let lull = ApiLull::from(server);
    let body = format!(
        r#"{{"source_url": "file://{}", "resume": true{fields}}}"#,
        dir.display()
    );
    lull.put("vm.restore", &body)?;
    Ok((lull, pid))
}

/// Kills `child` (a test's own lull) unless it has ended, and reaps it.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `limit` for `child` to exit: its status code.
fn exit_code_within(child: &mut Child, limit: Duration) -> Result<i32, Failed> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return status
                .code()
                .ok_or_else(|| format!("lull died by a signal: {status}").into());
        }
        if Instant::now() > deadline {
            return Err(format!("lull did not end within {limit:?}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn clones_share_the_snapshot(irqchip: &str) -> Result<(), Failed> {
    let name = format!("clones-{irqchip}");
    let dir = snapshot_of_a_running_guest(&name, irqchip)?;
    let memory = snapshot_file(&dir, "/memory_file")?;
    let before = std::fs::read(&memory).map_err(|e| format!("{}: {e}", memory.display()))?;

    let (a, pid_a) = restored_clone(&format!("{name}-a"), &dir, "")?;
    let mut b = Reaped(
        Command::new(lull_bin())
            .args(["run", "--restore"])
            .arg(&dir)
            .arg("--resume")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start lull: {e}"))?,
    );
    let pid_b = b.0.id();
    let (c, pid_c) = restored_clone(
        &format!("{name}-c"),
        &dir,
        r#", "memory_restore_mode": "Copy""#,
    )?;

    // Both mapped clones fault the guest's code and data in as they run: wait (bounded) until
    // a page of the file is mapped by both.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (seen_a, seen_b) = loop {
        let (ma, mb) = (mapped(pid_a, &memory)?, mapped(pid_b, &memory)?);
        if ma.shared > 0 && mb.shared > 0 && ma.private_dirty > 0 && mb.private_dirty > 0 {
            break (ma, mb);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "after 60 s the clones do not share the snapshot's pages and each write its own: \
                 A {ma:?}, B {mb:?}"
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    for (clone, seen) in [("A", seen_a), ("B", seen_b)] {
        if seen.mappings == 0 || seen.pss >= seen.rss {
            return Err(format!("clone {clone}: PSS not below RSS: {seen:?}").into());
        }
    }
    let copied = mapped(pid_c, &memory)?;
    if copied.mappings != 0 {
        return Err(format!("the copied clone C maps the snapshot's file: {copied:?}").into());
    }
    let (status, info) = api_call(c.socket(), "GET", "vm.info", "")?;
    if status != 200 || !info.contains("Running") {
        return Err(format!("the copied clone is not running: {status} {info}").into());
    }
    drop(c);

    // Clone A, its memory half file pages and half its own, becomes a snapshot in turn; not
    // over the snapshot it maps (refused, the directory left as it was), but elsewhere.
    a.put("vm.pause", "")?;
    let manifest = std::fs::read(dir.join("manifest.json")).map_err(|e| e.to_string())?;
    let over = format!(r#"{{"destination_url": "file://{}"}}"#, dir.display());
    let (status, text) = api_call(a.socket(), "PUT", "vm.snapshot", &over)?;
    if status != 500 || !text.contains("mapped by a running VM") {
        return Err(format!("a snapshot over the one clone A maps: {status} {text}").into());
    }
    if std::fs::read(dir.join("manifest.json")).map_err(|e| e.to_string())? != manifest {
        return Err("the refused snapshot changed the manifest it would have replaced".into());
    }
    let again = snapshot_into(a.socket(), &format!("{name}-of-a"))?;
    drop(a);
    let code = exit_code_within(&mut b.0, Duration::from_secs(180))?;
    if code != GUEST_PASS {
        return Err(format!("clone B (lull run --restore) exited {code}, not a PASS").into());
    }
    let run = run_lull(
        &["run", "--restore", &again.display().to_string(), "--resume"],
        Duration::from_secs(180),
    )?;
    run.expect_code(GUEST_PASS)?;

    let after = std::fs::read(&memory).map_err(|e| format!("{}: {e}", memory.display()))?;
    if before != after {
        return Err("a clone's writes reached the snapshot's memory file".into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&again);
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = ["user", "kernel"]
        .into_iter()
        .map(|irqchip| {
            kvm_trial(&format!("clones_share_the_snapshot_{irqchip}"), move || {
                clones_share_the_snapshot(irqchip)
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
