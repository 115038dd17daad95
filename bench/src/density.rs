//! `lull bench density`: N VMs of an idle guest at once, per mode, side by side.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use super::fleet::{self, FleetRun, VmSpec, Watch};
use super::guest_output::{parse_idle_sim, Histogram};
use super::report::{self, DensityParams, DensityReport, DensityRow, DENSITY_SCHEMA};
use super::units::{parse_duration, parse_size};
use super::{
    guest_path, host, lull_binary, lull_has_flag, plot, qemu, read_metrics, work_dir, BenchError,
    CommonArgs,
};

/// How a VM of the density experiment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// lull, `--irqchip kernel` (KVM's in-kernel LAPIC and halt polling).
    Kernel,
    /// lull, `--irqchip user --timer-model pull`.
    Pull,
    /// lull, `--irqchip user --timer-model push`.
    Push,
    /// lull, `--irqchip user --timer-model central`.
    Central,
    /// QEMU with `-machine kernel-irqchip=on`.
    QemuOn,
    /// QEMU with `-machine kernel-irqchip=off` (QEMU's user-space APIC).
    QemuOff,
}

impl Mode {
    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Pull => "pull",
            Self::Push => "push",
            Self::Central => "central",
            Self::QemuOn => "qemu-on",
            Self::QemuOff => "qemu-off",
        }
    }

    /// QEMU rather than lull.
    pub(crate) fn is_qemu(self) -> bool {
        matches!(self, Self::QemuOn | Self::QemuOff)
    }

    /// The `lull run` flags of this mode.
    pub(crate) fn lull_args(self) -> &'static [&'static str] {
        match self {
            Self::Kernel => &["--irqchip", "kernel"],
            Self::Pull => &["--irqchip", "user", "--timer-model", "pull"],
            Self::Push => &["--irqchip", "user", "--timer-model", "push"],
            Self::Central => &["--irqchip", "user", "--timer-model", "central"],
            Self::QemuOn | Self::QemuOff => &[],
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
    /// Guest: a kit guest name (`idle-sim`) or a path to its ELF.
    #[arg(long, default_value = "idle-sim")]
    pub guest: String,
    /// How long each guest runs its timers: a number with a unit (30s, 500ms, 2m, 1m30s; a
    /// bare number is refused).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Modes, comma-separated: kernel, pull, push, central, qemu-on, qemu-off. Default: all
    /// (the QEMU ones only where qemu is installed).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub modes: Vec<Mode>,
    /// Guest RAM per VM in bytes, or with a binary K, M or G suffix (64M is 64 MiB).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub memory: u64,
    /// More guest command-line words, e.g. `mix=50:1,50:10-100 ipi_pct=10`.
    #[arg(long, default_value = "")]
    pub guest_args: String,
    /// Passed as `lull run --global-timers` in the user-irqchip modes (COUNT[,period=MS]).
    #[arg(long, value_name = "COUNT[,period=MS]")]
    pub global_timers: Option<String>,
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
}

struct Plan<'a> {
    args: &'a DensityArgs,
    lull: PathBuf,
    guest: PathBuf,
    cmdline: String,
    global_timers: Option<&'a str>,
    work: PathBuf,
}

impl Plan<'_> {
    fn spec(&self, mode: Mode, n: u32, i: u32) -> VmSpec {
        let stem = self.work.join(format!("{}-n{n}-vm{i}", mode.name()));
        let serial = stem.with_extension("console");
        let metrics = stem.with_extension("json");
        let _ = std::fs::remove_file(&serial);
        let _ = std::fs::remove_file(&metrics);
        let cpus = self.args.cpus.to_string();
        let mib = self.args.memory >> 20;
        let command = if mode.is_qemu() {
            let mut c = qemu::command(&self.args.qemu, self.args.cpus, mib);
            c.arg("-machine")
                .arg(if mode == Mode::QemuOn {
                    "kernel-irqchip=on"
                } else {
                    "kernel-irqchip=off"
                })
                .arg("-serial")
                .arg(format!("file:{}", serial.display()))
                .arg("-kernel")
                .arg(&self.guest)
                .args(["-append", &self.cmdline]);
            c
        } else {
            let mut c = Command::new(&self.lull);
            c.arg("run")
                .arg("--kernel")
                .arg(&self.guest)
                .args(["--cpus", &cpus, "--memory", &format!("{mib}M")])
                .args(["--cmdline", &self.cmdline])
                .arg("--serial")
                .arg(format!("file={}", serial.display()))
                .arg("--metrics")
                .arg(&metrics)
                .args(mode.lull_args());
            if let (Some(g), false) = (self.global_timers, mode == Mode::Kernel) {
                c.args(["--global-timers", g]);
            }
            c
        };
        VmSpec {
            command,
            serial,
            stderr: stem.with_extension("stderr"),
        }
    }
}

