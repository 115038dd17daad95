//! `lull bench clones`: fleets of the kit's Linux restored from one snapshot, per mode: what a
//! clone costs the host in memory and CPU, and how fast it runs again.
//!
//! ```text
//! per mode (kernel, pull, ..., and each user-irqchip mode with each --timer-slack):
//!   boot one VM of the kit's Linux (--cpus, --memory, the in-kernel idle workload for a day)
//!     through the API; at "lull-workload: start": vm.pause, vm.snapshot, end that lull
//!   read the memory file once (the page cache holds it, as for a fleet's later clones)
//!   restore-to-running, --restores times per memory mode (map, copy), one VM at a time:
//!     API: a lull already serving -> vm.restore {resume: true} sent -> answered (running)
//!     CLI: `lull run --restore DIR --resume --memory-restore M` spawned -> "VM resumed" logged
//!   per --fleet-memory, per count N in --clones: N clones `lull run --restore DIR --resume`,
//!     started one after the other (each once the one before logged "VM resumed")
//!     --settle (the clones' first touches and timers pass) then a --window:
//!       memory per clone: /proc/PID/smaps_rollup (PSS, anon and file, private and shared)
//!       and the host's MemAvailable before the fleet and after it settled
//!       CPU per clone: the clones' CPU time over the window; the host's busy share
//!     every clone must still run at the end (its guest's workload runs for a day)
//! ```
//!
//! Clones of one snapshot share the pages none of them wrote (restore maps the memory file
//! copy-on-write, `docs/API.md`); a copied clone owns every page of data.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use clap::Args;

use super::clones_report::{
    clones_table, ClonesParams, ClonesReport, FleetRow, RestoreRow, CLONES_SCHEMA,
};
use super::common::{lull_binary, lull_has_flag, work_dir, CommonArgs};
use super::density::Mode;
use super::error::BenchError;
use super::host::host_info;
use super::linux_snapshot::{call, wait_for_socket, Lull, SnapshotSpec};
use super::proc_sample::{self, mem_available_kib, rollup, Rollup};
use super::snapshot_log::{log_time_of_day, since_time_of_day};
use super::spread::Spread;
use super::units::parse_duration;

/// Longest wait for a restored VM to log that it runs.
const RUNNING: Duration = Duration::from_secs(120);
/// How long the snapshotted guest's workload runs: longer than any fleet.
const WORKLOAD_S: u64 = 86_400;

/// How a fleet's clones get the snapshot's memory (`lull run --memory-restore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MemoryMode {
    /// Mapped copy-on-write: clones share the pages they have not written.
    Map,
    /// Copied in: each clone owns its memory.
    Copy,
}

impl MemoryMode {
    fn name(self) -> &'static str {
        match self {
            Self::Map => "map",
            Self::Copy => "copy",
        }
    }

    /// `memory_restore_mode` of `vm.restore`.
    fn api_name(self) -> &'static str {
        match self {
            Self::Map => "OnDemand",
            Self::Copy => "Copy",
        }
    }
}

/// Flags of `lull bench clones`.
#[derive(Debug, Args)]
pub struct ClonesArgs {
    /// Clones running at once, comma-separated (one fleet per mode, memory mode and count).
    #[arg(long, value_delimiter = ',', default_value = "8,64")]
    pub clones: Vec<u32>,
    /// Modes of the snapshotted VM, comma-separated: kernel, pull, push, central.
    #[arg(long, value_delimiter = ',', default_value = "kernel,pull")]
    pub modes: Vec<Mode>,
    /// Timer slacks: each user-irqchip mode also runs with each (a snapshot of its own, the
    /// VM booted with `lull run --timer-slack S`), e.g. `1ms`.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub timer_slack: Vec<String>,
    /// How the fleets' clones get their memory, comma-separated: map, copy.
    #[arg(long, value_delimiter = ',', default_value = "map")]
    pub fleet_memory: Vec<MemoryMode>,
    /// vCPUs of the VM.
    #[arg(long, default_value_t = 1)]
    pub cpus: u32,
    /// Memory of the VM.
    #[arg(long, default_value = "64M")]
    pub memory: String,
    /// How long a fleet runs before its window.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub settle: Duration,
    /// The window over which a fleet's CPU is measured.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub window: Duration,
    /// Restores per path (API, command line) and memory mode, for restore-to-running.
    #[arg(long, default_value_t = 5)]
    pub restores: u32,
    /// Longest wait for the first VM's kernel to reach its workload.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    pub boot_timeout: Duration,
    /// JSON, lull binary, kit, work directory.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One snapshotted VM: its mode and slack.
struct Variant {
    mode: Mode,
    slack: Option<String>,
}

impl Variant {
    fn name(&self) -> String {
        match &self.slack {
            Some(s) => format!("{}+slack={s}", self.mode.name()),
            None => self.mode.name().to_string(),
        }
    }
}

struct Bench<'a> {
    args: &'a ClonesArgs,
    lull: PathBuf,
    work: PathBuf,
    kernel: PathBuf,
    cmdline: String,
}

