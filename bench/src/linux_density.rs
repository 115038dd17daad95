//! `lull bench density --guest linux`: N VMs of the kit's Linux at once, per workload and
//! mode, measured only while every kernel runs its in-kernel workload.
//!
//! ```text
//! per VM count N, per workload (idle, timers), per mode:
//!   start N VMs one after the other, each once the one before has started its workload
//!   (booting together, 4 kernels spun for minutes in stop_machine on 2 host cores):
//!                vmlinux (PVH), no initramfs, 32 MiB, the kit's command line +
//!                lull.workload=KIND,seconds=S,cpus=C   (S = window + boot spread + 5 s)
//!     lull: --api-socket; the fleet boots each VM through the API
//!     QEMU: -machine kernel-irqchip=on (qboot where installed)
//!   each kernel boots (30-200 s here), prints "lull-workload: start", runs S s, reports, exits
//!   window: opens 2 s after the last VM started, closes after the asked length or 3 s
//!           before the first VM's workload ends (window.rs); at each edge the fleet reads
//!           lull's live counters (vm.counters) and every VMM's /proc
//!   row: host CPU, context switches, halted-vCPU wake-ups and KVM exits over the window;
//!        the guests' loc, idle passes, IPIs, idle share and timer lateness over their
//!        workload (steady by then, so its rates stand for the window's)
//! ```
//!
//! Each workload is a separate experiment (its own VMs and rows): in one boot the kernel runs
//! one workload and leaves the VM, and a second boot per mode costs as much as the first.
//!
//! With `--clones` each (mode, slack, workload) boots one VM only, snapshotted once its
//! workload started (linux_snapshot.rs, the workload as long as the largest row needs); every
//! VM of its rows is a clone: `lull run --api-socket S`, then `vm.restore {resume, serial}`
//! (the memory file mapped copy-on-write), all started at once; each says "lull-workload:
//! restored count=N" when its window starts again after its own restore. The
//! rows add restore-to-running per clone and memory as the host sees it (PSS per VM, private
//! and shared, and the host's `MemAvailable` used per VM).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::common::{lull_binary, lull_has_flag, work_dir};
use super::density::{self, DensityArgs, Launch, Mode, Workload};
use super::density_power;
use super::error::BenchError;
use super::fleet::{self, FleetRun, VmOutcome, VmSpec, Watch};
use super::guest_output::LatencySummary;
use super::linux_snapshot::SnapshotSpec;
use super::lull_metrics::MetricsSum;
use super::power::{PowerWindow, Reading};
use super::proc_sample;
use super::qemu;
use super::report::{
    self, CloneRow, DensityReport, DensityRow, LinuxParams, LinuxRow, SkippedMode,
};
use super::spread::Spread;
use super::window::{self, WindowRule};
use super::workload_output::{self, parse_workload};
use super::workload_rates::GuestRates;

/// The window opens this long after the last VM started its workload.
const SETTLE: Duration = Duration::from_secs(2);
/// ... and closes at least this long before the first VM's workload ends.
const MARGIN: Duration = Duration::from_secs(3);
/// The boot spread allowed for by default, per VM beyond the first: the VMs boot one after
/// the other (a boot alone takes 20-40 s here at a host load of 2-4).
const SPREAD_PER_VM: Duration = Duration::from_secs(60);
/// ... and with `--clones`: the clones, started together, run their workloads again within a
/// second or so of each other (more on a loaded host: raise `--boot-spread`).
const CLONE_SPREAD_PER_VM: Duration = Duration::from_secs(1);
/// `--clones --max-vms`: the steps' workloads, in whole multiples of this many seconds.
const SHARED_WORKLOAD: u64 = 30;
/// A clone's workload has started its window again after its restore (`lull_workload.c`).
const RESTORED_MARKER: &str = "lull-workload: restored count=";

/// What every run of a `--guest linux` bench shares.
pub(crate) struct Plan<'a> {
    args: &'a DensityArgs,
    lull: PathBuf,
    kernel: PathBuf,
    /// The kit's command line without any `lull.workload=`.
    base_cmdline: String,
    global_timers: Option<&'a str>,
    /// Where the VMs' consoles, logs and snapshots go.
    pub(crate) work: PathBuf,
}

