//! `lull bench snapshot`: pause and resume latency, snapshot time and size, and
//! restore-to-running time, per irqchip mode, of a VM running the `pause-timers` guest (every
//! vCPU keeps TSC-deadline, one-shot and periodic timers armed and checks each fires once,
//! none early), all driven through lull's management API (`docs/API.md`).
//!
//! ```text
//! per mode:
//!   lull A (--api-socket): vm.boot, wait for "pause-timers: running";
//!     --reps x (vm.pause, vm.resume), each request sent -> reply received; lull's own
//!     "every vCPU stopped N us after the request" from its log;
//!     vm.pause, vm.snapshot (sent -> reply; lull's own "written ... in N ms"), sizes of the
//!     directory (apparent: file lengths; allocated: blocks, as du), vm.resume;
//!     the guest runs to its end (it must pass), vmm.shutdown
//!   the memory file is read once (page cache), then --restores x:
//!     API:  spawn `lull run --api-socket` -> socket up -> vm.restore -> vm.resume answered
//!           (the vCPUs run again): restore_api_ms, and the vm.restore call alone
//!     CLI:  spawn `lull run --restore DIR --resume` -> the time stamp of its "VM resumed"
//!           log line: restore_cli_ms
//!     each restored guest runs to its end and must pass (its console is the same file).
//! ```
//!
//! Every mode restores: a restore lull refuses or that fails counts as run and not passed,
//! with lull's reason in `failures` (and the restore figures it left without a sample `null`,
//! "no restore succeeded: see failures"). The guest prints nothing while its timers run, so
//! "until the guest's next console line" is not measured: the earliest sign of a running guest
//! here is `vm.resume`'s reply (lull answers it once every vCPU thread it released has left
//! the pause gate).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use clap::Args;

use super::api_client::{request_with_body, Answer};
use super::children::guard;
use super::common::{guest_path, lull_binary, work_dir, CommonArgs};
use super::density::Mode;
use super::error::BenchError;
use super::host::host_info;
use super::report::write_json;
use super::snapshot_log::{log_time_of_day, lull_log_figures, since_time_of_day};
use super::snapshot_report::{
    snapshot_table, SnapshotParams, SnapshotReport, SnapshotRow, SNAPSHOT_SCHEMA,
};
use super::spread::Spread;
use super::units::parse_size;

/// Longest wait for a snapshot or restore request (a large VM in a debug build is slow).
const LONG_REQUEST: Duration = Duration::from_secs(120);
/// Longest wait for lull's socket, the guest's start, or a guest's end.
const GUEST_DEADLINE: Duration = Duration::from_secs(300);
/// The guest's timer period (ns) and the extra per vCPU (`pause-timers`' ns and spread_ns).
const PERIOD_NS: u64 = 10_000_000;
const SPREAD_NS: u64 = 1_000_000;

/// Flags of `lull bench snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// vCPUs of the VM.
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Guest RAM in bytes, or with a binary K, M or G suffix (256M is 256 MiB).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub memory: u64,
    /// Pause/resume cycles per mode.
    #[arg(long, default_value_t = 100)]
    pub reps: u32,
    /// Restores per mode through each path (API and command line); each restored guest runs
    /// to its end.
    #[arg(long, default_value_t = 3)]
    pub restores: u32,
    /// Timers per phase of `pause-timers` (it runs about 3 x count x 10 ms): long enough for
    /// the pause cycles and the snapshot to happen while it runs.
    #[arg(long, default_value_t = 300)]
    pub count: u32,
    /// Modes, comma-separated: kernel, pull, push, central (a restore lull refuses is a
    /// failure of its mode's row, with lull's reason).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kernel,pull")]
    pub modes: Vec<Mode>,
    /// Results, lull binary, kit and logs.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Runs the experiment; `Ok(false)` if a guest failed or a request went wrong.
