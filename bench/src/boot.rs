//! `lull bench boot`: boot time of lull against QEMU (`-enable-kvm`) on the same guests, and
//! lull's own memory beside a Linux guest.
//!
//! ```text
//! hello:  --reps times, lull then QEMU: wall time from spawn to the VMM's exit
//! linux:  --linux-reps times, lull --irqchip user, lull --irqchip kernel, QEMU: the kit's
//!         Linux with 2 vCPUs, wall time to "smp: Brought up", to "Run /init as init process"
//!         and to the VMM's exit (panic=-1 resets)
//! rss:    lull, 1 vCPU, 128 MiB Linux guest: /proc/PID/smaps read once the kernel has brought
//!         up its CPUs (total Rss minus the Rss of the guest-RAM mapping), then the VM is killed
//! ```
//!
//! lull and QEMU alternate so host noise hits both alike; QEMU boots through qboot where it
//! is installed (one MP-table entry per vCPU, as lull writes; SeaBIOS lists one per socket).
//! The console is the VMM's stdout, read as it comes: a marker's time is when its bytes
//! arrived. Medians and ratios are of this one run.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};

use super::common::{guest_path, lull_binary, work_dir, CommonArgs};
use super::error::BenchError;
use super::host::{self, HostInfo};
use super::report::{median, write_json};
use super::{proc_sample, qemu};

/// Schema name of the boot JSON.
pub const BOOT_SCHEMA: &str = "lull-bench-boot/1";
/// Console lines of a Linux boot whose arrival is timed.
pub const LINUX_MARKERS: [&str; 2] = ["smp: Brought up", "Run /init as init process"];
const GUEST_MIB: u64 = 128;
const TIMEOUT: Duration = Duration::from_secs(900);

/// Flags of `lull bench boot`.
#[derive(Debug, Args)]
pub struct BootArgs {
    /// Boots of the `hello` guest per VMM.
    #[arg(long, default_value_t = 5)]
    pub reps: u32,
    /// Boots of the kit's Linux per VMM configuration (0: none; the RSS reading still runs).
    #[arg(long, default_value_t = 1)]
    pub linux_reps: u32,
    /// QEMU binary (its rows are left out where it is not installed).
    #[arg(long, default_value = "qemu-system-x86_64")]
    pub qemu: String,
    /// Results, lull binary, kit and logs.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One measurement over its runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BootRow {
    /// `hello lull`, `linux qemu 'smp: Brought up'`, `linux lull-user exit`, ...
    pub name: String,
    /// Seconds per run, in run order (`null`: the marker never came).
    pub runs_s: Vec<Option<f64>>,
    /// Median of the runs that have a time.
    pub median_s: Option<f64>,
}

/// lull's resident memory beside a Linux guest.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct BootRss {
    /// Guest RAM part (the mapping of the guest's size), KiB.
    pub guest_ram_kib: u64,
    /// Everything else: lull's own memory, KiB.
    pub lull_kib: u64,
}

/// The boot JSON document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BootReport {
    /// Always [`BOOT_SCHEMA`].
    pub schema: String,
    /// The host.
    pub host: HostInfo,
    /// Whether QEMU ran.
    pub qemu: bool,
    /// One row per measurement.
    pub results: Vec<BootRow>,
    /// `(name, lull / QEMU)` of the medians.
    pub ratios: Vec<(String, f64)>,
    /// lull's memory after "smp: Brought up" (1 vCPU, 128 MiB), if it was read.
    pub rss: Option<BootRss>,
    /// What went wrong, one line per failed run.
    pub failures: Vec<String>,
}

/// What one timed run saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timed {
    /// Spawn to exit.
    pub total: Duration,
    /// Spawn to each marker's arrival, in the order of the markers asked for.
    pub seen: Vec<Option<Duration>>,
    /// Exit status (`None`: killed).
    pub code: Option<i32>,
    /// The memory split read at the first marker, when asked for.
    pub rss: Option<(u64, u64)>,
}

/// Scans console bytes for markers that may straddle reads.
#[derive(Debug)]
pub struct MarkerScanner {
    markers: Vec<String>,
    found: Vec<bool>,
    tail: String,
}

impl MarkerScanner {
    /// A scanner for `markers`.
    pub fn new(markers: &[&str]) -> Self {
        Self {
            markers: markers.iter().map(|m| (*m).to_string()).collect(),
            found: vec![false; markers.len()],
            tail: String::new(),
        }
    }

    /// Feeds the next bytes; returns the indices of markers seen for the first time.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<usize> {
        self.tail.push_str(&String::from_utf8_lossy(bytes));
        let mut new = Vec::new();
        for (i, m) in self.markers.iter().enumerate() {
            if !self.found[i] && self.tail.contains(m.as_str()) {
                self.found[i] = true;
                new.push(i);
            }
        }
        // Keep just enough for a marker cut in two by the next read.
        let keep = self.markers.iter().map(String::len).max().unwrap_or(0);
        if self.tail.len() > keep {
            let mut cut = self.tail.len() - keep;
            while !self.tail.is_char_boundary(cut) {
                cut += 1;
            }
            self.tail.drain(..cut);
        }
        new
    }
}