impl Plan<'_> {
    /// The kernel command line of one experiment.
    fn cmdline(&self, workload: Workload, seconds: u64) -> String {
        self.cmdline_of(workload.name(), &seconds.to_string())
    }

    /// The kernel command line with `kind` and `seconds` as given (placeholders for the JSON).
    fn cmdline_of(&self, kind: &str, seconds: &str) -> String {
        let mut arg = format!("{kind},seconds={seconds},cpus={}", self.args.cpus);
        if !self.args.guest_args.trim().is_empty() {
            arg.push(',');
            arg.push_str(self.args.guest_args.trim());
        }
        format!("{} lull.workload={arg}", self.base_cmdline)
    }

    /// VM `i` of `e`: booted with `cmdline`, or a clone restored from `snapshot`.
    fn spec(&self, e: &Experiment, i: u32, cmdline: &str, snapshot: Option<&Path>) -> VmSpec {
        let (mode, workload, n) = (e.mode, e.workload, e.n);
        let slack = e.slack.as_deref();
        let slack_part = slack.map(|s| format!("-slack{s}")).unwrap_or_default();
        let stem = self.work.join(format!(
            "{}{slack_part}-{}-n{n}-vm{i}",
            mode.name(),
            workload.name()
        ));
        let serial = stem.with_extension("console");
        let metrics = stem.with_extension("json");
        let socket = stem.with_extension("sock");
        for stale in [&serial, &metrics, &socket] {
            let _ = std::fs::remove_file(stale);
        }
        if let Some(dir) = snapshot {
            let mut command = Command::new(&self.lull);
            command.arg("run").arg("--api-socket").arg(&socket);
            return VmSpec {
                command,
                restore: Some(restore_body(dir, &serial)),
                serial,
                stderr: stem.with_extension("stderr"),
                api: Some(socket),
            };
        }
        let launch = Launch {
            kernel: &self.kernel,
            cmdline,
            serial: &serial,
            metrics: &metrics,
        };
        let mut command = self
            .args
            .vm_command(mode, &self.lull, self.global_timers, &launch);
        if let Some(s) = slack {
            command.args(["--timer-slack", s]);
        }
        let api = if mode.is_qemu() {
            // qboot lists every vCPU in its MP table (SeaBIOS one per socket: 1 CPU for Linux).
            if Path::new(qemu::QBOOT).is_file() {
                command.args(["-bios", qemu::QBOOT]);
            }
            None
        } else {
            command.arg("--api-socket").arg(&socket);
            Some(socket)
        };
        VmSpec {
            command,
            serial,
            stderr: stem.with_extension("stderr"),
            api,
            restore: None,
        }
    }
}

/// The `vm.restore` of a clone: `dir`'s VM, resumed at once, its console into `serial`.
fn restore_body(dir: &Path, serial: &Path) -> String {
    serde_json::json!({
        "source_url": format!("file://{}", dir.display()),
        "resume": true,
        "serial": format!("file={}", serial.display()),
    })
    .to_string()
}

/// The snapshots the rows of `--clones` restore: one per mode, slack and workload, taken when
/// a row first needs it.
#[derive(Default)]
pub(crate) struct Snapshots {
    taken: Vec<(SnapshotKey, PathBuf)>,
}

/// What a snapshot of `--clones` is of: mode, slack, workload and its length (s).
type SnapshotKey = (Mode, Option<String>, Workload, u64);

impl Snapshots {
    /// The snapshot `e`'s clones restore: its VM booted with `e`'s workload, as long as its
    /// rule says, snapshotted as the workload starts (rows whose workloads are as long share
    /// it: `window_rule` rounds them up to whole minutes).
    fn get(&mut self, plan: &Plan, e: &Experiment) -> Result<PathBuf, BenchError> {
        let seconds = e.rule.workload.as_secs();
        let key = (e.mode, e.slack.clone(), e.workload, seconds);
        if let Some((_, dir)) = self.taken.iter().find(|(k, _)| *k == key) {
            return Ok(dir.clone());
        }
        let args = plan.args;
        let cmdline = plan.cmdline(e.workload, seconds);
        let lull_args = e.mode.vm_flags(plan.global_timers, e.slack.as_deref());
        let slack = e
            .slack
            .as_deref()
            .map(|s| format!("-slack{s}"))
            .unwrap_or_default();
        let name = format!("{}{slack}-{}-{seconds}s", e.mode.name(), e.workload.name());
        eprintln!("bench: {name}: booting the VM its clones restore ({seconds} s workload)");
        let dir = SnapshotSpec {
            lull: &plan.lull,
            kernel: &plan.kernel,
            cmdline: &cmdline,
            cpus: args.cpus,
            memory: &format!("{}K", args.memory_bytes() >> 10),
            lull_args,
            stem: plan.work.join(&name),
            boot_timeout: args.boot_timeout,
        }
        .take()
        .map_err(|why| BenchError::Snapshot(name, why))?;
        self.taken.push((key, dir.clone()));
        Ok(dir)
    }
}