pub fn run(args: &SnapshotArgs) -> Result<bool, BenchError> {
    if let Some(q) = args.modes.iter().find(|m| m.is_qemu()) {
        return Err(BenchError::NoModes(format!(
            "{} is QEMU's: lull bench snapshot measures lull's modes (kernel, pull, push, central)",
            q.name()
        )));
    }
    let lull = lull_binary(args.common.lull.as_ref())?;
    let guest = guest_path("pause-timers", args.common.kit.as_ref())?;
    let work = work_dir(args.common.work_dir.as_ref())?;
    let cmdline = format!("count={} ns={PERIOD_NS} spread_ns={SPREAD_NS}", args.count);
    let mut report = SnapshotReport {
        schema: SNAPSHOT_SCHEMA.into(),
        host: host_info(),
        params: SnapshotParams {
            cpus: args.cpus,
            memory_mib: args.memory >> 20,
            guest: guest.display().to_string(),
            guest_cmdline: cmdline.clone(),
            reps: args.reps,
            restores: args.restores,
            modes: args.modes.iter().map(|m| m.name().to_string()).collect(),
        },
        results: Vec::new(),
    };
    for &mode in &args.modes {
        let dir = work.join(format!("snapshot-{}", mode.name()));
        std::fs::create_dir_all(&dir).map_err(|e| BenchError::Io(dir.clone(), e))?;
        let ctx = ModeRun {
            lull: &lull,
            guest: &guest,
            cmdline: &cmdline,
            args,
            mode,
            dir,
        };
        eprintln!("snapshot: mode {} ...", mode.name());
        report.results.push(ctx.run()?);
        if let Some(path) = &args.common.json {
            write_json(path, &report)?;
        }
    }
    for line in snapshot_table(&report) {
        println!("{line}");
    }
    Ok(report.results.iter().all(SnapshotRow::ok))
}

/// One mode's run: where its files go and what it runs.
struct ModeRun<'a> {
    lull: &'a Path,
    guest: &'a Path,
    cmdline: &'a str,
    args: &'a SnapshotArgs,
    mode: Mode,
    dir: PathBuf,
}

/// A lull process that is killed if the bench leaves it behind.
struct Lull(Child);

impl Drop for Lull {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ModeRun<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `lull ARGS`, stderr into `stderr`, guarded to die with the bench.
    fn spawn(&self, args: &[&str], stderr: &Path) -> Result<Lull, BenchError> {
        let file = std::fs::File::create(stderr).map_err(|e| BenchError::Io(stderr.into(), e))?;
        guard(Command::new(self.lull).args(args))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map(Lull)
            .map_err(|e| BenchError::Spawn(self.lull.display().to_string(), e))
    }

    fn run(&self) -> Result<SnapshotRow, BenchError> {
        let mut row = SnapshotRow {
            mode: self.mode.name().into(),
            ..Default::default()
        };
        let snapshot = self.path("snapshot");
        let _ = std::fs::remove_dir_all(&snapshot);
        std::fs::create_dir_all(&snapshot).map_err(|e| BenchError::Io(snapshot.clone(), e))?;
        let console = self.path("console");
        let _ = std::fs::remove_file(&console);
        if let Err(e) = self.first_lull(&mut row, &snapshot, &console) {
            row.failures.push(e);
        }
        let log = std::fs::read_to_string(self.path("a.stderr")).unwrap_or_default();
        lull_log_figures(&mut row, &log);
        for figure in ["pause_ms", "resume_ms", "lull_pause_us", "snapshot_ms"] {
            let has = match figure {
                "pause_ms" => row.pause_ms.is_some(),
                "resume_ms" => row.resume_ms.is_some(),
                "lull_pause_us" => row.lull_pause_us.is_some(),
                _ => row.snapshot_ms.is_some(),
            };
            if !has {
                let why = if row.failures.is_empty() {
                    "lull's log has no such line (an older lull?)"
                } else {
                    "not reached: see failures"
                };
                row.miss(figure, why);
            }
        }
        if row.snapshot_ms.is_some() {
            self.restores(&mut row, &snapshot, &console)?;
        } else {
            for figure in ["restore_api_ms", "restore_call_ms", "restore_cli_ms"] {
                row.miss(figure, "no snapshot to restore");
            }
        }
        Ok(row)
    }

