//! A fleet of VMM processes started together: launch, watch until every one has booted and
//! exited, sample `/proc` meanwhile, and pick the steady-state window in which all of them ran.
//!
//! Host CPU time and context switches are rates over that window (all VMs booted, none has
//! begun its final report or exited), so boot, BIOS, the guests' report printing and exit do
//! not count; the same measurement applies to lull and QEMU alike.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::proc_sample::{self, ProcSample};
use super::progress::Progress;
use super::BenchError;

/// One VM of the fleet: the command and where its console goes.
#[derive(Debug)]
pub struct VmSpec {
    /// The VMM command, ready to spawn (stdin, stdout and stderr are set here).
    pub command: Command,
    /// The serial console log the VMM writes.
    pub serial: PathBuf,
    /// Where the VMM's own stdout and stderr go.
    pub stderr: PathBuf,
}

/// What became of one VM.
#[derive(Debug, Clone)]
pub struct VmOutcome {
    /// Exit code (`None`: killed at the deadline or by a signal).
    pub code: Option<i32>,
    /// Largest `VmRSS` seen (KiB).
    pub max_rss_kib: u64,
    /// Guest RAM part of the resident memory at the start of the window (KiB), if read.
    pub guest_rss_kib: Option<u64>,
    /// The rest of the resident memory at that point (KiB), if read.
    pub vmm_rss_kib: Option<u64>,
    /// Serial console text.
    pub console: String,
    /// The VMM's stdout and stderr.
    pub stderr: String,
}

/// Host counters of the whole fleet over its steady-state window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Window {
    /// Length in seconds (0 if no window was found).
    pub seconds: f64,
    /// Sum of the deltas of every process.
    pub delta: ProcSample,
}

/// The result of a fleet run.
#[derive(Debug, Clone)]
pub struct FleetRun {
    /// Per VM, in launch order.
    pub vms: Vec<VmOutcome>,
    /// The steady-state window.
    pub window: Window,
}

/// How to watch the fleet.
#[derive(Debug, Clone)]
pub struct Watch {
    /// A VM has booted when its console contains this.
    pub boot_marker: String,
    /// A VM's measured phase is over once its console contains this (its report begins);
    /// the window ends before the first VM gets there.
    pub end_marker: Option<String>,
    /// Guest RAM size, to split RSS.
    pub guest_bytes: u64,
    /// Kill whatever still runs after this long.
    pub deadline: Duration,
    /// Wait this long after the last boot before the window starts.
    pub settle: Duration,
    /// Label for progress lines.
    pub label: String,
    /// About how long the run should take (the progress bar's length).
    pub expected: Duration,
}

const SAMPLE_EVERY: Duration = Duration::from_millis(250);

struct Member {
    child: Child,
    pid: u32,
    serial: PathBuf,
    stderr: PathBuf,
    booted: bool,
    finished: bool,
    code: Option<Option<i32>>,
    max_rss: u64,
    split: Option<(u64, u64)>,
}

fn sum(samples: &[ProcSample]) -> ProcSample {
    samples
        .iter()
        .fold(ProcSample::default(), |a, s| ProcSample {
            cpu_ns: a.cpu_ns + s.cpu_ns,
            voluntary: a.voluntary + s.voluntary,
            nonvoluntary: a.nonvoluntary + s.nonvoluntary,
            rss_kib: a.rss_kib + s.rss_kib,
        })
}