/// The kit's Linux command line for this host without its `lull.workload=` word.
fn base_cmdline(linux: &kit::DefaultGuest) -> String {
    let full = kit::default_cmdline(
        linux.cmdline.as_deref(),
        linux.cmdline_pvm.as_deref(),
        kit::host_is_pvm(),
    );
    full.split_whitespace()
        .filter(|w| !w.starts_with("lull.workload="))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The boot spread allowed for with `n` VMs.
fn boot_spread(args: &DensityArgs, n: u32) -> Duration {
    let per_vm = if args.clones {
        CLONE_SPREAD_PER_VM
    } else {
        SPREAD_PER_VM
    };
    args.boot_spread.unwrap_or(per_vm * n.saturating_sub(1))
}

/// lull's counters over the window, summed over the VMs; `None` unless every VM has both
/// edges (a partial sum would read as a lower rate).
fn window_metrics(vms: &[VmOutcome]) -> Option<MetricsSum> {
    let mut sum = MetricsSum::default();
    for vm in vms {
        let (a, b) = vm.counters.as_ref()?;
        sum.merge(&MetricsSum::of(b).since(&MetricsSum::of(a)));
    }
    Some(sum)
}

/// Why the window is short or missing, if it is.
fn window_note(run: &FleetRun, rule: &WindowRule) -> Option<String> {
    match &run.plan {
        None => Some(
            "not every VM started its workload, or one stopped before the window opened"
                .into(),
        ),
        Some(Err(e)) => Some(e.to_string()),
        Some(Ok(_)) if run.cut.is_some() => run.cut.clone(),
        Some(Ok(p)) if !p.is_full(rule) => Some(format!(
            "the VMs started their workloads {:.0?} apart: the window is {:.1?} instead of {:.0?}; raise --boot-spread",
            p.spread,
            p.end - p.start,
            rule.length
        )),
        Some(Ok(_)) => None,
    }
}

struct Experiment {
    mode: Mode,
    /// `lull run --timer-slack` of its VMs, if given (`--timer-slack` of the bench).
    slack: Option<String>,
    workload: Workload,
    n: u32,
    rule: WindowRule,
}

/// What the VMs' consoles said, over the VMs: the guests' figures, who passed, who failed and
/// why, and when each kernel started its workload.
#[derive(Default)]
struct Consoles {
    guest: GuestRates,
    ok: u32,
    failures: Vec<String>,
    boot_ms: Vec<u64>,
}

fn read_consoles(run: &FleetRun) -> Consoles {
    let mut c = Consoles::default();
    for (i, vm) in run.vms.iter().enumerate() {
        let g = parse_workload(&vm.console);
        c.guest.add(&g);
        c.boot_ms.extend(g.start.as_ref().map(|s| s.boot_ms));
        if vm.code == Some(1) && g.passed {
            c.ok += 1;
        } else {
            let last = vm.console.lines().last().unwrap_or("").trim();
            let err = vm.stderr.lines().last().unwrap_or("").trim();
            let why = g.failure.as_deref().unwrap_or("no PASS");
            c.failures.push(format!(
                "vm{i}: status {:?}, {why}, console {last:?}, stderr {err:?}",
                vm.code
            ));
        }
        if let Some(api) = &vm.api_error {
            c.failures.push(format!("vm{i}: management API: {api}"));
        }
    }
    c
}

/// The rates of one experiment over its window, per vCPU.
struct Rates<'a> {
    e: &'a Experiment,
    run: &'a FleetRun,
    guest: &'a GuestRates,
    /// lull's counters over the window (not for QEMU, nor without a window).
    metrics: Option<MetricsSum>,
    vcpus: u32,
}