    /// lull A: boot, pause/resume cycles, snapshot, the guest to its end.
    fn first_lull(
        &self,
        row: &mut SnapshotRow,
        snapshot: &Path,
        console: &Path,
    ) -> Result<(), String> {
        let socket = self.path("a.sock");
        let _ = std::fs::remove_file(&socket);
        let stderr = self.path("a.stderr");
        let (cpus, mib) = (
            self.args.cpus.to_string(),
            format!("{}M", self.args.memory >> 20),
        );
        let (socket_arg, guest, serial) = (
            socket.display().to_string(),
            self.guest.display().to_string(),
            format!("file={}", console.display()),
        );
        let mut flags = vec![
            "run",
            "--api-socket",
            &socket_arg,
            "--kernel",
            &guest,
            "--cpus",
            &cpus,
            "--memory",
            &mib,
            "--cmdline",
            self.cmdline,
            "--serial",
            &serial,
        ];
        flags.extend(self.mode.lull_args());
        let mut lull = self.spawn(&flags, &stderr).map_err(|e| e.to_string())?;
        wait_for_socket(&socket, &mut lull)?;
        call(&socket, "PUT", "vm.boot", "")?;
        wait_for_console(console, "pause-timers: running")?;
        let (mut pauses, mut resumes) = (Vec::new(), Vec::new());
        for i in 0..self.args.reps {
            let p = timed(&socket, "PUT", "vm.pause", "").map_err(|e| format!("pause {i}: {e}"))?;
            let r =
                timed(&socket, "PUT", "vm.resume", "").map_err(|e| format!("resume {i}: {e}"))?;
            pauses.push(p);
            resumes.push(r);
        }
        row.pause_ms = Spread::of(pauses);
        row.resume_ms = Spread::of(resumes);
        if console_text(console).contains("pause-timers: timers ") {
            return Err(format!(
                "the guest ended before the snapshot: raise --count (now {})",
                self.args.count
            ));
        }
        call(&socket, "PUT", "vm.pause", "")?;
        let body = format!(r#"{{"destination_url": "file://{}"}}"#, snapshot.display());
        row.snapshot_ms = Some(timed(&socket, "PUT", "vm.snapshot", &body)?);
        let (apparent, allocated) = dir_sizes(snapshot).map_err(|e| format!("sizes: {e}"))?;
        row.snapshot_apparent_bytes = Some(apparent);
        row.snapshot_allocated_bytes = Some(allocated);
        call(&socket, "PUT", "vm.resume", "")?;
        row.guest_passed = guest_ends_passing(&socket, console, 1)?;
        if !row.guest_passed {
            row.failures
                .push("the guest of the snapshotted VM did not pass".into());
        }
        call(&socket, "PUT", "vmm.shutdown", "")?;
        let _ = lull.0.wait();
        Ok(())
    }

    /// `--restores` restores through the API and the command line, each guest to its end.
    fn restores(
        &self,
        row: &mut SnapshotRow,
        snapshot: &Path,
        console: &Path,
    ) -> Result<(), BenchError> {
        let memory = memory_file(snapshot).map_err(|e| BenchError::Io(snapshot.into(), e))?;
        read_through(&memory).map_err(|e| BenchError::Io(memory.clone(), e))?;
        let (mut api, mut calls, mut cli) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..self.args.restores {
            for path in ["API", "CLI"] {
                let passes_before = console_text(console).matches("pause-timers: PASS").count();
                let run = RestoreRun {
                    snapshot,
                    console,
                    i,
                    passes_before,
                };
                let result = if path == "API" {
                    self.restore_api(&run)
                } else {
                    self.restore_cli(&run)
                };
                row.restores_run += 1;
                let Ran {
                    total,
                    call,
                    passed,
                } = match result {
                    Ok(ran) => ran,
                    Err(e) => {
                        row.failures.push(format!("{path} restore {i}: {e}"));
                        continue;
                    }
                };
                row.restores_passed += u32::from(passed);
                if !passed {
                    row.failures
                        .push(format!("{path} restore {i}: the guest did not pass"));
                }
                if path == "API" { &mut api } else { &mut cli }.push(total);
                calls.extend(call);
            }
        }
        row.restore_api_ms = Spread::of(api);
        row.restore_call_ms = Spread::of(calls);
        row.restore_cli_ms = Spread::of(cli);
        let why = "no restore succeeded: see failures";
        for (figure, has) in [
            ("restore_api_ms", row.restore_api_ms.is_some()),
            ("restore_call_ms", row.restore_call_ms.is_some()),
            ("restore_cli_ms", row.restore_cli_ms.is_some()),
        ] {
            if !has {
                row.miss(figure, why);
            }
        }
        Ok(())
    }

    /// A new `lull run --api-socket`: vm.restore, vm.resume, then the guest to its end.
    fn restore_api(&self, r: &RestoreRun) -> Result<Ran, String> {
        let (snapshot, console, i) = (r.snapshot, r.console, r.i);
        let socket = self.path(&format!("restore-{i}.sock"));
        let _ = std::fs::remove_file(&socket);
        let socket_arg = socket.display().to_string();
        let stderr = self.path(&format!("restore-api-{i}.stderr"));
        let start = Instant::now();
        let mut lull = self
            .spawn(&["run", "--api-socket", &socket_arg], &stderr)
            .map_err(|e| e.to_string())?;
        wait_for_socket(&socket, &mut lull)?;
        // The console is given again: a restore never reuses the snapshot's own.
        let body = format!(
            r#"{{"source_url": "file://{}", "serial": "file={}"}}"#,
            snapshot.display(),
            console.display()
        );
        let sent = Instant::now();
        let a = send(&socket, "PUT", "vm.restore", &body)?;
        let call_ms = ms(sent.elapsed());
        if a.status != 204 {
            let _ = call(&socket, "PUT", "vmm.shutdown", "");
            let _ = wait_with_deadline(&mut lull.0, GUEST_DEADLINE);
            return Err(format!(
                "vm.restore answered {}: {}",
                a.status,
                a.body.trim()
            ));
        }
        call(&socket, "PUT", "vm.resume", "")?;
        let total = ms(start.elapsed());
        let passed = guest_ends_passing(&socket, console, r.passes_before + 1)?;
        call(&socket, "PUT", "vmm.shutdown", "")?;
        let _ = lull.0.wait();
        Ok(Ran {
            total,
            call: Some(call_ms),
            passed,
        })
    }

    /// `lull run --restore DIR --resume`, run to its end: spawn -> its "VM resumed" line.
    fn restore_cli(&self, r: &RestoreRun) -> Result<Ran, String> {
        let (snapshot, console, i) = (r.snapshot, r.console, r.i);
        let stderr = self.path(&format!("restore-cli-{i}.stderr"));
        let dir = snapshot.display().to_string();
        let serial = format!("file={}", console.display());
        let spawned = SystemTime::now();
        let mut lull = self
            .spawn(
                &["run", "--restore", &dir, "--resume", "--serial", &serial],
                &stderr,
            )
            .map_err(|e| e.to_string())?;
        let status = wait_with_deadline(&mut lull.0, GUEST_DEADLINE)?;
        let log = std::fs::read_to_string(&stderr).unwrap_or_default();
        if status == Some(crate::EXIT_BAD_INPUT.into()) {
            let why = log.lines().last().unwrap_or("(no reason logged)");
            return Err(format!("lull refused the snapshot: {}", why.trim()));
        }
        let resumed = log
            .lines()
            .find(|l| l.contains("VM resumed"))
            .and_then(log_time_of_day)
            .ok_or_else(|| {
                format!(
                    "no time-stamped \"VM resumed\" line in {}",
                    stderr.display()
                )
            })?;
        let total = since_time_of_day(spawned, resumed);
        let passes = console_text(console).matches("pause-timers: PASS").count();
        // lull exits with 1 when its guest passes through the test port.
        let passed = status == Some(1) && passes == r.passes_before + 1;
        Ok(Ran {
            total,
            call: None,
            passed,
        })
    }
}

/// One restore to run: of which snapshot, the console its guest appends to, its number, and
/// how many PASS lines the console held before it.
struct RestoreRun<'a> {
    snapshot: &'a Path,
    console: &'a Path,
    i: u32,
    passes_before: usize,
}

