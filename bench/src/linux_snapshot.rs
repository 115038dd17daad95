//! The snapshot a fleet of clones restores: one VM of the kit's Linux booted through lull's
//! API to its in-kernel workload, paused, snapshotted and ended (`lull bench clones`, `lull
//! bench density --guest linux --clones`); and the child lull the benches drive meanwhile.
//!
//! ```text
//! lull run --api-socket S --kernel vmlinux --cmdline "... lull.workload=..." MODE [SLACK]
//!   vm.boot; console says "lull-workload: start" -> vm.pause, vm.snapshot DIR, vmm.shutdown
//!   the memory file read once: the page cache holds it, as it does for a fleet's clones
//! ```
//!
//! The workload keeps running in every clone: it reads lull's restore-count port, so that its
//! measured window starts again after each restore (`resources/linux/lull_workload.c`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::api_client::request_with_body;
use super::children::{guard, GRACE};

/// Longest wait for one API answer (a restore of a large VM by copy on a loaded host).
pub(crate) const REQUEST: Duration = Duration::from_secs(60);

/// A child lull, killed (SIGTERM, then SIGKILL) when dropped.
pub(crate) struct Lull(pub(crate) Child);

impl Lull {
    /// Starts `lull args`, its stdout dropped and its stderr into `stderr`.
    pub(crate) fn spawn(lull: &Path, args: &[&str], stderr: &Path) -> Result<Self, String> {
        let file =
            std::fs::File::create(stderr).map_err(|e| format!("{}: {e}", stderr.display()))?;
        guard(Command::new(lull).args(args))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map(Lull)
            .map_err(|e| format!("cannot start {}: {e}", lull.display()))
    }

    /// Sends SIGTERM unless it has ended.
    pub(crate) fn terminate(&mut self) {
        if let (Ok(None), Ok(pid)) = (self.0.try_wait(), i32::try_from(self.0.id())) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }

    /// SIGTERM, then up to [`GRACE`] for it to exit, then SIGKILL.
    pub(crate) fn stop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            self.terminate();
            let deadline = Instant::now() + GRACE;
            while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// Whether it still runs.
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Lull {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `lull` listens on `socket` (up to [`REQUEST`]).
pub(crate) fn wait_for_socket(socket: &Path, lull: &mut Lull) -> Result<(), String> {
    let deadline = Instant::now() + REQUEST;
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if !lull.running() {
            return Err("lull exited before its API socket was up".into());
        }
        if Instant::now() > deadline {
            return Err(format!("no API socket at {}", socket.display()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// `PUT endpoint` with `body`, which must answer 2xx.
pub(crate) fn call(socket: &Path, endpoint: &str, body: &str) -> Result<(), String> {
    let a = request_with_body(socket, "PUT", endpoint, body, REQUEST).map_err(|e| e.to_string())?;
    if (200..300).contains(&a.status) {
        Ok(())
    } else {
        Err(format!("{endpoint}: {} {}", a.status, a.body.trim()))
    }
}

/// The VM to snapshot.
pub(crate) struct SnapshotSpec<'a> {
    /// The lull binary.
    pub lull: &'a Path,
    /// The kit's Linux.
    pub kernel: &'a Path,
    /// Its command line, `lull.workload=` included.
    pub cmdline: &'a str,
    /// vCPUs.
    pub cpus: u32,
    /// Memory, as `lull run --memory` takes it.
    pub memory: &'a str,
    /// The mode's flags and any more (`--timer-slack S`).
    pub lull_args: Vec<String>,
    /// Where its files go: `STEM-base.{sock,console,stderr}` and the snapshot `STEM-snapshot`.
    pub stem: PathBuf,
    /// Longest wait for the kernel to reach its workload.
    pub boot_timeout: Duration,
}

impl SnapshotSpec<'_> {
    fn file(&self, suffix: &str) -> PathBuf {
        let mut name = self.stem.file_name().unwrap_or_default().to_os_string();
        name.push(suffix);
        self.stem.with_file_name(name)
    }

    /// Boots the VM to its workload and snapshots it: the snapshot's directory.
    pub(crate) fn take(&self) -> Result<PathBuf, String> {
        let (socket, console) = (self.file("-base.sock"), self.file("-base.console"));
        let dir = self.file("-snapshot");
        for stale in [&socket, &console] {
            let _ = std::fs::remove_file(stale);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (socket_arg, kernel, serial, cpus) = (
            socket.display().to_string(),
            self.kernel.display().to_string(),
            format!("file={}", console.display()),
            self.cpus.to_string(),
        );
        let mut args = vec![
            "run",
            "--api-socket",
            &socket_arg,
            "--kernel",
            &kernel,
            "--cpus",
            &cpus,
            "--memory",
            self.memory,
            "--cmdline",
            self.cmdline,
            "--serial",
            &serial,
        ];
        args.extend(self.lull_args.iter().map(String::as_str));
        let mut lull = Lull::spawn(self.lull, &args, &self.file("-base.stderr"))?;
        wait_for_socket(&socket, &mut lull)?;
        call(&socket, "vm.boot", "")?;
        self.wait_for_workload(&console, &mut lull)?;
        call(&socket, "vm.pause", "")?;
        let body = format!(r#"{{"destination_url": "file://{}"}}"#, dir.display());
        call(&socket, "vm.snapshot", &body)?;
        call(&socket, "vmm.shutdown", "")?;
        lull.stop();
        read_memory_file(&dir)?;
        Ok(dir)
    }

    /// Waits for "lull-workload: start" on `console`.
    fn wait_for_workload(&self, console: &Path, lull: &mut Lull) -> Result<(), String> {
        let deadline = Instant::now() + self.boot_timeout;
        loop {
            let text = std::fs::read_to_string(console).unwrap_or_default();
            if text.contains("lull-workload: start") {
                return Ok(());
            }
            if text.contains("lull-workload: FAIL") || !lull.running() {
                return Err(format!(
                    "the kernel failed before its workload: {}",
                    console.display()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the kernel did not reach its workload within {:?}",
                    self.boot_timeout
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Reads the snapshot's memory file once, so that the page cache holds it from now on, as it
/// does for a fleet's later clones.
fn read_memory_file(dir: &Path) -> Result<(), String> {
    let manifest = std::fs::read(dir.join("manifest.json")).map_err(|e| e.to_string())?;
    let manifest: serde_json::Value =
        serde_json::from_slice(&manifest).map_err(|e| format!("manifest: {e}"))?;
    let memory = manifest["memory_file"]
        .as_str()
        .ok_or("the manifest names no memory file")?;
    std::fs::read(dir.join(memory)).map_err(|e| format!("memory file: {e}"))?;
    Ok(())
}