impl Rates<'_> {
    /// A count over the window, per vCPU and second.
    fn per_vcpu_s(&self, x: f64) -> f64 {
        let w = &self.run.window;
        if w.seconds > 0.0 {
            x / w.seconds / f64::from(self.vcpus)
        } else {
            0.0
        }
    }

    /// The vCPUs the guests counted (at least 1).
    fn guest_cpus(&self) -> f64 {
        self.guest.cpus.max(1) as f64
    }

    /// Guest local-timer interrupts per vCPU and second, over the guests that reported (all
    /// of them in a good run).
    fn loc_per_vcpu_s(&self) -> f64 {
        self.guest.loc_per_s / self.guest_cpus()
    }

    /// A rate per guest local-timer interrupt.
    fn per_loc(&self, x: f64) -> Option<f64> {
        let loc = self.loc_per_vcpu_s();
        (loc > 0.0).then(|| x / loc)
    }

    fn wakeups(&self) -> f64 {
        self.per_vcpu_s(self.run.window.delta.voluntary as f64)
    }

    /// Wake-ups of halted vCPUs per vCPU and second (KVM's count with its LAPIC).
    fn halted_per_vcpu_s(&self) -> Option<f64> {
        let halted = self.metrics.as_ref().map(|m| {
            if self.e.mode == Mode::Kernel {
                m.kvm_halt_wakeups
            } else {
                m.halted_wakeups
            }
        });
        halted.map(|h| self.per_vcpu_s(h as f64))
    }
}

/// What the clones of a row restored from `snapshot` cost.
fn clone_row(run: &FleetRun, snapshot: &Path) -> CloneRow {
    let mean = |f: fn(&proc_sample::Rollup) -> u64| run.mean(|v| v.rollup.as_ref().map(f));
    let measured = run.vms.iter().filter(|v| v.rollup.is_some()).count();
    CloneRow {
        snapshot: snapshot.display().to_string(),
        restore_to_running_ms: Spread::of(run.vms.iter().filter_map(|v| v.restore_ms).collect()),
        pss_kib_per_vm: mean(|r| r.pss),
        pss_anon_kib_per_vm: mean(|r| r.pss_anon),
        pss_file_kib_per_vm: mean(|r| r.pss_file),
        private_kib_per_vm: mean(|r| r.private),
        shared_kib_per_vm: mean(|r| r.shared),
        mem_available_used_kib_per_vm: match (run.mem_available_kib, measured) {
            ((Some(before), Some(open)), n) if n > 0 => {
                Some((before as f64 - open as f64) / n as f64)
            }
            _ => None,
        },
    }
}

fn row(plan: &Plan, e: &Experiment, run: &FleetRun) -> DensityRow {
    let vcpus = e.n * plan.args.cpus;
    let Consoles {
        guest,
        ok,
        mut failures,
        boot_ms,
    } = read_consoles(run);
    let note = window_note(run, &e.rule);
    if run.window.seconds == 0.0 {
        failures.push(format!(
            "no window: {}",
            note.as_deref().unwrap_or("the VMs never ran together")
        ));
    }
    let w = &run.window;
    let metrics = (!e.mode.is_qemu() && w.seconds > 0.0)
        .then(|| window_metrics(&run.vms))
        .flatten();
    if metrics.is_none() && !e.mode.is_qemu() && w.seconds > 0.0 {
        failures.push("lull's counters were not read at both edges of the window".into());
    }
    let r = Rates {
        e,
        run,
        guest: &guest,
        metrics,
        vcpus,
    };
    let cpu_pct = r.per_vcpu_s(w.delta.cpu_ns as f64) / 1e9 * 100.0;
    let metrics = r.metrics.as_ref();
    DensityRow {
        mode: e.mode.name().into(),
        vms: e.n,
        vcpus,
        vms_ok: ok,
        window_s: w.seconds,
        host_cpu_percent_per_vcpu: cpu_pct,
        host_cpu_percent_total: cpu_pct * f64::from(vcpus),
        host_wakeups_per_vcpu_s: r.wakeups(),
        host_ctxt_switches_per_vcpu_s: r
            .per_vcpu_s((w.delta.voluntary + w.delta.nonvoluntary) as f64),
        guest_timer_events_per_vcpu_s: r.loc_per_vcpu_s(),
        host_wakeups_per_timer_event: r.per_loc(r.wakeups()).unwrap_or(0.0),
        halted_vcpu_wakeups_per_timer_event: r.halted_per_vcpu_s().and_then(|h| r.per_loc(h)),
        global_timer_wakeups: metrics.and_then(|m| m.global_timer_wakeups),
        global_timer_fires: metrics.and_then(|m| m.global_timer_fires),
        vm_exits_per_vcpu_s: metrics.and_then(MetricsSum::exits_per_vcpu_s),
        lateness: guest.lateness(false).unwrap_or_default(),
        ipi_latency: LatencySummary::default(),
        early_interrupts: 0,
        rss_kib_per_vm: run.mean(|v| Some(v.max_rss_kib)).unwrap_or(0.0),
        guest_ram_rss_kib_per_vm: run.mean(|v| v.guest_rss_kib),
        vmm_rss_kib_per_vm: run.mean(|v| v.vmm_rss_kib),
        pss_kib_per_vm: run.mean(|v| v.rollup.map(|r| r.pss)),
        threads_per_vm: run.mean(|v| v.threads),
        failures,
        linux: Some(linux_row(&r, &boot_ms, note)),
        power: None,
        timer_slack: e.slack.clone(),
        multi_expiry_wakeups: None,
        coalesced_expiries: None,
        lateness_past_slack: None,
    }
}

