//! `lull bench density`: N VMs of an idle guest at once, per mode, side by side.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::Args;
use timer::ModelKind;

use super::common::{guest_path, lull_binary, lull_has_flag, read_metrics, work_dir, CommonArgs};
use super::density_power;
use super::error::BenchError;
use super::fleet::{self, FleetRun, VmSpec, Watch};
use super::guest_output::{parse_idle_sim, Histogram};
use super::lull_metrics::MetricsSum;
use super::power::{PowerWindow, Reading};
use super::power_args::PowerArgs;
use super::report::{self, DensityParams, DensityReport, DensityRow, SkippedMode};
use super::slo::Slo;
use super::units::{parse_duration, parse_size};
use super::{plot, qemu};

/// How a VM of the density experiment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// lull, `--irqchip kernel` (KVM's in-kernel LAPIC and halt polling).
    Kernel,
    /// lull, `--irqchip user` with this `--timer-model` (named as the model).
    User(ModelKind),
    /// QEMU with `-machine kernel-irqchip=on`.
    QemuOn,
    /// QEMU with `-machine kernel-irqchip=off` (QEMU's user-space APIC).
    QemuOff,
}

impl Mode {
    /// Every mode, in the order the CLI lists them.
    pub const ALL: [Self; 6] = [
        Self::Kernel,
        Self::User(ModelKind::Pull),
        Self::User(ModelKind::Push),
        Self::User(ModelKind::Central),
        Self::QemuOn,
        Self::QemuOff,
    ];

    /// The name on the command line, in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::User(model) => model.as_str(),
            Self::QemuOn => "qemu-on",
            Self::QemuOff => "qemu-off",
        }
    }

    /// QEMU rather than lull.
    pub(crate) fn is_qemu(self) -> bool {
        matches!(self, Self::QemuOn | Self::QemuOff)
    }

    /// The `lull run` flags of this mode.
    pub(crate) fn lull_args(self) -> Vec<&'static str> {
        match self {
            Self::Kernel => vec!["--irqchip", "kernel"],
            Self::User(model) => vec!["--irqchip", "user", "--timer-model", model.as_str()],
            Self::QemuOn | Self::QemuOff => Vec::new(),
        }
    }

    /// The `lull run` flags of a VM of this mode: [`Self::lull_args`], then `--global-timers`
    /// (the user irqchip's only) and `--timer-slack`, where given.
    pub(crate) fn vm_flags(self, global_timers: Option<&str>, slack: Option<&str>) -> Vec<String> {
        let mut flags: Vec<String> = self.lull_args().into_iter().map(String::from).collect();
        if let (Some(g), false) = (global_timers, self == Mode::Kernel) {
            flags.extend(["--global-timers".to_string(), g.to_string()]);
        }
        if let Some(s) = slack {
            flags.extend(["--timer-slack".to_string(), s.to_string()]);
        }
        flags
    }
}

impl clap::ValueEnum for Mode {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            Self::Kernel => {
                "lull, `--irqchip kernel` (KVM's in-kernel LAPIC and halt polling)".to_string()
            }
            Self::User(model) => format!("lull, `--irqchip user --timer-model {model}`"),
            Self::QemuOn => "QEMU with `-machine kernel-irqchip=on`".to_string(),
            Self::QemuOff => {
                "QEMU with `-machine kernel-irqchip=off` (QEMU's user-space APIC)".to_string()
            }
        };
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}

/// The kernel-side workload of `--guest linux` (`lull.workload=KIND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// The kernel left alone: its tick, NOHZ idle, RCU, workqueues.
    Idle,
    /// A thread per CPU sleeping on pinned hrtimers drawn from idle-sim's mix.
    Timers,
}

impl Workload {
    /// The name on the command line, in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Timers => "timers",
        }
    }
}