/// Runs `cmd` with its console on a pipe, copied to `log`; times `markers`; at the first
/// marker, if `rss_guest_bytes` is given, reads the memory split and kills the VMM.
fn timed_run(
    mut cmd: Command,
    log: &Path,
    markers: &[&str],
    rss_guest_bytes: Option<u64>,
) -> Result<Timed, BenchError> {
    let program = format!("{:?}", cmd.get_program());
    let mut log_file = File::create(log).map_err(|e| BenchError::Io(log.to_path_buf(), e))?;
    let start = Instant::now();
    let mut child = crate::children::guard(&mut cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| BenchError::Spawn(program, e))?;
    let (tx, rx) = mpsc::channel();
    let mut scanner = MarkerScanner::new(markers);
    let reader = child.stdout.take().map(|mut out| {
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                for i in scanner.feed(&buf[..n]) {
                    let _ = tx.send((i, start.elapsed()));
                }
                // The log is for reading after a failure; losing it must not stop the run.
                let _ = log_file.write_all(&buf[..n]);
            }
        })
    });
    let mut t = Timed {
        seen: vec![None; markers.len()],
        ..Timed::default()
    };
    let status = loop {
        while let Ok((i, at)) = rx.try_recv() {
            t.seen[i] = Some(at);
            if let (0, Some(bytes)) = (i, rss_guest_bytes) {
                t.rss = proc_sample::rss_split_kib(child.id(), bytes);
                let _ = child.kill();
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    t.total = start.elapsed();
    t.code = status.and_then(|s| s.code());
    if let Some(r) = reader {
        let _ = r.join();
    }
    while let Ok((i, at)) = rx.try_recv() {
        t.seen[i] = t.seen[i].or(Some(at));
    }
    // The VMM wrote every marker before it exited; one read after the exit counts at the exit.
    for at in t.seen.iter_mut().flatten() {
        *at = (*at).min(t.total);
    }
    Ok(t)
}

/// Collects runs by measurement name, in first-seen order.
#[derive(Debug, Default)]
struct Rows(Vec<BootRow>);

impl Rows {
    fn push(&mut self, name: &str, v: Option<Duration>) {
        let s = v.map(|d| d.as_secs_f64());
        match self.0.iter_mut().find(|r| r.name == name) {
            Some(r) => r.runs_s.push(s),
            None => self.0.push(BootRow {
                name: name.into(),
                runs_s: vec![s],
                median_s: None,
            }),
        }
    }

    fn finish(mut self) -> Vec<BootRow> {
        for r in &mut self.0 {
            r.median_s = median(r.runs_s.iter().flatten().copied().collect());
        }
        self.0
    }
}

/// `lull / qemu` of the medians of two rows, where both exist.
pub fn ratio(rows: &[BootRow], lull: &str, qemu: &str) -> Option<f64> {
    let m = |name: &str| rows.iter().find(|r| r.name == name)?.median_s;
    Some(m(lull)? / m(qemu)?).filter(|r| r.is_finite())
}

/// What every run of the experiment needs: the VMMs, the kit's Linux, where consoles go.
struct Plan {
    lull: PathBuf,
    qemu: Option<String>,
    /// The kit's Linux and its command line for this host.
    linux: kit::DefaultGuest,
    cmdline: String,
    work: PathBuf,
}

impl Plan {
    fn lull(&self, kernel: &Path, cpus: u32) -> Command {
        let mut c = Command::new(&self.lull);
        c.arg("run")
            .arg("--kernel")
            .arg(kernel)
            .args(["--cpus", &cpus.to_string()])
            .args(["--memory", &format!("{GUEST_MIB}M")]);
        c
    }

    fn qemu(&self, qemu: &str, kernel: &Path, cpus: u32) -> Command {
        let mut c = qemu::command(qemu, cpus, GUEST_MIB);
        if Path::new(qemu::QBOOT).is_file() {
            c.args(["-bios", qemu::QBOOT]);
        }
        c.args(["-serial", "stdio", "-kernel"]).arg(kernel);
        c
    }

    /// `c` (lull's or QEMU's) given the kit's Linux initramfs and command line.
    fn with_linux(&self, mut c: Command, qemu: bool) -> Command {
        if let Some(initrd) = &self.linux.initramfs {
            c.arg(if qemu { "-initrd" } else { "--initramfs" })
                .arg(initrd);
        }
        c.arg(if qemu { "-append" } else { "--cmdline" })
            .arg(&self.cmdline);
        c
    }

    /// The console log of the run `name`.
    fn log(&self, name: &str) -> PathBuf {
        self.work
            .join(format!("boot-{}.console", name.replace(' ', "-")))
    }
}

/// A run that did not end as the guest asked (status 1), as a failure line.
fn check(name: &str, t: &Timed, failures: &mut Vec<String>) {
    if t.code != Some(1) {
        failures.push(format!("{name}: exit status {:?}", t.code));
    }
}

/// Runs the boot experiment; `Ok(false)` if some run failed.
pub fn run(args: &BootArgs) -> Result<bool, BenchError> {
    let hello = guest_path("hello", args.common.kit.as_ref())?;
    let kit_dir = args.common.kit.clone().unwrap_or_else(kit::kit_dir);
    let linux = kit::default_guest_in(&kit_dir).map_err(BenchError::Kit)?;
    let cmdline = kit::default_cmdline(
        linux.cmdline.as_deref(),
        linux.cmdline_pvm.as_deref(),
        kit::host_is_pvm(),
    );
    let lull = lull_binary(args.common.lull.as_ref())?;
    let plan = Plan {
        lull,
        qemu: qemu::installed(&args.qemu).then(|| args.qemu.clone()),
        linux,
        cmdline,
        work: work_dir(args.common.work_dir.as_ref())?,
    };
    eprintln!("bench: boot, consoles in {}", plan.work.display());
    if plan.qemu.is_none() {
        eprintln!("bench: {} is not installed: lull rows only", args.qemu);
    }
    let mut rows = Rows::default();
    let mut failures = Vec::new();
    hello_runs(&plan, &hello, args.reps, &mut rows, &mut failures)?;
    let rss = lull_rss(&plan, &mut failures)?;
    linux_runs(&plan, args.linux_reps, &mut rows, &mut failures)?;
    let results = rows.finish();
    let report = BootReport {
        schema: BOOT_SCHEMA.into(),
        host: host::host_info(),
        qemu: plan.qemu.is_some(),
        ratios: ratios(&results),
        results,
        rss,
        failures,
    };
    print_report(&report);
    if let Some(path) = &args.common.json {
        write_json(path, &report)?;
    }
    Ok(report.failures.is_empty())
}

/// `reps` boots of `hello` (1 vCPU) in lull, then in QEMU where it is installed.
fn hello_runs(
    plan: &Plan,
    hello: &Path,
    reps: u32,
    rows: &mut Rows,
    failures: &mut Vec<String>,
) -> Result<(), BenchError> {
    for rep in 1..=reps {
        eprintln!("bench: boot: hello {rep}/{reps}");
        let mut vmms = vec![("lull", plan.lull(hello, 1))];
        if let Some(q) = &plan.qemu {
            vmms.push(("qemu", plan.qemu(q, hello, 1)));
        }
        for (vmm, cmd) in vmms {
            let name = format!("hello {vmm}");
            let t = timed_run(cmd, &plan.log(&format!("{name}-{rep}")), &[], None)?;
            check(&name, &t, failures);
            rows.push(&name, Some(t.total));
        }
    }
    Ok(())
}

/// lull's memory beside a 1-vCPU Linux guest, read as its kernel reaches the first marker.
fn lull_rss(plan: &Plan, failures: &mut Vec<String>) -> Result<Option<BootRss>, BenchError> {
    eprintln!("bench: boot: lull's memory beside a 1-vCPU Linux guest");
    let t = timed_run(
        plan.with_linux(plan.lull(&plan.linux.kernel, 1), false),
        &plan.log("rss"),
        &LINUX_MARKERS[..1],
        Some(GUEST_MIB << 20),
    )?;
    let rss = t.rss.map(|(guest, other)| BootRss {
        guest_ram_kib: guest,
        lull_kib: other,
    });
    if rss.is_none() {
        failures.push(format!("rss: no reading (status {:?})", t.code));
    }
    Ok(rss)
}

/// `reps` boots of the kit's Linux (2 vCPUs) in lull's two irqchips and QEMU, each timed to
/// every marker and to its exit.
fn linux_runs(
    plan: &Plan,
    reps: u32,
    rows: &mut Rows,
    failures: &mut Vec<String>,
) -> Result<(), BenchError> {
    let kernel = &plan.linux.kernel;
    for rep in 1..=reps {
        let mut configs = vec![
            ("lull-user", {
                let mut c = plan.with_linux(plan.lull(kernel, 2), false);
                c.args(["--irqchip", "user"]);
                c
            }),
            ("lull-kernel", {
                let mut c = plan.with_linux(plan.lull(kernel, 2), false);
                c.args(["--irqchip", "kernel"]);
                c
            }),
        ];
        if let Some(q) = &plan.qemu {
            configs.push(("qemu", plan.with_linux(plan.qemu(q, kernel, 2), true)));
        }
        for (name, cmd) in configs {
            eprintln!("bench: boot: linux {name} {rep}/{reps}");
            let t = timed_run(
                cmd,
                &plan.log(&format!("linux-{name}-{rep}")),
                &LINUX_MARKERS,
                None,
            )?;
            rows.push(&format!("linux {name} exit"), Some(t.total));
            for (m, at) in LINUX_MARKERS.iter().zip(&t.seen) {
                rows.push(&format!("linux {name} '{m}'"), *at);
                if at.is_none() {
                    failures.push(format!("linux {name}: no {m:?} (status {:?})", t.code));
                }
            }
        }
    }
    Ok(())
}

/// lull's medians over QEMU's: hello, and the kit's Linux to each marker.
fn ratios(results: &[BootRow]) -> Vec<(String, f64)> {
    let mut ratios = Vec::new();
    if let Some(r) = ratio(results, "hello lull", "hello qemu") {
        ratios.push(("hello (lull/qemu)".to_string(), r));
    }
    for name in ["lull-user", "lull-kernel"] {
        for m in LINUX_MARKERS {
            let (a, b) = (format!("linux {name} '{m}'"), format!("linux qemu '{m}'"));
            if let Some(r) = ratio(results, &a, &b) {
                ratios.push((format!("linux to '{m}' ({name}/qemu)"), r));
            }
        }
    }
    ratios
}

fn print_report(report: &BootReport) {
    let secs = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |s| format!("{s:.3}"));
    println!("{:<45} {:>10}  runs", "measurement", "median s");
    for r in &report.results {
        let runs: Vec<String> = r.runs_s.iter().map(|v| secs(*v)).collect();
        println!(
            "{:<45} {:>10}  {}",
            r.name,
            secs(r.median_s),
            runs.join(" ")
        );
    }
    for (name, r) in &report.ratios {
        println!("ratio {name}: {r:.3}");
    }
    if let Some(rss) = report.rss {
        println!(
            "lull RSS, 1 vCPU, {GUEST_MIB} MiB guest, after 'smp: Brought up': total {} KiB, \
             guest RAM {} KiB, lull's own {} KiB",
            rss.guest_ram_kib + rss.lull_kib,
            rss.guest_ram_kib,
            rss.lull_kib
        );
    }
    for f in &report.failures {
        println!("  failed: {f}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_found_across_reads() {
        let mut s = MarkerScanner::new(&LINUX_MARKERS);
        assert_eq!(s.feed(b"[ 0.1] smp: Bro"), Vec::<usize>::new());
        assert_eq!(s.feed(b"ught up 1 node, 2 CPUs\n"), vec![0]);
        assert_eq!(
            s.feed(b"smp: Brought up again\nRun /init as init process\n"),
            vec![1]
        );
        assert!(s.tail.len() <= "Run /init as init process".len());
    }

    #[test]
    fn multibyte_text_does_not_break_the_scanner() {
        let mut s = MarkerScanner::new(&["ok"]);
        assert!(s.feed("ééééé".as_bytes()).is_empty());
        assert_eq!(s.feed(b"ok"), vec![0]);
    }

    #[test]
    fn rows_keep_run_order_and_medians() {
        let mut rows = Rows::default();
        for (name, ms) in [("hello lull", 30), ("hello qemu", 60), ("hello lull", 10)] {
            rows.push(name, Some(Duration::from_millis(ms)));
        }
        rows.push("hello lull", Some(Duration::from_millis(20)));
        rows.push("linux qemu 'x'", None);
        let rows = rows.finish();
        assert_eq!(rows[0].runs_s, vec![Some(0.03), Some(0.01), Some(0.02)]);
        assert_eq!(rows[0].median_s, Some(0.02));
        assert_eq!(rows[2].median_s, None);
        assert_eq!(ratio(&rows, "hello lull", "hello qemu"), Some(0.02 / 0.06));
        assert_eq!(ratio(&rows, "hello lull", "linux qemu 'x'"), None);
    }

    #[test]
    fn a_timed_run_sees_markers_and_the_exit() {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo 'smp: Brought up 1 node'; echo 'Run /init as init process'; exit 1",
        ]);
        let log = std::env::temp_dir().join(format!("boot-test-{}.console", std::process::id()));
        let t = timed_run(c, &log, &LINUX_MARKERS, None).unwrap();
        assert_eq!(t.code, Some(1));
        assert!(t.seen.iter().all(Option::is_some), "{t:?}");
        assert!(
            t.seen[0] <= t.seen[1],
            "markers arrive in console order: {t:?}"
        );
        let console = std::fs::read_to_string(&log).unwrap();
        assert!(
            console.ends_with("Run /init as init process\n"),
            "{console}"
        );
        std::fs::remove_file(&log).unwrap();
    }
}