/// The Linux-only columns of a row.
fn linux_row(r: &Rates, boot_ms: &[u64], note: Option<String>) -> LinuxRow {
    let (e, guest, metrics) = (r.e, r.guest, r.metrics.as_ref());
    let guest_cpus = r.guest_cpus();
    let boot_s = |ms: Option<&u64>| ms.map_or(0.0, |&ms| ms as f64 / 1000.0);
    LinuxRow {
        workload: e.workload.name().into(),
        workload_s: e.rule.workload.as_secs(),
        boot_s: (boot_s(boot_ms.iter().min()), boot_s(boot_ms.iter().max())),
        start_spread_s: match &r.run.plan {
            Some(Ok(p)) => p.spread.as_secs_f64(),
            _ => 0.0,
        },
        window_note: note,
        loc_per_vcpu_s: r.loc_per_vcpu_s(),
        guest_idle_calls_per_vcpu_s: guest.idle_calls_per_s / guest_cpus,
        guest_ipis_per_vcpu_s: guest.ipis_per_s / guest_cpus,
        guest_idle_pct: if guest.vms > 0 {
            guest.idle_pct_sum / f64::from(guest.vms)
        } else {
            0.0
        },
        timer_events_per_vcpu_s: (!guest.timers.is_empty())
            .then(|| guest.timer_events_per_s / guest_cpus),
        thread_wake: guest.lateness(true),
        halted_vcpu_wakeups_per_vcpu_s: r.halted_per_vcpu_s(),
        host_timer_interrupts_per_vcpu_s: metrics
            .filter(|_| e.mode != Mode::Kernel)
            .map(|m| r.per_vcpu_s(m.lapic_timer_fires as f64)),
        host_injected_interrupts_per_vcpu_s: metrics.and_then(|m| {
            let n = if e.mode == Mode::Kernel {
                m.kvm_irq_injections?
            } else {
                m.injected
            };
            Some(r.per_vcpu_s(n as f64))
        }),
        halted_vcpu_wakeups_by_cause: metrics
            .filter(|_| e.mode != Mode::Kernel)
            .map(|m| {
                m.wakeup_causes
                    .iter()
                    .map(|(cause, &n)| (cause.clone(), r.per_vcpu_s(n as f64)))
                    .collect()
            })
            .unwrap_or_default(),
        clones: None,
    }
}