/// Flags of `lull bench density`.
#[derive(Debug, Args)]
pub struct DensityArgs {
    /// VM counts to run, comma-separated (one row per mode and count; the plot's x axis).
    #[arg(long, value_delimiter = ',', default_value = "8")]
    pub vms: Vec<u32>,
    /// vCPUs per VM.
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Guest: a kit guest name (`idle-sim`) or a path to its ELF; or `linux`: the kit's Linux
    /// running its in-kernel workload (see --workload), measured only while every VM runs it
    /// (its boot, tens of seconds on PVM hosts, is left out of every figure).
    #[arg(long, default_value = "idle-sim")]
    pub guest: String,
    /// How long each guest runs its timers: a number with a unit (30s, 500ms, 2m, 1m30s; a
    /// bare number is refused). With `--guest linux`: the length of the measured window (the
    /// workload runs longer: this + --boot-spread + 5 s).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Modes, comma-separated: kernel, pull, push, central, qemu-on, qemu-off. Default: all
    /// (the QEMU ones only where QEMU can run a guest here; `--guest linux`: not qemu-off,
    /// whose user-space LAPIC cannot boot the kit's Linux).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub modes: Vec<Mode>,
    /// Guest RAM per VM in bytes, or with a binary K, M or G suffix (64M is 64 MiB). Default:
    /// 64M; 32M with `--guest linux` (the least its kernel boots well with).
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    /// More guest command-line words, e.g. `mix=50:1,50:10-100 ipi_pct=10`. With `--guest
    /// linux`: more options of `lull.workload=`, comma-separated (e.g. `seed=7,max_late_ms=5000`).
    #[arg(long, default_value = "")]
    pub guest_args: String,
    /// `--guest linux` only: the kernel-side workloads, comma-separated, each a separate
    /// experiment with its own VMs, rows and plot line (a kernel runs one workload per boot,
    /// then leaves the VM): `idle` (the kernel left alone: its tick, NOHZ idle, RCU) and
    /// `timers` (a thread per CPU sleeping on hrtimers drawn from idle-sim's mix).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "idle,timers")]
    pub workload: Vec<Workload>,
    /// `--guest linux` only: how far apart the VMs may reach their workload (they boot one
    /// after the other, each once the one before has started it); the workload runs this much
    /// longer so that the window still fits. Default: 60 s per VM beyond the first (1 s with
    /// --clones). A larger spread shortens the window (reported).
    #[arg(long, value_parser = parse_duration)]
    pub boot_spread: Option<Duration>,
    /// `--guest linux` only: boot one VM per mode, slack and workload, snapshot it once its
    /// workload has started, and restore every VM of each row from that snapshot (through
    /// `vm.restore`, its memory mapped copy-on-write) instead of booting each: a row of
    /// hundreds of VMs in minutes instead of hours. Each clone's figures are taken after its
    /// own restore (the kit's workload starts its window again when lull's restore count
    /// changes). The rows also give restore-to-running per clone and memory as the host sees
    /// it. Not for the QEMU modes.
    #[arg(long)]
    pub clones: bool,
    /// `--guest linux` only: kill the VMs that have not finished this long after the workload
    /// should have (a boot of the kit's Linux takes 20-200 s on PVM hosts, and they boot one
    /// after the other).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub boot_timeout: Duration,
    /// Passed as `lull run --global-timers` in the user-irqchip modes (COUNT[,period=MS]).
    #[arg(long, value_name = "COUNT[,period=MS]")]
    pub global_timers: Option<String>,
    /// Timer slacks, comma-separated (`off` or a duration up to 10ms, e.g. off,100us,1ms):
    /// each user-irqchip mode runs once per value, as `lull run --timer-slack VALUE`, one row
    /// each (`pull@1ms`), side by side in one run; the kernel and QEMU modes run once.
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = super::units::parse_slack)]
    pub timer_slack: Vec<String>,
    /// Results, lull binary, kit and logs.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Draw host CPU and wake-ups per mode against the VM count into this SVG.
    #[arg(long, value_name = "PATH")]
    pub plot: Option<PathBuf>,
    /// QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    pub qemu: String,
    /// Run nothing: read this JSON of an earlier run, print its table and draw --plot.
    #[arg(long, value_name = "PATH")]
    pub from_json: Option<PathBuf>,
    /// The power meter and baseline.
    #[command(flatten)]
    pub power: PowerArgs,
    /// Instead of --vms: find per mode the most VMs, up to CAP, whose window meets every
    /// bound of --slo (doubling from 1 VM, then bisection; each step is a run of --duration),
    /// stopping before the host's memory runs out.
    #[arg(long, value_name = "CAP")]
    pub max_vms: Option<u32>,
    /// --max-vms: the bounds a window must meet, comma-separated: `lateness_p99=DURATION`
    /// (guest timer lateness, 99th percentile) or, if more, `lateness_vs_one_vm=FACTORx` times
    /// the p99 one VM had on this host (the first mode searched, kernel's; `off` for the
    /// absolute bound alone), `host_busy=PERCENT%` (CPU of every VMM over the window, share of
    /// the host's CPUs), `ipi_p99=DURATION` (IPI wake-up latency, off unless given). No VM may
    /// fail, always. The search also stops where the host's memory (what the VMs hold: their
    /// PSS) or its threads would run out, and names the bound that stopped it.
    #[arg(
        long,
        default_value = "lateness_p99=2ms,lateness_vs_one_vm=3x,host_busy=90%",
        value_parser = super::slo::parse
    )]
    pub slo: Slo,
}

