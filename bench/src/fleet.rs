//! A fleet of VMM processes started together (or one after the other, each once the one
//! before has booted): launch, watch until every one has booted and exited, sample `/proc` meanwhile, and pick the steady-state window in which all of them ran.
//!
//! Host CPU time and context switches are rates over that window (all VMs booted, none has
//! begun its final report or exited), so boot, BIOS, the guests' report printing and exit do
//! not count; the same measurement applies to lull and QEMU alike.
//!
//! Two ways to place the window:
//! - steady (the synthetic guests, which boot in a second): it opens `settle` after the last
//!   VM has booted and closes at the last sample before any VM ends its measured phase;
//! - planned (guests whose workload of fixed length follows a long boot, see `window.rs`): it
//!   opens once every VM has started (+ settle) and closes at a time fixed then, before the
//!   first workload ends.
//!
//! A VM given an API socket is driven through lull's management API (`api_client.rs`): the
//! fleet boots it once the socket appears, reads its live counters as the window opens and
//! as it closes (so lull's own counts are differenced over the window too), and ends lull
//! once its VM has stopped. Nothing is asked of the API while the window is open: a request
//! wakes lull's main thread, which the window would count.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lull_schema::RunReport;

use super::api_client::ApiVm;
use super::error::BenchError;
use super::proc_sample::{self, ProcSample, Rollup};
use super::progress::Progress;
use super::window::{self, WindowError, WindowPlan, WindowRule};

/// One VM of the fleet: the command and where its console goes.
#[derive(Debug)]
pub struct VmSpec {
    /// The VMM command, ready to spawn (stdin, stdout and stderr are set here).
    pub command: Command,
    /// The serial console log the VMM writes.
    pub serial: PathBuf,
    /// Where the VMM's own stdout and stderr go.
    pub stderr: PathBuf,
    /// lull's management API socket (`--api-socket`), if the VM is to be driven through it.
    pub api: Option<PathBuf>,
    /// With `api`: the `vm.restore` body (resuming) that starts the VM instead of `vm.boot`.
    pub restore: Option<String>,
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
    /// lull's live counters (`vm.counters`) as the window opened and as it closed (API VMs).
    pub counters: Option<(RunReport, RunReport)>,
    /// What went wrong with its API, if anything.
    pub api_error: Option<String>,
    /// A restored VM: its `vm.restore` to running, ms.
    pub restore_ms: Option<f64>,
    /// Its memory as the window opened (`/proc/PID/smaps_rollup`), if read.
    pub rollup: Option<Rollup>,
    /// Its VMM's threads as the window opened, if read.
    pub threads: Option<u64>,
}

/// Host counters of the whole fleet over its steady-state window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Window {
    /// Length in seconds (0 if no window was found).
    pub seconds: f64,
    /// Sum of the deltas of every process.
    pub delta: ProcSample,
    /// When it opened and closed (`None` if no window was found).
    pub span: Option<(Instant, Instant)>,
}

/// The result of a fleet run.
#[derive(Debug, Clone)]
pub struct FleetRun {
    /// Per VM, in launch order.
    pub vms: Vec<VmOutcome>,
    /// The steady-state window.
    pub window: Window,
    /// Where a planned window was placed, or why there was none (`None`: steady window, or
    /// not every VM booted).
    pub plan: Option<Result<WindowPlan, WindowError>>,
    /// Why a planned window closed before its time, if it did.
    pub cut: Option<String>,
    /// The host's `MemAvailable` before the first VM started and as the window opened, KiB.
    pub mem_available_kib: (Option<u64>, Option<u64>),
}

impl FleetRun {
    /// The mean over the VMs of what `f` reads (VMs where it reads nothing left out; `None`
    /// if none has it).
    pub fn mean(&self, f: impl Fn(&VmOutcome) -> Option<u64>) -> Option<f64> {
        let v: Vec<u64> = self.vms.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<u64>() as f64 / v.len() as f64)
    }
}