/// Sums of lull's `--metrics` over a fleet.
#[derive(Debug, Default)]
struct MetricsSum {
    vm_reports: u32,
    halted_wakeups: u64,
    kvm_halt_wakeups: u64,
    global_timer_wakeups: Option<u64>,
    global_timer_fires: Option<u64>,
    kvm_exits: Option<u64>,
    vcpu_seconds: f64,
}

fn add_opt(acc: &mut Option<u64>, v: Option<u64>) {
    if let Some(v) = v {
        *acc = Some(acc.unwrap_or(0) + v);
    }
}

impl MetricsSum {
    fn add(&mut self, m: &Value) {
        self.vm_reports += 1;
        let vcpus = m["vcpus"].as_array().map_or(&[][..], Vec::as_slice);
        for v in vcpus {
            let w = &v["wakeups"];
            // Every cause lull reports (timer, interrupt, control, other, global_timer, ...).
            if let Some(causes) = w.as_object() {
                self.halted_wakeups += causes.values().filter_map(Value::as_u64).sum::<u64>();
            }
            add_opt(&mut self.global_timer_wakeups, w["global_timer"].as_u64());
            add_opt(
                &mut self.global_timer_fires,
                v["global_timer_fires"].as_u64(),
            );
        }
        // The `central` model expires global timers on its own timer thread, not on a vCPU.
        add_opt(
            &mut self.global_timer_fires,
            m["global_timers"]["timer_thread_fires"].as_u64(),
        );
        self.kvm_halt_wakeups += m["kvm"]["halt_wakeup"].as_u64().unwrap_or(0);
        add_opt(&mut self.kvm_exits, m["kvm"]["exits"].as_u64());
        let secs = m["run_time_ms"].as_u64().unwrap_or(0) as f64 / 1000.0;
        self.vcpu_seconds += secs * vcpus.len() as f64;
    }
}

fn row(plan: &Plan, mode: Mode, n: u32, run: &FleetRun, duration: Duration) -> DensityRow {
    let cpus = plan.args.cpus;
    let vcpus = n * cpus;
    let mut lateness = Histogram::default();
    let mut ipi = Histogram::default();
    let mut events = 0;
    let mut early = 0;
    let mut ok = 0;
    let mut failures = Vec::new();
    let mut metrics = MetricsSum::default();
    for (i, vm) in run.vms.iter().enumerate() {
        let g = parse_idle_sim(&vm.console);
        lateness.merge(&g.lateness);
        ipi.merge(&g.ipi);
        events += g.events;
        early += g.early;
        if vm.code == Some(1) && g.passed {
            ok += 1;
        } else {
            let last = vm.console.lines().last().unwrap_or("").trim();
            let err = vm.stderr.lines().last().unwrap_or("").trim();
            failures.push(format!(
                "vm{i}: status {:?}, console {last:?}, stderr {err:?}",
                vm.code
            ));
        }
        if !mode.is_qemu() {
            let path = plan.work.join(format!("{}-n{n}-vm{i}.json", mode.name()));
            if let Some(m) = read_metrics(&path) {
                metrics.add(&m);
            }
        }
    }
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
    let mean = |f: &dyn Fn(&fleet::VmOutcome) -> Option<u64>| {
        let v: Vec<u64> = run.vms.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<u64>() as f64 / v.len() as f64)
    };
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
        vm_exits_per_vcpu_s: metrics
            .kvm_exits
            .filter(|_| metrics.vcpu_seconds > 0.0)
            .map(|e| e as f64 / metrics.vcpu_seconds),
        lateness: lateness.summary(),
        ipi_latency: ipi.summary(),
        early_interrupts: early,
        rss_kib_per_vm: mean(&|v| Some(v.max_rss_kib)).unwrap_or(0.0),
        guest_ram_rss_kib_per_vm: mean(&|v| v.guest_rss_kib),
        vmm_rss_kib_per_vm: mean(&|v| v.vmm_rss_kib),
        failures,
    }
}

fn modes(args: &DensityArgs) -> Result<Vec<Mode>, BenchError> {
    let qemu = qemu::installed(&args.qemu);
    let mut modes = if args.modes.is_empty() {
        let mut m = vec![Mode::Kernel, Mode::Pull, Mode::Push, Mode::Central];
        if qemu {
            m.extend([Mode::QemuOn, Mode::QemuOff]);
        }
        m
    } else {
        args.modes.clone()
    };
    if !qemu && modes.iter().any(|m| m.is_qemu()) {
        eprintln!(
            "bench: {} is not installed: leaving out the QEMU modes",
            args.qemu
        );
        modes.retain(|m| !m.is_qemu());
    }
    if modes.is_empty() {
        return Err(BenchError::NoModes(
            "every mode asked for needs QEMU".into(),
        ));
    }
    Ok(modes)
}