/// The `--guest` that selects the kit's Linux.
pub const LINUX_GUEST: &str = "linux";

impl DensityArgs {
    /// The parameters a report records for runs of `guest` with `cmdline` in `modes`
    /// (`linux` is left for the Linux experiment to fill in).
    pub(crate) fn params(
        &self,
        guest: &Path,
        cmdline: String,
        global_timers_applied: bool,
        modes: &[Mode],
    ) -> DensityParams {
        DensityParams {
            vms: self.vms.clone(),
            cpus_per_vm: self.cpus,
            guest: guest.display().to_string(),
            guest_cmdline: cmdline,
            duration_s: self.duration.as_secs_f64(),
            memory_mib: self.memory_bytes() >> 20,
            modes: modes.iter().map(|m| m.name().to_string()).collect(),
            global_timers: self.global_timers.clone(),
            global_timers_applied,
            linux: None,
            power_meter: self.power.power_meter.clone(),
            timer_slack: self.timer_slack.clone(),
        }
    }

    /// The power baseline (`--power-baseline`, else as long as `--duration`).
    pub fn power_baseline(&self) -> Reading<PowerWindow> {
        self.power.baseline(self.duration)
    }

    /// Whether the guest is the kit's Linux.
    pub fn is_linux(&self) -> bool {
        self.guest == LINUX_GUEST
    }

    /// The VM counts as the header line shows them (`1/8/32`).
    pub fn vm_counts(&self) -> String {
        let counts: Vec<String> = self.vms.iter().map(u32::to_string).collect();
        counts.join("/")
    }

    /// Guest RAM per VM, bytes: `--memory`, else the guest's default.
    pub fn memory_bytes(&self) -> u64 {
        self.memory
            .unwrap_or(if self.is_linux() { 32 << 20 } else { 64 << 20 })
    }
}

/// What one density VM boots and where its VMM writes.
pub(crate) struct Launch<'a> {
    /// The guest kernel (ELF).
    pub kernel: &'a Path,
    /// Its command line.
    pub cmdline: &'a str,
    /// The serial console's log.
    pub serial: &'a Path,
    /// lull's `--metrics` JSON (not for QEMU).
    pub metrics: &'a Path,
}