/// How to watch the fleet.
#[derive(Debug, Clone)]
pub struct Watch {
    /// A VM has booted when its console contains this.
    pub boot_marker: String,
    /// A VM's measured phase is over once its console contains one of these (its report
    /// begins); the window ends before the first VM gets there.
    pub end_markers: Vec<String>,
    /// Guest RAM size, to split RSS.
    pub guest_bytes: u64,
    /// Kill whatever still runs after this long.
    pub deadline: Duration,
    /// Wait this long after the last boot before the window starts.
    pub settle: Duration,
    /// Place the window by this rule (`window.rs`) instead of the steady one.
    pub planned: Option<WindowRule>,
    /// Launch the VMs one after the other, each once the one before has booted, instead of
    /// all at once (guests whose boot is long and spins on sibling vCPUs: several booting
    /// together on few host cores can starve each other for minutes).
    pub stagger: bool,
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
    booted: Option<Duration>,
    finished: bool,
    code: Option<Option<i32>>,
    max_rss: u64,
    split: Option<(u64, u64)>,
    rollup: Option<Rollup>,
    threads: Option<u64>,
    api: Option<ApiVm>,
}

/// The instant of a sample and every VMM's counters then.
type FleetSample = (Instant, Vec<ProcSample>);

/// Where the window is, as the run goes.
enum Phase {
    /// Not open yet.
    Before,
    /// Open since this sample; the last sample at which every VM was still in its phase.
    Open {
        start: FleetSample,
        last: Option<FleetSample>,
        plan: Option<WindowPlan>,
    },
    /// Closed (or never to open): the samples at its two edges, if it had any.
    Closed(Option<(FleetSample, FleetSample)>),
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

/// Spawns one VM.
fn launch(mut spec: VmSpec) -> Result<Member, BenchError> {
    let out = File::create(&spec.stderr).map_err(|e| BenchError::Io(spec.stderr.clone(), e))?;
    let err = out
        .try_clone()
        .map_err(|e| BenchError::Io(spec.stderr.clone(), e))?;
    let child = crate::children::guard(&mut spec.command)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| BenchError::Spawn(format!("{:?}", spec.command.get_program()), e))?;
    Ok(Member {
        pid: child.id(),
        child,
        serial: spec.serial,
        stderr: spec.stderr,
        booted: None,
        finished: false,
        code: None,
        max_rss: 0,
        split: None,
        rollup: None,
        threads: None,
        api: spec.api.map(|socket| ApiVm::starting(socket, spec.restore)),
    })
}

/// Samples every live member now (`None` for one that has exited).
fn sample_all(members: &[Member]) -> Vec<Option<ProcSample>> {
    members
        .iter()
        .map(|m| {
            if m.code.is_none() {
                proc_sample::sample(m.pid)
            } else {
                None
            }
        })
        .collect()
}