/// A restore that ran.
struct Ran {
    /// ms from the spawn to running.
    total: f64,
    /// ms of the `vm.restore` call (API only).
    call: Option<f64>,
    /// Whether its guest passed.
    passed: bool,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn send(socket: &Path, method: &str, endpoint: &str, body: &str) -> Result<Answer, String> {
    request_with_body(socket, method, endpoint, body, LONG_REQUEST).map_err(|e| e.to_string())
}

/// `method endpoint`, which must answer 2xx; the body.
fn call(socket: &Path, method: &str, endpoint: &str, body: &str) -> Result<String, String> {
    let a = send(socket, method, endpoint, body)?;
    if (200..300).contains(&a.status) {
        Ok(a.body)
    } else {
        Err(format!(
            "{endpoint} answered {}: {}",
            a.status,
            a.body.trim()
        ))
    }
}

/// [`call`], timed from the request sent to the reply received, in ms.
fn timed(socket: &Path, method: &str, endpoint: &str, body: &str) -> Result<f64, String> {
    let start = Instant::now();
    call(socket, method, endpoint, body)?;
    Ok(ms(start.elapsed()))
}

/// Waits until lull answers on `socket` (polling every 100 us); fails if lull exits first.
fn wait_for_socket(socket: &Path, lull: &mut Lull) -> Result<(), String> {
    let deadline = Instant::now() + GUEST_DEADLINE;
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if let Ok(Some(status)) = lull.0.try_wait() {
            return Err(format!(
                "lull exited with {status} before its API socket was up"
            ));
        }
        if Instant::now() > deadline {
            return Err(format!("no API socket at {}", socket.display()));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(())
}

fn console_text(console: &Path) -> String {
    std::fs::read_to_string(console).unwrap_or_default()
}

/// Waits for `line` on the console.
fn wait_for_console(console: &Path, line: &str) -> Result<(), String> {
    let deadline = Instant::now() + GUEST_DEADLINE;
    while !console_text(console).contains(line) {
        if Instant::now() > deadline {
            return Err(format!("no {line:?} on {}", console.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Waits for the VM to stop; whether its guest passed: its test-exit status 1 and the
/// `passes`-th PASS line on the console (the file is shared by every run of the mode).
fn guest_ends_passing(socket: &Path, console: &Path, passes: usize) -> Result<bool, String> {
    let deadline = Instant::now() + GUEST_DEADLINE;
    loop {
        let info: serde_json::Value = serde_json::from_str(&call(socket, "GET", "vm.info", "")?)
            .map_err(|e| e.to_string())?;
        if info["state"] == "Shutdown" {
            let n = console_text(console).matches("pause-timers: PASS").count();
            return Ok(info["stop_reason"] == "guest test exit (status 1)" && n == passes);
        }
        if Instant::now() > deadline {
            return Err("the guest did not end in time: see the console in the work dir".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a child to exit; its code, or an error after `limit` (the child is killed).
fn wait_with_deadline(child: &mut Child, limit: Duration) -> Result<Option<i32>, String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(status.code());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(format!("lull did not end within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Apparent (file lengths) and allocated (blocks x 512, as `du`) bytes of the files in `dir`.
fn dir_sizes(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let (mut apparent, mut allocated) = (0, 0);
    for entry in std::fs::read_dir(dir)? {
        let meta = entry?.metadata()?;
        if meta.is_file() {
            apparent += meta.len();
            allocated += meta.blocks() * 512;
        }
    }
    Ok((apparent, allocated))
}

/// Reads `path` to its end (into the page cache).
fn read_through(path: &Path) -> std::io::Result<()> {
    let mut file = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    loop {
        let n = file.fill_buf()?.len();
        if n == 0 {
            return Ok(());
        }
        file.consume(n);
    }
}

/// The memory file of the snapshot in `dir`, as its manifest names it.
fn memory_file(dir: &Path) -> std::io::Result<std::path::PathBuf> {
    let text = std::fs::read(dir.join("manifest.json"))?;
    let manifest: serde_json::Value = serde_json::from_slice(&text)?;
    manifest["memory_file"]
        .as_str()
        .map(|name| dir.join(name))
        .ok_or_else(|| std::io::Error::other("the manifest names no memory_file"))
}