impl DensityArgs {
    /// The VMM command of one VM in `mode`: QEMU, or `lull` (with `global_timers` in the user
    /// irqchip modes).
    pub(crate) fn vm_command(
        &self,
        mode: Mode,
        lull: &Path,
        global_timers: Option<&str>,
        l: &Launch,
    ) -> Command {
        let mib = self.memory_bytes() >> 20;
        if mode.is_qemu() {
            let mut c = qemu::command(&self.qemu, self.cpus, mib);
            c.arg("-machine")
                .arg(if mode == Mode::QemuOn {
                    "kernel-irqchip=on"
                } else {
                    "kernel-irqchip=off"
                })
                .arg("-serial")
                .arg(format!("file:{}", l.serial.display()))
                .arg("-kernel")
                .arg(l.kernel)
                .args(["-append", l.cmdline]);
            return c;
        }
        let mut c = Command::new(lull);
        c.arg("run")
            .arg("--kernel")
            .arg(l.kernel)
            .args(["--cpus", &self.cpus.to_string()])
            .args(["--memory", &format!("{mib}M")])
            .args(["--cmdline", l.cmdline])
            .arg("--serial")
            .arg(format!("file={}", l.serial.display()))
            .arg("--metrics")
            .arg(l.metrics)
            .args(mode.vm_flags(global_timers, None));
        c
    }
}

/// What every run of the experiment shares: the request, the binaries, the logs.
pub(crate) struct Plan<'a> {
    /// The request.
    pub args: &'a DensityArgs,
    lull: PathBuf,
    guest: PathBuf,
    cmdline: String,
    global_timers: Option<&'a str>,
    work: PathBuf,
}

impl Plan<'_> {
    /// Where VM `i` of `n` in `mode` (with `slack`) writes, less the extension.
    fn stem(&self, mode: Mode, slack: Option<&str>, n: u32, i: u32) -> PathBuf {
        let slack = slack.map(|s| format!("-slack{s}")).unwrap_or_default();
        self.work.join(format!("{}{slack}-n{n}-vm{i}", mode.name()))
    }

    fn spec(&self, mode: Mode, slack: Option<&str>, n: u32, i: u32) -> VmSpec {
        let stem = self.stem(mode, slack, n, i);
        let serial = stem.with_extension("console");
        let metrics = stem.with_extension("json");
        let _ = std::fs::remove_file(&serial);
        let _ = std::fs::remove_file(&metrics);
        // Every row's guest does the same work per event: the lateness past a slack is taken
        // from its lateness histogram (`Histogram::past`), not from idle-sim's `slack_ns`,
        // whose second histogram costs the guest (emulated CPL0) more per event.
        let launch = Launch {
            kernel: &self.guest,
            cmdline: &self.cmdline,
            serial: &serial,
            metrics: &metrics,
        };
        let mut command = self
            .args
            .vm_command(mode, &self.lull, self.global_timers, &launch);
        if let Some(s) = slack {
            command.args(["--timer-slack", s]);
        }
        VmSpec {
            command,
            serial,
            stderr: stem.with_extension("stderr"),
            api: None,
            restore: None,
        }
    }
}

/// What the VMs of one run reported: the guests' histograms and counts, who passed, who
/// failed and why, and lull's metrics summed.
#[derive(Default)]
struct Reported {
    lateness: Histogram,
    ipi: Histogram,
    events: u64,
    early: u64,
    ok: u32,
    failures: Vec<String>,
    metrics: MetricsSum,
}

fn read_vms(plan: &Plan, mode: Mode, slack: Option<&str>, n: u32, run: &FleetRun) -> Reported {
    let mut r = Reported::default();
    for (i, vm) in (0u32..).zip(&run.vms) {
        let g = parse_idle_sim(&vm.console);
        r.lateness.merge(&g.lateness);
        r.ipi.merge(&g.ipi);
        r.events += g.events;
        r.early += g.early;
        if vm.code == Some(1) && g.passed {
            r.ok += 1;
        } else {
            let last = vm.console.lines().last().unwrap_or("").trim();
            let err = vm.stderr.lines().last().unwrap_or("").trim();
            r.failures.push(format!(
                "vm{i}: status {:?}, console {last:?}, stderr {err:?}",
                vm.code
            ));
        }
        if !mode.is_qemu() {
            let path = plan.stem(mode, slack, n, i).with_extension("json");
            if let Some(m) = read_metrics(&path) {
                r.metrics.add(&m);
            }
        }
    }
    r
}