/// Launches every VM at once, watches them to the end, returns what each did and the window.
pub fn run(specs: Vec<VmSpec>, watch: &Watch) -> Result<FleetRun, BenchError> {
    let start = Instant::now();
    let mem_before = proc_sample::mem_available_kib();
    let n = specs.len();
    let mut pending = specs.into_iter();
    let mut members = launch_first(&mut pending, watch.stagger)?;
    let mut tracker = WindowTracker {
        phase: Phase::Before,
        plan: None,
        cut: None,
        all_booted_at: None,
        mem_available_at_open: None,
    };
    let mut any_exited = false;
    let mut progress = Progress::start(&watch.label, watch.expected);
    loop {
        let now = Instant::now();
        let since = now.duration_since(start);
        let open = matches!(tracker.phase, Phase::Open { .. });
        any_exited |= poll_members(&mut members, watch, since, open);
        launch_next(&mut members, &mut pending)?;
        let samples = sample_round(&mut members);
        let booted = members.iter().filter(|m| m.booted.is_some()).count();
        let exited = members.iter().filter(|m| m.code.is_some()).count();
        if tracker.all_booted_at.is_none() && booted == n {
            tracker.all_booted_at = Some(now);
        }
        let round = Round {
            now,
            since,
            all_alive: !any_exited
                && !members.iter().any(|m| m.finished)
                && samples.iter().all(Option::is_some),
            samples,
        };
        tracker.advance(&mut members, watch, &round);
        if exited == n {
            break;
        }
        if since > watch.deadline {
            kill_remaining(&mut members);
            progress.println(&format!(
                "bench: {}: deadline of {:?} passed: killed {} VM(s)",
                watch.label,
                watch.deadline,
                n - exited
            ));
            break;
        }
        progress.update(since, booted, exited, n);
        std::thread::sleep(tracker.next_sleep(since));
    }
    progress.finish();
    Ok(FleetRun {
        vms: outcomes(members, pending),
        window: window_of(tracker.phase),
        plan: tracker.plan,
        cut: tracker.cut,
        mem_available_kib: (mem_before, tracker.mem_available_at_open),
    })
}

/// Launches the first VM (staggered) or all of them.
fn launch_first(
    pending: &mut std::vec::IntoIter<VmSpec>,
    stagger: bool,
) -> Result<Vec<Member>, BenchError> {
    let mut members = Vec::with_capacity(pending.len());
    if stagger {
        members.extend(pending.next().map(launch).transpose()?);
    } else {
        for spec in pending.by_ref() {
            members.push(launch(spec)?);
        }
    }
    Ok(members)
}

/// Notes which members have exited, booted and finished their measured phase, and drives
/// the API VMs while the window is shut; returns whether one exited.
fn poll_members(members: &mut [Member], watch: &Watch, since: Duration, open: bool) -> bool {
    let mut any_exited = false;
    for m in members {
        if m.code.is_none() {
            if let Ok(Some(status)) = m.child.try_wait() {
                m.code = Some(status.code());
                any_exited = true;
            }
        }
        if m.booted.is_none() || !m.finished {
            let console = std::fs::read_to_string(&m.serial).unwrap_or_default();
            if m.booted.is_none() && console.contains(&watch.boot_marker) {
                m.booted = Some(since);
            }
            m.finished = watch
                .end_markers
                .iter()
                .any(|end| console.contains(end.as_str()));
        }
        let driven = match (&mut m.api, m.code, open) {
            (Some(api), None, false) => api.chores(),
            _ => true,
        };
        if !driven {
            let _ = m.child.kill();
        }
    }
    any_exited
}

/// Staggered: the next VM once the last one launched has booted (or ended).
fn launch_next(
    members: &mut Vec<Member>,
    pending: &mut std::vec::IntoIter<VmSpec>,
) -> Result<(), BenchError> {
    if members
        .last()
        .is_some_and(|m| m.booted.is_some() || m.code.is_some())
    {
        if let Some(spec) = pending.next() {
            members.push(launch(spec)?);
        }
    }
    Ok(())
}

/// Samples every live member now and keeps each one's largest RSS.
fn sample_round(members: &mut [Member]) -> Vec<Option<ProcSample>> {
    let samples = sample_all(members);
    for (m, s) in members.iter_mut().zip(&samples) {
        if let Some(s) = s {
            m.max_rss = m.max_rss.max(s.rss_kib);
        }
    }
    samples
}

/// Kills what still runs at the deadline and reaps it.
fn kill_remaining(members: &mut [Member]) {
    for m in members.iter_mut().filter(|m| m.code.is_none()) {
        let _ = m.child.kill();
        m.code = Some(m.child.wait().ok().and_then(|s| s.code()));
    }
}

/// One sample round, as the window sees it.
struct Round {
    now: Instant,
    /// Since the fleet started.
    since: Duration,
    /// No VM has exited or finished its measured phase, and every VMM's /proc was read.
    all_alive: bool,
    /// Every member's /proc now (`None` for one that has exited or could not be read).
    samples: Vec<Option<ProcSample>>,
}