/// Prints the table of an earlier run and draws its plot.
fn replot(json: &Path, svg: Option<&PathBuf>) -> Result<bool, BenchError> {
    let text = std::fs::read_to_string(json).map_err(|e| BenchError::Io(json.into(), e))?;
    let report: DensityReport = serde_json::from_str(&text)?;
    if let Some(path) = svg {
        std::fs::write(path, plot::density_svg(&report)?)
            .map_err(|e| BenchError::Io(path.clone(), e))?;
    }
    println!("{}", report::density_header());
    for r in &report.results {
        println!("{}", report::density_line(r));
    }
    Ok(report.results.iter().all(|r| r.failures.is_empty()))
}

/// Runs the density experiment; `Ok(false)` if some VM failed.
pub fn run(args: &DensityArgs) -> Result<bool, BenchError> {
    if let Some(json) = &args.from_json {
        return replot(json, args.plot.as_ref());
    }
    let duration = args.duration;
    let lull = lull_binary(args.common.lull.as_ref())?;
    let guest = guest_path(&args.guest, args.common.kit.as_ref())?;
    let modes = modes(args)?;
    let has_global = lull_has_flag(&lull, "--global-timers");
    if args.global_timers.is_some() && !has_global {
        eprintln!(
            "bench: {} has no --global-timers yet: running without it",
            lull.display()
        );
    }
    let duration_ms = duration.as_millis();
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
    let mut report = DensityReport {
        schema: DENSITY_SCHEMA.into(),
        host: host::host_info(),
        params: DensityParams {
            vms: args.vms.clone(),
            cpus_per_vm: args.cpus,
            guest: plan.guest.display().to_string(),
            guest_cmdline: plan.cmdline.clone(),
            duration_s: duration.as_secs_f64(),
            memory_mib: args.memory >> 20,
            modes: modes.iter().map(|m| m.name().to_string()).collect(),
            global_timers: args.global_timers.clone(),
            global_timers_applied: plan.global_timers.is_some(),
        },
        results: Vec::new(),
    };
    eprintln!("bench: density, logs in {}", plan.work.display());
    println!(
        "density: {} x {} vCPUs, guest {} ({}), {:?} per run",
        args.vms
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join("/"),
        args.cpus,
        args.guest,
        plan.cmdline,
        duration
    );
    println!("{}", report::density_header());
    let mut all_ok = true;
    for &n in &args.vms {
        for &mode in &modes {
            let label = format!("{} N={n}", mode.name());
            eprintln!("bench: {label}: starting {n} VM(s)");
            let specs = (0..n).map(|i| plan.spec(mode, n, i)).collect();
            let watch = Watch {
                boot_marker: format!("{}: ", guest_stem(&plan.guest)),
                end_marker: Some(format!("{}: cpu 0: ", guest_stem(&plan.guest))),
                guest_bytes: args.memory,
                deadline: duration + Duration::from_secs(60 + 3 * u64::from(n)),
                settle: Duration::from_secs(1),
                label,
                // The guests' run plus a boot of about a second.
                expected: duration + Duration::from_secs(2),
            };
            let run = fleet::run(specs, &watch)?;
            let r = row(&plan, mode, n, &run, duration);
            all_ok &= r.failures.is_empty();
            println!("{}", report::density_line(&r));
            for f in &r.failures {
                println!("  {} N={n} failed: {f}", mode.name());
            }
            report.results.push(r);
            if let Some(path) = &args.common.json {
                report::write_json(path, &report)?;
            }
        }
    }
    if let Some(path) = &args.plot {
        let svg = plot::density_svg(&report)?;
        std::fs::write(path, svg).map_err(|e| BenchError::Io(path.clone(), e))?;
        eprintln!("bench: plot written to {}", path.display());
    }
    Ok(all_ok)
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

    fn metrics(vcpu_fires: [u64; 2], thread_fires: Option<u64>) -> Value {
        let vcpu = |fires: u64| {
            serde_json::json!({
                "wakeups": { "timer": 3, "global_timer": 1 },
                "global_timer_fires": fires,
            })
        };
        let global = thread_fires.map_or(
            Value::Null,
            |f| serde_json::json!({ "config": "4,period=1ms", "timer_thread_fires": f }),
        );
        serde_json::json!({
            "run_time_ms": 2000,
            "vcpus": [vcpu(vcpu_fires[0]), vcpu(vcpu_fires[1])],
            "global_timers": global,
            "kvm": { "exits": 100, "halt_wakeup": 0 },
        })
    }

    #[test]
    fn global_fires_count_every_model() {
        // pull/push: the vCPUs expire global timers themselves.
        let mut pull = MetricsSum::default();
        pull.add(&metrics([5, 7], Some(0)));
        assert_eq!(pull.global_timer_fires, Some(12));
        // central: its timer thread does, and the vCPUs report none.
        let mut central = MetricsSum::default();
        central.add(&metrics([0, 0], Some(40)));
        central.add(&metrics([0, 0], Some(2)));
        assert_eq!(central.global_timer_fires, Some(42));
        assert_eq!(central.global_timer_wakeups, Some(4));
        assert_eq!(central.halted_wakeups, 16);
        assert_eq!(central.kvm_exits, Some(200));
    }
}