fn row(
    plan: &Plan,
    (mode, slack): (Mode, Option<&str>),
    n: u32,
    run: &FleetRun,
    duration: Duration,
) -> DensityRow {
    let cpus = plan.args.cpus;
    let vcpus = n * cpus;
    let Reported {
        lateness,
        ipi,
        events,
        early,
        ok,
        failures,
        metrics,
    } = read_vms(plan, mode, slack, n, run);
    let w = &run.window;
    let per_vcpu_s = |x: u64| {
        if w.seconds > 0.0 {
            x as f64 / w.seconds / f64::from(vcpus)
        } else {
            0.0
        }
    };
    let events_per_vcpu_s = events as f64 / f64::from(vcpus) / duration.as_secs_f64();
    let wakeups = per_vcpu_s(w.delta.voluntary);
    let per_event = |x: u64| (events > 0).then(|| x as f64 / events as f64);
    let cpu_pct = per_vcpu_s(w.delta.cpu_ns) / 1e9 * 100.0;
    DensityRow {
        mode: mode.name().into(),
        vms: n,
        vcpus,
        vms_ok: ok,
        window_s: w.seconds,
        host_cpu_percent_per_vcpu: cpu_pct,
        host_cpu_percent_total: cpu_pct * f64::from(vcpus),
        host_wakeups_per_vcpu_s: wakeups,
        host_ctxt_switches_per_vcpu_s: per_vcpu_s(w.delta.voluntary + w.delta.nonvoluntary),
        guest_timer_events_per_vcpu_s: events_per_vcpu_s,
        host_wakeups_per_timer_event: if events_per_vcpu_s > 0.0 {
            wakeups / events_per_vcpu_s
        } else {
            0.0
        },
        halted_vcpu_wakeups_per_timer_event: match mode {
            _ if mode.is_qemu() || metrics.vm_reports == 0 => None,
            Mode::Kernel => per_event(metrics.kvm_halt_wakeups),
            _ => per_event(metrics.halted_wakeups),
        },
        global_timer_wakeups: metrics.global_timer_wakeups,
        global_timer_fires: metrics.global_timer_fires,
        vm_exits_per_vcpu_s: metrics.exits_per_vcpu_s(),
        lateness: lateness.summary(),
        ipi_latency: ipi.summary(),
        early_interrupts: early,
        rss_kib_per_vm: run.mean(|v| Some(v.max_rss_kib)).unwrap_or(0.0),
        guest_ram_rss_kib_per_vm: run.mean(|v| v.guest_rss_kib),
        vmm_rss_kib_per_vm: run.mean(|v| v.vmm_rss_kib),
        pss_kib_per_vm: run.mean(|v| v.rollup.map(|r| r.pss)),
        threads_per_vm: run.mean(|v| v.threads),
        failures,
        linux: None,
        power: None,
        lateness_past_slack: slack
            .and_then(|s| parse_duration(s).ok())
            .map(|s| lateness.past(u64::try_from(s.as_nanos()).unwrap_or(u64::MAX))),
        timer_slack: slack.map(str::to_string),
        multi_expiry_wakeups: (!mode.is_qemu() && metrics.vm_reports > 0)
            .then_some(metrics.multi_expiry_wakeups),
        coalesced_expiries: (!mode.is_qemu() && metrics.vm_reports > 0)
            .then_some(metrics.coalesced_expiries),
    }
}

/// Whether QEMU can run here: installed, and (where the kit has `hello`) able to run it.
fn qemu_check(args: &DensityArgs) -> Result<(), qemu::QemuUnusable> {
    match guest_path("hello", args.common.kit.as_ref()) {
        Ok(hello) => qemu::can_run(&args.qemu, &hello),
        Err(_) if qemu::installed(&args.qemu) => Ok(()),
        Err(_) => Err(qemu::QemuUnusable::NotInstalled(args.qemu.clone())),
    }
}