impl Round {
    /// The sample of this round (the members that were read).
    fn fleet_sample(&self) -> FleetSample {
        (self.now, self.samples.iter().flatten().copied().collect())
    }
}

/// Where the window stands, and what the run will report of it.
struct WindowTracker {
    phase: Phase,
    /// A planned window's place, or why there is none.
    plan: Option<Result<WindowPlan, WindowError>>,
    /// Why a planned window closed before its time.
    cut: Option<String>,
    /// When every VM had booted.
    all_booted_at: Option<Instant>,
    /// The host's `MemAvailable` as the window opened, KiB.
    mem_available_at_open: Option<u64>,
}

impl WindowTracker {
    /// Moves the window on by one sample round.
    fn advance(&mut self, members: &mut [Member], watch: &Watch, r: &Round) {
        self.phase = match std::mem::replace(&mut self.phase, Phase::Before) {
            Phase::Before => self.before(members, watch, r),
            Phase::Open { start, last, plan } => self.open(members, r, start, last, plan),
            closed @ Phase::Closed(_) => closed,
        };
    }

    /// Before the window: open it (steady: `settle` after the last boot; planned: at the
    /// planned start), or give up on it.
    fn before(&mut self, members: &mut [Member], watch: &Watch, r: &Round) -> Phase {
        match (self.all_booted_at, watch.planned) {
            (Some(t), None) if r.all_alive && r.now >= t + watch.settle => {
                self.mem_available_at_open = proc_sample::mem_available_kib();
                open_window(members, watch, r.now, None)
            }
            (Some(_), Some(rule)) if self.plan.is_none() => {
                let starts: Vec<Duration> = members.iter().filter_map(|m| m.booted).collect();
                match window::plan(&starts, &rule) {
                    // A VM ended before the last one started: their workloads never overlapped.
                    Ok(p) if members.iter().any(|m| m.finished) => {
                        self.plan = Some(Err(WindowError::NoOverlap(p.spread)));
                        Phase::Closed(None)
                    }
                    Ok(p) if r.all_alive && r.since >= p.start => {
                        self.plan = Some(Ok(p));
                        self.mem_available_at_open = proc_sample::mem_available_kib();
                        open_window(members, watch, r.now, Some(p))
                    }
                    Ok(_) => Phase::Before,
                    Err(e) => {
                        self.plan = Some(Err(e));
                        Phase::Closed(None)
                    }
                }
            }
            _ => Phase::Before,
        }
    }

    /// An open window: grow it while every VM is in its phase, close it at its planned end
    /// or when one leaves.
    fn open(
        &mut self,
        members: &mut [Member],
        r: &Round,
        start: FleetSample,
        last: Option<FleetSample>,
        plan: Option<WindowPlan>,
    ) -> Phase {
        match plan {
            // Steady: the window grows while every VM is in its phase.
            None if r.all_alive => Phase::Open {
                start,
                last: Some(r.fleet_sample()),
                plan,
            },
            None => Phase::Closed(last.map(|l| (start, l))),
            Some(p) if r.all_alive && r.since >= p.end => {
                let end = r.fleet_sample();
                for api in members.iter_mut().filter_map(|m| m.api.as_mut()) {
                    api.at_end = api.counters();
                }
                Phase::Closed(Some((start, end)))
            }
            Some(_) if r.all_alive => Phase::Open {
                start,
                last: Some(r.fleet_sample()),
                plan,
            },
            Some(_) => {
                self.cut = Some(
                    match members.iter().position(|m| m.finished || m.code.is_some()) {
                        Some(i) => format!("vm{i} ended its workload before the window's end"),
                        None => "a VMM's /proc could not be read".to_string(),
                    },
                );
                Phase::Closed(last.map(|l| (start, l)))
            }
        }
    }