impl Bench<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }

    fn spawn(&self, args: &[&str], stderr: &Path) -> Result<Lull, String> {
        Lull::spawn(&self.lull, args, stderr)
    }

    /// Boots the variant's VM to its workload, snapshots it: the snapshot's directory.
    fn snapshot(&self, v: &Variant) -> Result<PathBuf, String> {
        SnapshotSpec {
            lull: &self.lull,
            kernel: &self.kernel,
            cmdline: &self.cmdline,
            cpus: self.args.cpus,
            memory: &self.args.memory,
            lull_args: v.mode.vm_flags(None, v.slack.as_deref()),
            stem: self.path(&v.name().replace(['+', '='], "-")),
            boot_timeout: self.args.boot_timeout,
        }
        .take()
    }

    /// `--restores` restores to running through the API and the command line.
    fn restores(&self, v: &Variant, dir: &Path, memory: MemoryMode) -> RestoreRow {
        let mut row = RestoreRow {
            mode: v.name(),
            memory: memory.name().into(),
            ..Default::default()
        };
        let (mut api, mut cli) = (Vec::new(), Vec::new());
        for i in 0..self.args.restores {
            match self.restore_api(dir, memory, i) {
                Ok(ms) => api.push(ms),
                Err(e) => row.failures.push(format!("API restore {i}: {e}")),
            }
            let stderr = self.path(&format!("restore-cli-{i}.stderr"));
            match self.clone_cli(dir, memory, &stderr) {
                Ok((mut lull, ms)) => {
                    cli.push(ms);
                    lull.stop();
                }
                Err(e) => row.failures.push(format!("CLI restore {i}: {e}")),
            }
        }
        row.api_ms = Spread::of(api);
        row.cli_ms = Spread::of(cli);
        row
    }

    /// A lull serving its socket: `vm.restore` with `resume` to its answer, ms.
    fn restore_api(&self, dir: &Path, memory: MemoryMode, i: u32) -> Result<f64, String> {
        let socket = self.path(&format!("restore-{i}.sock"));
        let _ = std::fs::remove_file(&socket);
        let socket_arg = socket.display().to_string();
        let stderr = self.path(&format!("restore-api-{i}.stderr"));
        let mut lull = self.spawn(&["run", "--api-socket", &socket_arg], &stderr)?;
        wait_for_socket(&socket, &mut lull)?;
        let body = format!(
            r#"{{"source_url": "file://{}", "resume": true, "memory_restore_mode": "{}"}}"#,
            dir.display(),
            memory.api_name()
        );
        let sent = Instant::now();
        call(&socket, "vm.restore", &body)?;
        let ms = sent.elapsed().as_secs_f64() * 1e3;
        let _ = call(&socket, "vmm.shutdown", "");
        lull.stop();
        Ok(ms)
    }

    /// `lull run --restore DIR --resume`: the running clone and its spawn to "VM resumed", ms.
    fn clone_cli(
        &self,
        dir: &Path,
        memory: MemoryMode,
        stderr: &Path,
    ) -> Result<(Lull, f64), String> {
        let dir_arg = dir.display().to_string();
        let args = [
            "run",
            "--restore",
            &dir_arg,
            "--resume",
            "--memory-restore",
            memory.name(),
        ];
        let spawned = SystemTime::now();
        let mut lull = self.spawn(&args, stderr)?;
        let deadline = Instant::now() + RUNNING;
        loop {
            let log = std::fs::read_to_string(stderr).unwrap_or_default();
            if let Some(at) = log
                .lines()
                .find(|l| l.contains("VM resumed"))
                .and_then(log_time_of_day)
            {
                return Ok((lull, since_time_of_day(spawned, at)));
            }
            if !lull.running() || Instant::now() > deadline {
                let last = log.lines().last().unwrap_or("(nothing logged)").to_string();
                return Err(format!("the clone did not run: {last}"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// `n` clones at once, measured after `--settle` over `--window`.
    fn fleet(&self, v: &Variant, dir: &Path, memory: MemoryMode, n: u32) -> FleetRow {
        let mut row = FleetRow {
            mode: v.name(),
            memory: memory.name().into(),
            clones: n,
            ..Default::default()
        };
        let avail_before = mem_available_kib();
        let mut clones = self.start_fleet(dir, memory, n, &mut row);
        std::thread::sleep(self.args.settle);
        let pids: Vec<u32> = clones.iter().map(|c| c.0.id()).collect();
        self.measure_cpu(&pids, &mut row);
        let memory: Vec<Rollup> = pids.iter().filter_map(|&p| rollup(p)).collect();
        let avail_after = mem_available_kib();
        row.running = u32::try_from(
            clones
                .iter_mut()
                .filter_map(|c| c.running().then_some(()))
                .count(),
        )
        .unwrap_or(0);
        if row.running < n {
            row.failures.push(format!(
                "{} of {n} clones were not running at the end",
                n - row.running
            ));
        }
        record_memory(&mut row, &memory, avail_before.zip(avail_after));
        row.load_1m = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse().ok());
        // SIGTERM to every clone first, so that they end together, then each reaped.
        for c in &mut clones {
            c.terminate();
        }
        for c in &mut clones {
            c.stop();
        }
        row
    }

    /// Restores `n` clones of `dir` one after the other (each running before the next
    /// starts), into `row`'s restore times; stops at the first that fails, into its failures.
    fn start_fleet(&self, dir: &Path, memory: MemoryMode, n: u32, row: &mut FleetRow) -> Vec<Lull> {
        let mut clones = Vec::new();
        let mut started = Vec::new();
        for i in 0..n {
            let stderr = self.path(&format!("clone-{i}.stderr"));
            match self.clone_cli(dir, memory, &stderr) {
                Ok((lull, ms)) => {
                    clones.push(lull);
                    started.push(ms);
                }
                Err(e) => {
                    row.failures.push(format!("clone {i}: {e}"));
                    break;
                }
            }
        }
        row.restore_to_running_ms = Spread::of(started);
        clones
    }

    /// The CPU the clones `pids` and the host use over `--window`, into `row`.
    fn measure_cpu(&self, pids: &[u32], row: &mut FleetRow) {
        let cpu_ns = || -> u64 {
            pids.iter()
                .filter_map(|&p| proc_sample::sample(p))
                .map(|s| s.cpu_ns)
                .sum()
        };
        let cpu_before = cpu_ns();
        let host_before = host_cpu_ticks();
        let window = Instant::now();
        std::thread::sleep(self.args.window);
        let cpu_after = cpu_ns();
        let host_after = host_cpu_ticks();
        let seconds = window.elapsed().as_secs_f64();
        if !pids.is_empty() {
            let cpu_s = cpu_after.saturating_sub(cpu_before) as f64 / 1e9;
            row.cpu_pct_per_clone = Some(cpu_s / seconds * 100.0 / pids.len() as f64);
        }
        if let (Some(a), Some(b)) = (host_before, host_after) {
            let total = b.total.saturating_sub(a.total) as f64;
            let idle = b.idle.saturating_sub(a.idle) as f64;
            row.host_busy_pct = (total > 0.0).then(|| (total - idle) / total * 100.0);
        }
    }
}

/// The clones' mean memory into `row`, and the host memory they took per clone from
/// `MemAvailable` (before, after) if both were read.
fn record_memory(row: &mut FleetRow, memory: &[Rollup], available_kib: Option<(u64, u64)>) {
    let count = memory.len() as f64;
    let mean = |f: fn(&Rollup) -> u64| {
        (count > 0.0).then(|| memory.iter().map(f).sum::<u64>() as f64 / count)
    };
    row.pss_kib = mean(|r| r.pss);
    row.pss_anon_kib = mean(|r| r.pss_anon);
    row.pss_file_kib = mean(|r| r.pss_file);
    row.private_kib = mean(|r| r.private);
    row.shared_kib = mean(|r| r.shared);
    row.rss_kib = mean(|r| r.rss);
    if let (Some((before, after)), true) = (available_kib, count > 0.0) {
        row.mem_available_used_kib = Some((before as f64 - after as f64) / count);
    }
}

/// The host's CPU time, all CPUs, in ticks: total and idle (idle + iowait).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HostTicks {
    total: u64,
    idle: u64,
}

fn host_cpu_ticks() -> Option<HostTicks> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_host_ticks(text.lines().next()?)
}

fn parse_host_ticks(line: &str) -> Option<HostTicks> {
    let mut words = line.split_whitespace();
    if words.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let v: Vec<u64> = words.take(8).filter_map(|w| w.parse().ok()).collect();
    (v.len() == 8).then(|| HostTicks {
        total: v.iter().sum(),
        idle: v[3] + v[4],
    })
}

/// Runs `lull bench clones`; `Ok(false)` if a restore or a clone failed.
pub fn run(args: &ClonesArgs) -> Result<bool, BenchError> {
    let bench = bench_of(args)?;
    let mut report = ClonesReport {
        schema: CLONES_SCHEMA.into(),
        host: host_info(),
        params: ClonesParams {
            cpus: args.cpus,
            memory: args.memory.clone(),
            cmdline: bench.cmdline.clone(),
            settle_s: args.settle.as_secs_f64(),
            window_s: args.window.as_secs_f64(),
            restores: args.restores,
            command: std::env::args().collect::<Vec<_>>().join(" "),
        },
        restores: Vec::new(),
        fleets: Vec::new(),
    };
    for v in variants(args) {
        bench.variant(&v, &mut report);
    }
    print!("{}", clones_table(&report));
    if let Some(path) = &args.common.json {
        super::report::write_json(path, &report)?;
    }
    let failed = report.restores.iter().any(|r| !r.failures.is_empty())
        || report.fleets.iter().any(|f| !f.failures.is_empty());
    Ok(!failed)
}

/// The bench `args` ask for: lull's modes only, a lull that restores by mapping, the kit's
/// Linux running its idle workload.
fn bench_of(args: &ClonesArgs) -> Result<Bench<'_>, BenchError> {
    if let Some(m) = args.modes.iter().find(|m| m.is_qemu()) {
        return Err(BenchError::NoModes(format!(
            "{} cannot restore a lull snapshot: give lull's modes",
            m.name()
        )));
    }
    let lull = lull_binary(args.common.lull.as_ref())?;
    if !lull_has_flag(&lull, "--memory-restore") {
        return Err(BenchError::NoModes(format!(
            "{} has no --memory-restore: build a newer lull or pass --lull PATH",
            lull.display()
        )));
    }
    let kit_dir = args.common.kit.clone().unwrap_or_else(kit::kit_dir);
    let linux = kit::default_guest_in(&kit_dir).map_err(BenchError::Kit)?;
    let base = kit::default_cmdline(
        linux.cmdline.as_deref(),
        linux.cmdline_pvm.as_deref(),
        kit::host_is_pvm(),
    );
    let words: Vec<&str> = base
        .split_whitespace()
        .filter(|w| !w.starts_with("lull.workload="))
        .collect();
    let cmdline = format!(
        "{} lull.workload=idle,seconds={WORKLOAD_S},cpus={}",
        words.join(" "),
        args.cpus
    );
    Ok(Bench {
        args,
        lull,
        work: work_dir(args.common.work_dir.as_ref())?,
        kernel: linux.kernel,
        cmdline,
    })
}