/// The modes to run, and the ones left out with the reason. Without `--modes`: every lull
/// mode, and the QEMU ones where QEMU runs (`qemu-off` not for Linux: QEMU's user-space
/// LAPIC cannot boot it, see resources/linux/README.md).
pub(crate) fn modes(args: &DensityArgs) -> Result<(Vec<Mode>, Vec<SkippedMode>), BenchError> {
    let mut modes = if args.modes.is_empty() {
        let mut m = vec![
            Mode::Kernel,
            Mode::User(ModelKind::Pull),
            Mode::User(ModelKind::Push),
            Mode::User(ModelKind::Central),
            Mode::QemuOn,
        ];
        if !args.is_linux() {
            m.push(Mode::QemuOff);
        }
        m
    } else {
        args.modes.clone()
    };
    let mut skipped = Vec::new();
    if modes.iter().any(|m| m.is_qemu()) {
        if let Err(why) = qemu_check(args) {
            eprintln!("bench: leaving out the QEMU modes: {why}");
            for m in modes.iter().filter(|m| m.is_qemu()) {
                skipped.push(SkippedMode {
                    mode: m.name().into(),
                    reason: why.to_string(),
                });
            }
            modes.retain(|m| !m.is_qemu());
        }
    }
    if modes.is_empty() {
        return Err(BenchError::NoModes(
            "every mode asked for needs QEMU, and QEMU cannot run here".into(),
        ));
    }
    Ok((modes, skipped))
}

/// Prints the table of an earlier run and draws its plot.
fn replot(json: &Path, svg: Option<&PathBuf>) -> Result<bool, BenchError> {
    let text = std::fs::read_to_string(json).map_err(|e| BenchError::Io(json.into(), e))?;
    let report: DensityReport = serde_json::from_str(&text)?;
    for line in report::density_table(&report) {
        println!("{line}");
    }
    finish(&report, svg)?;
    Ok(report.results.iter().all(|r| r.failures.is_empty()))
}

/// Runs the density experiment (or, with `--from-json`, shows an earlier run of either
/// guest); `Ok(false)` if some VM failed. `lull bench` runs `--guest linux` in
/// linux_density.rs and `--max-vms` in max_vms.rs.
pub fn run(args: &DensityArgs) -> Result<bool, BenchError> {
    if let Some(json) = &args.from_json {
        return replot(json, args.plot.as_ref());
    }
    let (plan, modes, skipped) = Plan::new(args)?;
    let mut report = plan.empty_report(&modes, skipped);
    eprintln!("bench: density, logs in {}", plan.work.display());
    println!(
        "density: {} x {} vCPUs, guest {} ({}), {:?} per run",
        args.vm_counts(),
        args.cpus,
        args.guest,
        plan.cmdline,
        args.duration
    );
    println!("{}", report::density_header());
    let baseline = args.power_baseline();
    report.power_baseline = Some(baseline.clone());
    let mut all_ok = true;
    for &n in &args.vms {
        for &mode in &modes {
            for slack in args.slacks_of(mode) {
                let r = plan.measure_with_slack(mode, slack, n, &baseline)?;
                all_ok &= r.failures.is_empty();
                println!("{}", report::density_line(&r));
                for f in &r.failures {
                    println!("  {} N={n} failed: {f}", r.label());
                }
                report.results.push(r);
                if let Some(path) = &args.common.json {
                    report::write_json(path, &report)?;
                }
            }
        }
    }
    finish(&report, args.plot.as_ref())?;
    Ok(all_ok)
}

impl<'a> Plan<'a> {
    /// The plan of `args`, the modes to run and the ones left out.
    pub(crate) fn new(
        args: &'a DensityArgs,
    ) -> Result<(Plan<'a>, Vec<Mode>, Vec<SkippedMode>), BenchError> {
        let lull = lull_binary(args.common.lull.as_ref())?;
        let guest = guest_path(&args.guest, args.common.kit.as_ref())?;
        let (modes, skipped) = modes(args)?;
        let has_global = lull_has_flag(&lull, "--global-timers");
        if !args.timer_slack.is_empty() && !lull_has_flag(&lull, "--timer-slack") {
            return Err(BenchError::NoTimerSlack(lull.clone()));
        }
        if args.global_timers.is_some() && !has_global {
            eprintln!(
                "bench: {} has no --global-timers yet: running without it",
                lull.display()
            );
        }
        let duration_ms = args.duration.as_millis();
        let cmdline = format!("duration_ms={duration_ms} {}", args.guest_args)
            .trim()
            .to_string();
        let plan = Plan {
            args,
            lull,
            guest,
            cmdline,
            global_timers: args.global_timers.as_deref().filter(|_| has_global),
            work: work_dir(args.common.work_dir.as_ref())?,
        };
        Ok((plan, modes, skipped))
    }