/// Launches every VM at once, watches them to the end, returns what each did and the window.
pub fn run(specs: Vec<VmSpec>, watch: &Watch) -> Result<FleetRun, BenchError> {
    let start = Instant::now();
    let mut members = Vec::with_capacity(specs.len());
    for mut spec in specs {
        let out = File::create(&spec.stderr).map_err(|e| BenchError::Io(spec.stderr.clone(), e))?;
        let err = out
            .try_clone()
            .map_err(|e| BenchError::Io(spec.stderr.clone(), e))?;
        let child = spec
            .command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| BenchError::Spawn(format!("{:?}", spec.command.get_program()), e))?;
        members.push(Member {
            pid: child.id(),
            child,
            serial: spec.serial,
            stderr: spec.stderr,
            booted: false,
            finished: false,
            code: None,
            max_rss: 0,
            split: None,
        });
    }
    let n = members.len();
    let mut all_booted_at: Option<Instant> = None;
    let mut window_start: Option<(Instant, Vec<ProcSample>)> = None;
    let mut window_end: Option<(Instant, Vec<ProcSample>)> = None;
    let mut any_exited = false;
    let mut progress = Progress::start(&watch.label, watch.expected);
    loop {
        let now = Instant::now();
        let mut round = Vec::with_capacity(n);
        for m in &mut members {
            if m.code.is_none() {
                if let Ok(Some(status)) = m.child.try_wait() {
                    m.code = Some(status.code());
                    any_exited = true;
                }
            }
            if !m.booted || !m.finished {
                let console = std::fs::read_to_string(&m.serial).unwrap_or_default();
                m.booted = console.contains(&watch.boot_marker);
                m.finished = watch
                    .end_marker
                    .as_ref()
                    .is_some_and(|end| console.contains(end.as_str()));
            }
            let s = if m.code.is_none() {
                proc_sample::sample(m.pid)
            } else {
                None
            };
            if let Some(s) = s {
                m.max_rss = m.max_rss.max(s.rss_kib);
            }
            round.push(s);
        }
        let booted = members.iter().filter(|m| m.booted).count();
        let exited = members.iter().filter(|m| m.code.is_some()).count();
        if all_booted_at.is_none() && booted == n {
            all_booted_at = Some(now);
        }
        let all_alive =
            !any_exited && !members.iter().any(|m| m.finished) && round.iter().all(Option::is_some);
        if all_alive {
            let full: Vec<ProcSample> = round.iter().flatten().copied().collect();
            match (&window_start, all_booted_at) {
                (None, Some(t)) if now >= t + watch.settle => {
                    for m in &mut members {
                        m.split = proc_sample::rss_split_kib(m.pid, watch.guest_bytes);
                    }
                    window_start = Some((now, full));
                }
                (Some(_), _) => window_end = Some((now, full)),
                _ => {}
            }
        }
        if exited == n {
            break;
        }
        if now.duration_since(start) > watch.deadline {
            for m in members.iter_mut().filter(|m| m.code.is_none()) {
                let _ = m.child.kill();
                m.code = Some(m.child.wait().ok().and_then(|s| s.code()));
            }
            progress.println(&format!(
                "bench: {}: deadline of {:?} passed: killed {} VM(s)",
                watch.label,
                watch.deadline,
                n - exited
            ));
            break;
        }
        progress.update(now.duration_since(start), booted, exited, n);
        std::thread::sleep(SAMPLE_EVERY);
    }
    progress.finish();
    let window = match (window_start, window_end) {
        (Some((t0, a)), Some((t1, b))) if t1 > t0 => {
            let (a, b) = (sum(&a), sum(&b));
            Window {
                seconds: t1.duration_since(t0).as_secs_f64(),
                delta: ProcSample {
                    cpu_ns: b.cpu_ns.saturating_sub(a.cpu_ns),
                    voluntary: b.voluntary.saturating_sub(a.voluntary),
                    nonvoluntary: b.nonvoluntary.saturating_sub(a.nonvoluntary),
                    rss_kib: b.rss_kib,
                },
            }
        }
        _ => Window::default(),
    };
    let vms = members
        .into_iter()
        .map(|m| VmOutcome {
            code: m.code.flatten(),
            max_rss_kib: m.max_rss,
            guest_rss_kib: m.split.map(|s| s.0),
            vmm_rss_kib: m.split.map(|s| s.1),
            console: std::fs::read_to_string(&m.serial).unwrap_or_default(),
            stderr: std::fs::read_to_string(&m.stderr).unwrap_or_default(),
        })
        .collect();
    Ok(FleetRun { vms, window })
}