impl Bench<'_> {
    /// One variant: its snapshot, its restores by each memory mode, its fleets, into `report`.
    fn variant(&self, v: &Variant, report: &mut ClonesReport) {
        eprintln!("bench clones: {}: booting the VM to snapshot", v.name());
        let dir = match self.snapshot(v) {
            Ok(dir) => dir,
            Err(e) => {
                report.fleets.push(FleetRow {
                    mode: v.name(),
                    failures: vec![format!("no snapshot: {e}")],
                    ..Default::default()
                });
                return;
            }
        };
        for memory in [MemoryMode::Map, MemoryMode::Copy] {
            eprintln!("bench clones: {}: restores by {}", v.name(), memory.name());
            report.restores.push(self.restores(v, &dir, memory));
        }
        for &memory in &self.args.fleet_memory {
            for &n in &self.args.clones {
                eprintln!(
                    "bench clones: {}: {n} clones by {}",
                    v.name(),
                    memory.name()
                );
                report.fleets.push(self.fleet(v, &dir, memory, n));
            }
        }
    }
}

/// The modes to snapshot: each of `--modes`, and each user-irqchip one with each slack.
fn variants(args: &ClonesArgs) -> Vec<Variant> {
    let mut out = Vec::new();
    for &mode in &args.modes {
        out.push(Variant { mode, slack: None });
        if mode != Mode::Kernel {
            for s in &args.timer_slack {
                out.push(Variant {
                    mode,
                    slack: Some(s.clone()),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Clones {
        #[command(flatten)]
        args: ClonesArgs,
    }

    #[test]
    fn host_ticks_count_iowait_as_idle() {
        let t = parse_host_ticks("cpu  10 1 5 100 4 1 1 0 3 0").unwrap();
        assert_eq!(
            t,
            HostTicks {
                total: 122,
                idle: 104
            }
        );
        assert_eq!(parse_host_ticks("cpu0 1 2 3 4 5 6 7 8"), None);
    }

    #[test]
    fn slack_variants_come_for_user_irqchip_modes_only() {
        let c =
            Clones::try_parse_from(["clones", "--modes", "kernel,pull", "--timer-slack", "1ms"])
                .unwrap();
        let names: Vec<String> = variants(&c.args).iter().map(Variant::name).collect();
        assert_eq!(names, ["kernel", "pull", "pull+slack=1ms"]);
    }
}