    /// The report before its first row.
    pub(crate) fn empty_report(&self, modes: &[Mode], skipped: Vec<SkippedMode>) -> DensityReport {
        let params = self.args.params(
            &self.guest,
            self.cmdline.clone(),
            self.global_timers.is_some(),
            modes,
        );
        DensityReport::empty(params, skipped)
    }

    /// Runs `n` VMs in `mode` and measures them (power against `baseline`).
    pub(crate) fn measure(
        &self,
        mode: Mode,
        n: u32,
        baseline: &Reading<PowerWindow>,
    ) -> Result<DensityRow, BenchError> {
        self.measure_with_slack(mode, None, n, baseline)
    }

    /// [`Self::measure`] with `lull run --timer-slack slack` (if given).
    pub(crate) fn measure_with_slack(
        &self,
        mode: Mode,
        slack: Option<&str>,
        n: u32,
        baseline: &Reading<PowerWindow>,
    ) -> Result<DensityRow, BenchError> {
        let args = self.args;
        let duration = args.duration;
        let label = match slack {
            Some(s) => format!("{}@{s} N={n}", mode.name()),
            None => format!("{} N={n}", mode.name()),
        };
        eprintln!("bench: {label}: starting {n} VM(s)");
        let specs = (0..n).map(|i| self.spec(mode, slack, n, i)).collect();
        let watch = Watch {
            boot_marker: format!("{}: ", guest_stem(&self.guest)),
            end_markers: vec![format!("{}: cpu 0: ", guest_stem(&self.guest))],
            guest_bytes: args.memory_bytes(),
            deadline: duration + Duration::from_secs(60 + 3 * u64::from(n)),
            settle: Duration::from_secs(1),
            planned: None,
            stagger: false,
            label,
            // The guests' run plus a boot of about a second.
            expected: duration + Duration::from_secs(2),
        };
        let sampler = args.power.sampler(duration);
        let run = fleet::run(specs, &watch);
        let samples = sampler.stop();
        let run = run?;
        let mut r = row(self, (mode, slack), n, &run, duration);
        r.power = Some(density_power::row_power(
            &r,
            samples.window(run.window.span),
            baseline,
        ));
        Ok(r)
    }
}

/// After the last row: the modes left out, the `pull / kernel` ratios, the plot.
pub(crate) fn finish(report: &DensityReport, plot: Option<&PathBuf>) -> Result<(), BenchError> {
    for line in density_power::notes(report) {
        println!("{line}");
    }
    for s in &report.skipped {
        println!("{} skipped: {}", s.mode, s.reason);
    }
    for line in report::pull_kernel_ratios(report) {
        println!("{line}");
    }
    if let Some(path) = plot {
        let svg = plot::density_svg(report)?;
        crate::report::write_output(path, svg.as_bytes())?;
        eprintln!("bench: plot written to {}", path.display());
    }
    Ok(())
}

fn guest_stem(guest: &Path) -> String {
    guest
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vms_flags_give_global_timers_to_the_user_irqchip_only() {
        let user = Mode::User(ModelKind::Pull);
        assert_eq!(
            user.vm_flags(Some("4"), Some("1ms")),
            [
                "--irqchip",
                "user",
                "--timer-model",
                "pull",
                "--global-timers",
                "4",
                "--timer-slack",
                "1ms"
            ]
        );
        assert_eq!(
            Mode::Kernel.vm_flags(Some("4"), None),
            ["--irqchip", "kernel"]
        );
    }
}