    /// How long to sleep before the next round: a planned window's edges are kept to the
    /// sampling period's precision or better.
    fn next_sleep(&self, since: Duration) -> Duration {
        let next_edge = match (&self.phase, &self.plan) {
            (Phase::Before | Phase::Open { .. }, Some(Ok(p))) => [p.start, p.end]
                .into_iter()
                .filter(|&t| t > since)
                .min()
                .map(|t| t - since),
            _ => None,
        };
        next_edge.map_or(SAMPLE_EVERY, |d| d.min(SAMPLE_EVERY))
    }
}

/// The fleet's counters over the window the run ended with.
fn window_of(phase: Phase) -> Window {
    let edges = match phase {
        Phase::Closed(edges) => edges,
        // The run ended with the window open (the last VM exited, or the deadline).
        Phase::Open { start, last, .. } => last.map(|l| (start, l)),
        Phase::Before => None,
    };
    match edges {
        Some(((t0, a), (t1, b))) if t1 > t0 => {
            let (a, b) = (sum(&a), sum(&b));
            Window {
                seconds: t1.duration_since(t0).as_secs_f64(),
                delta: ProcSample {
                    cpu_ns: b.cpu_ns.saturating_sub(a.cpu_ns),
                    voluntary: b.voluntary.saturating_sub(a.voluntary),
                    nonvoluntary: b.nonvoluntary.saturating_sub(a.nonvoluntary),
                    rss_kib: b.rss_kib,
                },
                span: Some((t0, t1)),
            }
        }
        _ => Window::default(),
    }
}

/// What became of every VM, in launch order; those never launched last.
fn outcomes(members: Vec<Member>, pending: std::vec::IntoIter<VmSpec>) -> Vec<VmOutcome> {
    members
        .into_iter()
        .map(|m| {
            let (counters, api_error, restore_ms) = match m.api {
                Some(api) => (api.at_start.zip(api.at_end), api.error, api.restore_ms),
                None => (None, None, None),
            };
            VmOutcome {
                code: m.code.flatten(),
                max_rss_kib: m.max_rss,
                guest_rss_kib: m.split.map(|s| s.0),
                vmm_rss_kib: m.split.map(|s| s.1),
                console: std::fs::read_to_string(&m.serial).unwrap_or_default(),
                stderr: std::fs::read_to_string(&m.stderr).unwrap_or_default(),
                counters,
                api_error,
                restore_ms,
                rollup: m.rollup,
                threads: m.threads,
            }
        })
        .chain(pending.map(|spec| VmOutcome {
            code: None,
            max_rss_kib: 0,
            guest_rss_kib: None,
            vmm_rss_kib: None,
            console: String::new(),
            stderr: format!(
                "not launched: the VM before it had not booted by the deadline ({})",
                spec.serial.display()
            ),
            counters: None,
            api_error: None,
            restore_ms: None,
            rollup: None,
            threads: None,
        }))
        .collect()
}

/// Opens the window now: lull's counters first (the requests' own cost stays outside), then
/// every VMM's /proc, and the memory split.
fn open_window(
    members: &mut [Member],
    watch: &Watch,
    now: Instant,
    plan: Option<WindowPlan>,
) -> Phase {
    for api in members.iter_mut().filter_map(|m| m.api.as_mut()) {
        api.at_start = api.counters();
    }
    for m in members.iter_mut() {
        m.split = proc_sample::rss_split_kib(m.pid, watch.guest_bytes);
        m.rollup = proc_sample::rollup(m.pid);
        m.threads = proc_sample::threads(m.pid);
    }
    let at = Instant::now().max(now);
    let samples = sample_all(members);
    if samples.iter().any(Option::is_none) {
        return Phase::Closed(None);
    }
    Phase::Open {
        start: (at, samples.into_iter().flatten().collect()),
        last: None,
        plan,
    }
}