/// Runs `lull bench density --guest linux`; `Ok(false)` if some VM failed.
pub fn run(args: &DensityArgs) -> Result<bool, BenchError> {
    let (plan, modes, skipped) = plan(args)?;
    let mut report = empty_report(&plan, &modes, skipped);
    eprintln!(
        "bench: density --guest linux, logs in {}",
        plan.work.display()
    );
    println!(
        "density: {} x {} vCPUs, the kit's Linux ({}), {} MiB, {:?} window per run",
        args.vm_counts(),
        args.cpus,
        report.params.guest_cmdline,
        report.params.memory_mib,
        args.duration
    );
    println!("{}", report::linux_header());
    let baseline = args.power_baseline();
    report.power_baseline = Some(baseline.clone());
    let mut all_ok = true;
    let mut snapshots = Snapshots::default();
    for &n in &args.vms {
        for &workload in &args.workload {
            for (mode, slack) in modes
                .iter()
                .flat_map(|&m| args.slacks_of(m).into_iter().map(move |s| (m, s)))
            {
                let e = Experiment {
                    mode,
                    slack: slack.map(str::to_string),
                    workload,
                    n,
                    rule: window_rule(args, n),
                };
                let snapshot = match args.clones {
                    true => Some(snapshots.get(&plan, &e)?),
                    false => None,
                };
                let r = run_experiment(&plan, &e, &baseline, snapshot.as_deref())?;
                all_ok &= r.failures.is_empty();
                report.results.push(r);
                if let Some(path) = &args.common.json {
                    report::write_json(path, &report)?;
                }
            }
        }
    }
    density::finish(&report, args.plot.as_ref())?;
    Ok(all_ok)
}

/// A row of `n` clones of `mode` (with `slack`) running `workload`, restored from the
/// snapshot `snapshots` has of it, or takes now (`lull bench density --guest linux --clones
/// --max-vms`).
pub(crate) fn measure_clones(
    plan: &Plan,
    snapshots: &mut Snapshots,
    variant: (Mode, Option<&str>, Workload),
    n: u32,
    baseline: &Reading<PowerWindow>,
) -> Result<DensityRow, BenchError> {
    let (mode, slack, workload) = variant;
    let e = Experiment {
        mode,
        slack: slack.map(str::to_string),
        workload,
        n,
        rule: window_rule(plan.args, n),
    };
    let dir = snapshots.get(plan, &e)?;
    run_experiment(plan, &e, baseline, Some(&dir))
}

/// The plan of a `--guest linux` run, its modes (with `--clones`, lull's only) and the modes
/// left out.
pub(crate) fn plan(
    args: &DensityArgs,
) -> Result<(Plan<'_>, Vec<Mode>, Vec<SkippedMode>), BenchError> {
    let lull = lull_binary(args.common.lull.as_ref())?;
    let kit_dir = args.common.kit.clone().unwrap_or_else(kit::kit_dir);
    let linux = kit::default_guest_in(&kit_dir).map_err(BenchError::Kit)?;
    let (mut modes, mut skipped) = density::modes(args)?;
    if args.clones {
        for m in modes.iter().filter(|m| m.is_qemu()) {
            skipped.push(SkippedMode {
                mode: m.name().into(),
                reason: "--clones restores lull snapshots, which QEMU cannot".into(),
            });
        }
        modes.retain(|m| !m.is_qemu());
        if modes.is_empty() {
            return Err(BenchError::NoModes(
                "--clones runs lull's modes only: give one with --modes".into(),
            ));
        }
    }
    let has_global = lull_has_flag(&lull, "--global-timers");
    let plan = Plan {
        args,
        lull,
        kernel: linux.kernel.clone(),
        base_cmdline: base_cmdline(&linux),
        global_timers: args.global_timers.as_deref().filter(|_| has_global),
        work: work_dir(args.common.work_dir.as_ref())?,
    };
    Ok((plan, modes, skipped))
}

/// Where the window of a run of `n` VMs goes.
/// With `--clones --max-vms` the workload is rounded up to whole [`SHARED_WORKLOAD`]s, so
/// that the steps of a search share their snapshots (one boot each).
fn window_rule(args: &DensityArgs, n: u32) -> WindowRule {
    let spread = boot_spread(args, n);
    let mut seconds = window::guest_seconds(args.duration, spread, SETTLE, MARGIN);
    if args.clones && args.max_vms.is_some() {
        seconds = seconds.div_ceil(SHARED_WORKLOAD) * SHARED_WORKLOAD;
    }
    WindowRule {
        settle: SETTLE,
        length: args.duration,
        workload: Duration::from_secs(seconds),
        margin: MARGIN,
    }
}

/// The report before its first row: host, parameters (the Linux ones too), the modes left
/// out.
pub(crate) fn empty_report(
    plan: &Plan,
    modes: &[Mode],
    skipped: Vec<SkippedMode>,
) -> DensityReport {
    let args = plan.args;
    let mut params = args.params(
        &plan.kernel,
        plan.cmdline_of("WORKLOAD", "S"),
        plan.global_timers.is_some(),
        modes,
    );
    params.linux = Some(LinuxParams {
        workloads: args.workload.iter().map(|w| w.name().to_string()).collect(),
        window_s: args.duration.as_secs_f64(),
        boot_spread_s: args
            .vms
            .iter()
            .map(|&n| (n, boot_spread(args, n).as_secs_f64()))
            .collect(),
        settle_s: SETTLE.as_secs_f64(),
        margin_s: MARGIN.as_secs_f64(),
    });
    DensityReport::empty(params, skipped)
}

/// Runs one experiment's fleet, prints its row (and why it failed, if it did).
fn run_experiment(
    plan: &Plan,
    e: &Experiment,
    baseline: &Reading<PowerWindow>,
    snapshot: Option<&Path>,
) -> Result<DensityRow, BenchError> {
    let (mode, workload, n) = (e.mode, e.workload, e.n);
    let cmdline = plan.cmdline(workload, e.rule.workload.as_secs());
    let slack = e
        .slack
        .as_deref()
        .map(|s| format!("@{s}"))
        .unwrap_or_default();
    let label = format!("{}{slack} {} N={n}", mode.name(), workload.name());
    eprintln!(
        "bench: {label}: starting {n} VM(s), workload {} s",
        e.rule.workload.as_secs()
    );
    let specs = (0..n)
        .map(|i| plan.spec(e, i, &cmdline, snapshot))
        .collect();
    let watch = Watch {
        boot_marker: match snapshot {
            Some(_) => RESTORED_MARKER.into(),
            None => workload_output::START_MARKER.into(),
        },
        end_markers: std::iter::once(workload_output::report_marker(workload.name()))
            .chain(workload_output::END_MARKERS.map(String::from))
            .collect(),
        guest_bytes: plan.args.memory_bytes(),
        deadline: plan.args.boot_timeout + e.rule.workload + Duration::from_secs(30),
        settle: SETTLE,
        planned: Some(e.rule),
        // Boots one after the other (several kernels booting together on few host cores can
        // starve each other for minutes); clones all at once: a restore takes milliseconds, and
        // each clone waiting for the one before to run its workload again put 128 of them
        // 441 s apart on a loaded host.
        stagger: snapshot.is_none(),
        label,
        // The first boot, about a minute (a clone's restore: none), then the workload.
        expected: match snapshot {
            Some(_) => e.rule.workload,
            None => Duration::from_secs(60) + e.rule.workload,
        },
    };
    let sampler = plan.args.power.sampler(plan.args.duration);
    let run = fleet::run(specs, &watch);
    let samples = sampler.stop();
    let run = run?;
    let mut r = row(plan, e, &run);
    r.power = Some(density_power::row_power(
        &r,
        samples.window(run.window.span),
        baseline,
    ));
    if let (Some(dir), Some(linux)) = (snapshot, r.linux.as_mut()) {
        linux.clones = Some(clone_row(&run, dir));
    }
    println!("{}", report::linux_line(&r));
    if let Some(c) = r.linux.as_ref().and_then(|l| l.clones.as_ref()) {
        println!("  {}", report::clone_line(c));
    }
    if let Some(note) = r.linux.as_ref().and_then(|l| l.window_note.as_ref()) {
        println!("  {} {} N={n}: {note}", mode.name(), workload.name());
    }
    for f in &r.failures {
        println!("  {} {} N={n} failed: {f}", mode.name(), workload.name());
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_drops_the_kits_workload() {
        let linux = kit::DefaultGuest {
            kernel: PathBuf::from("/k/vmlinux"),
            initramfs: None,
            cmdline: Some("console=ttyS0 panic=-1".into()),
            cmdline_pvm: Some("noxsave lull.workload=idle,seconds=10 tsc=reliable".into()),
        };
        let base = base_cmdline(&linux);
        assert!(!base.contains("lull.workload"), "{base}");
        assert!(base.starts_with("console=ttyS0 panic=-1"), "{base}");
        assert_eq!(kit::host_is_pvm(), base.contains("tsc=reliable"));
    }
}
