//! `lull bench idle-manager`: what lull's idle-injection and CPU-quota knobs do to a guest
//! that always wants to run (the `spin` guest), all in one run so the ratios share a host.
//!
//! ```text
//! injection: one 2-vCPU spin VM without injection (the baseline), then one per --percents
//!            with --idle-inject percent=P,period=--period
//!            -> achieved idle share (injected idle per vCPU / run time), share of it during
//!               which every vCPU was idle together, throughput relative to the baseline
//! quota:     for N in --vms, for phase in aligned, random: N 1-vCPU spin VMs started together
//!            with --cpu-quota quota=--period/2,period=--period,phase=PHASE
//!            -> throughput per VM, fraction of VM 0's throttled periods in which every VM
//!               was throttled at once (from each VM's throttled intervals, CLOCK_MONOTONIC)
//! power:     a no-VM baseline first, then every run above sampled from launch to exit
//!            -> package W, throughput per watt (iterations per joule) or, where energy is
//!               unreadable, per CPU-second of lull; host idle exits (idle_manager_power)
//! ```

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use clap::Args;
use lull_schema::RunReport;
use serde::{Deserialize, Serialize};

use super::common::{guest_path, lull_binary, read_metrics, work_dir, CommonArgs};
use super::error::BenchError;
use super::fleet::{self, VmOutcome, VmSpec, Watch};
use super::host::{self, HostInfo};
use super::idle_manager_power::{self as power, RunPower, RunWork};
use super::power::{PowerWindow, Reading};
use super::power_args::PowerArgs;
use super::report::write_json;
use super::units::parse_duration;

/// Schema name of the idle-manager JSON.
pub const IDLE_MANAGER_SCHEMA: &str = "lull-bench-idle-manager/2";

/// Flags of `lull bench idle-manager`.
#[derive(Debug, Args)]
pub struct IdleManagerArgs {
    /// How long each spin guest runs: a number with a unit (3s, 500ms; a bare number is
    /// refused).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Idle-injection percentages to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,25,50")]
    pub percents: Vec<u32>,
    /// VM counts of the CPU-quota rounds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    pub vms: Vec<u32>,
    /// Period of the injection windows and of the quota (whose budget is half of it): whole
    /// milliseconds, at least 2ms.
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    pub period: Duration,
    /// The power meter and baseline (the baseline is as long as --duration by default).
    #[command(flatten)]
    pub power: PowerArgs,
    /// Results, lull binary, kit and logs.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One idle-injection setting.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InjectionRow {
    /// Requested idle share, percent.
    pub percent: u32,
    /// Injected idle time per vCPU over the run time, percent.
    pub achieved_percent: f64,
    /// Share of the injected time during which every vCPU was idle together, percent.
    pub together_percent: f64,
    /// Guest iterations relative to the run without injection, percent.
    pub throughput_percent: f64,
    /// The run's power and its throughput per watt (or per CPU-second).
    pub power: RunPower,
}

/// One CPU-quota round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuotaRow {
    /// VMs started together.
    pub vms: u32,
    /// `aligned` or `random` quota periods.
    pub phase: String,
    /// Guest iterations per millisecond, per VM.
    pub throughput_per_ms: Vec<f64>,
    /// Throttled periods, per VM.
    pub throttled_periods: Vec<u64>,
    /// Fraction of VM 0's throttled periods in which every VM was throttled at some moment.
    pub periods_all_throttled_fraction: f64,
    /// Time during which every VM was throttled, ms.
    pub time_all_throttled_ms: f64,
    /// The round's power and its throughput (every VM) per watt (or per CPU-second).
    pub power: Option<RunPower>,
}

/// The idle-manager JSON document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdleManagerReport {
    /// Always [`IDLE_MANAGER_SCHEMA`].
    pub schema: String,
    /// The host.
    pub host: HostInfo,
    /// How long each guest ran, seconds.
    pub duration_s: f64,
    /// Injection windows' and quota periods' length, ms.
    pub period_ms: u64,
    /// Iterations per ms of the 2-vCPU guest without injection.
    pub base_iterations_per_ms: f64,
    /// The host with no VM, measured before the first run (`--power-baseline`).
    pub power_baseline: Reading<PowerWindow>,
    /// The power of the run without injection.
    pub base_power: Option<RunPower>,
    /// One row per injection percentage.
    pub injection: Vec<InjectionRow>,
    /// One row per (VM count, phase).
    pub quota: Vec<QuotaRow>,
    /// What went wrong, one line per failed VM.
    pub failures: Vec<String>,
}

/// The iterations a `spin` console reports (`spin: N vCPU(s), I iterations in M ms ...`).
pub fn spin_iterations(console: &str) -> Option<u64> {
    console.lines().find_map(|l| {
        let rest = l.strip_prefix("spin: ")?.split_once("vCPU(s), ")?.1;
        rest.split_once(" iterations in ")?.0.trim().parse().ok()
    })
}

/// The intervals during which every set has one of its intervals open (half-open, ns).
pub fn overlap_all(sets: &[Vec<(u64, u64)>]) -> Vec<(u64, u64)> {
    // Ends sort before starts at the same instant: touching intervals do not overlap.
    let mut events: Vec<(u64, i32)> = sets
        .iter()
        .flatten()
        .flat_map(|&(a, b)| [(a, 1), (b, -1)])
        .collect();
    events.sort_unstable();
    let all = i32::try_from(sets.len()).unwrap_or(i32::MAX);
    let (mut depth, mut since, mut out) = (0, None, Vec::new());
    for (t, d) in events {
        depth += d;
        match since {
            None if depth == all && all > 0 => since = Some(t),
            Some(s) if depth < all => {
                out.push((s, t));
                since = None;
            }
            _ => {}
        }
    }
    out
}

/// What the VMs of a run did, for its power figures: their iterations, how long they
/// counted, and lull's CPU time (`None` if a report lists no thread).
pub fn run_work(ms: u64, runs: &[&(u64, RunReport)]) -> RunWork {
    let cpu = runs
        .iter()
        .map(|(_, m)| {
            (!m.threads.is_empty()).then(|| m.threads.iter().map(|t| t.cpu_ns).sum::<u64>())
        })
        .sum::<Option<u64>>();
    RunWork {
        iterations: runs.iter().map(|(it, _)| it).sum(),
        seconds: ms as f64 / 1000.0,
        cpu_ns: cpu,
    }
}

/// The quota row of a round from each VM's iterations and `cpu_quota` metrics.
pub fn quota_row(vms: u32, phase: &str, ms: f64, runs: &[(u64, RunReport)]) -> QuotaRow {
    let sets: Vec<Vec<(u64, u64)>> = runs
        .iter()
        .map(|(_, m)| {
            m.cpu_quota
                .as_ref()
                .map(|q| q.intervals.clone())
                .unwrap_or_default()
        })
        .collect();
    let together = overlap_all(&sets);
    let hit = sets.first().map_or(0, |first| {
        first
            .iter()
            .filter(|&&(a, b)| together.iter().any(|&(x, y)| x < b && y > a))
            .count()
    });
    let periods = sets.iter().map(Vec::len).max().unwrap_or(0).max(1);
    QuotaRow {
        vms,
        phase: phase.into(),
        throughput_per_ms: runs.iter().map(|(it, _)| *it as f64 / ms).collect(),
        throttled_periods: runs
            .iter()
            .map(|(_, m)| m.cpu_quota.as_ref().map_or(0, |q| q.throttled_periods))
            .collect(),
        periods_all_throttled_fraction: hit as f64 / periods as f64,
        time_all_throttled_ms: together.iter().map(|(a, b)| (b - a) as f64).sum::<f64>() / 1e6,
        power: None,
    }
}

/// The injection row of `percent` from its run's iterations and metrics.
pub fn injection_row(
    percent: u32,
    iterations: u64,
    base: u64,
    m: &RunReport,
    power: RunPower,
) -> InjectionRow {
    let injected: Vec<f64> = m.vcpus.iter().map(|v| v.injected_idle_ns as f64).collect();
    let per_vcpu = injected.iter().sum::<f64>() / injected.len().max(1) as f64;
    let run_ns = m.run_time_ms as f64 * 1e6;
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b * 100.0 } else { 0.0 };
    InjectionRow {
        percent,
        achieved_percent: ratio(per_vcpu, run_ns),
        together_percent: ratio(
            m.idle_inject
                .as_ref()
                .map_or(0.0, |i| i.all_idle_together_ns as f64),
            per_vcpu,
        ),
        throughput_percent: ratio(iterations as f64, base as f64),
        power,
    }
}

/// A spin VM's iterations and metrics, or why it failed.
type SpinResult = Result<(u64, RunReport), String>;

struct Plan {
    lull: PathBuf,
    guest: PathBuf,
    work: PathBuf,
    ms: u64,
    power: PowerArgs,
    baseline: Reading<PowerWindow>,
}

/// The VMs of one run: per VM its iterations and metrics, or why it failed; and the host's
/// power from their launch to their exit.
struct SpinRun {
    vms: Vec<SpinResult>,
    window: Reading<PowerWindow>,
}

impl SpinRun {
    /// The run's power figures (over the VMs that reported; `None` if one failed).
    fn power(&self, ms: u64, baseline: &Reading<PowerWindow>) -> Option<RunPower> {
        let ok: Vec<&(u64, RunReport)> = self.vms.iter().flatten().collect();
        (ok.len() == self.vms.len())
            .then(|| power::run_power(run_work(ms, &ok), self.window.clone(), baseline))
    }
}

impl Plan {
    fn spec(&self, name: &str, cpus: u32, knob: &[String]) -> (VmSpec, PathBuf) {
        let stem = self.work.join(format!("idle-manager-{name}"));
        let serial = stem.with_extension("console");
        let metrics = stem.with_extension("json");
        let _ = std::fs::remove_file(&serial);
        let _ = std::fs::remove_file(&metrics);
        let mut c = Command::new(&self.lull);
        c.arg("run")
            .arg("--kernel")
            .arg(&self.guest)
            .args(["--irqchip", "user", "--memory", "64M"])
            .args(["--cpus", &cpus.to_string()])
            .args(["--cmdline", &format!("ms={}", self.ms)])
            .arg("--serial")
            .arg(format!("file={}", serial.display()))
            .arg("--metrics")
            .arg(&metrics)
            .args(knob);
        let spec = VmSpec {
            command: c,
            serial,
            stderr: stem.with_extension("stderr"),
            api: None,
            restore: None,
        };
        (spec, metrics)
    }

    /// Runs VMs together, sampling the host's power from their launch to their exit.
    fn run(&self, label: &str, vms: Vec<(VmSpec, PathBuf)>) -> Result<SpinRun, BenchError> {
        let n = u64::try_from(vms.len()).unwrap_or(u64::MAX);
        let (specs, metrics): (Vec<VmSpec>, Vec<PathBuf>) = vms.into_iter().unzip();
        let watch = Watch {
            boot_marker: "spin: ".into(),
            end_markers: Vec::new(),
            guest_bytes: 64 << 20,
            deadline: Duration::from_millis(self.ms) + Duration::from_secs(120 + 5 * n),
            settle: Duration::ZERO,
            planned: None,
            stagger: false,
            label: label.into(),
            expected: Duration::from_millis(self.ms) + Duration::from_secs(2),
        };
        let sampler = self.power.sampler(Duration::from_millis(self.ms));
        let run = fleet::run(specs, &watch);
        let window = sampler.stop().whole();
        let vms = run?
            .vms
            .iter()
            .zip(metrics)
            .map(|(vm, path)| outcome(label, vm, read_metrics(&path)))
            .collect();
        Ok(SpinRun { vms, window })
    }
}

fn outcome(label: &str, vm: &VmOutcome, m: Option<RunReport>) -> SpinResult {
    match (vm.code, spin_iterations(&vm.console), m) {
        (Some(1), Some(it), Some(m)) => Ok((it, m)),
        (code, _, _) => Err(format!(
            "{label}: status {code:?}: {}",
            vm.console
                .lines()
                .chain(vm.stderr.lines())
                .last()
                .unwrap_or("")
        )),
    }
}

fn injection_table(report: &IdleManagerReport) {
    println!(
        "idle injection, 2 vCPUs, spin {:.0} ms, period {} ms; no injection: {:.2} iterations/ms",
        report.duration_s * 1000.0,
        report.period_ms,
        report.base_iterations_per_ms
    );
    println!(
        "{:>8} {:>11} {:>11} {:>13}{}",
        "percent",
        "achieved %",
        "together %",
        "throughput %",
        power::header()
    );
    if let Some(p) = &report.base_power {
        println!(
            "{:>8} {:>11} {:>11} {:>13.1}{}",
            "off",
            "-",
            "-",
            100.0,
            power::columns(Some(p))
        );
    }
    for r in &report.injection {
        println!(
            "{:>8} {:>11.1} {:>11.1} {:>13.1}{}",
            r.percent,
            r.achieved_percent,
            r.together_percent,
            r.throughput_percent,
            power::columns(Some(&r.power))
        );
    }
}

fn quota_line(r: &QuotaRow) -> String {
    let per_vm: Vec<String> = r
        .throughput_per_ms
        .iter()
        .map(|t| format!("{t:.2}"))
        .collect();
    format!(
        "{:>4} {:>8} {:>30} {:>22.2} {:>17.1}{}",
        r.vms,
        r.phase,
        per_vm.join(" "),
        r.periods_all_throttled_fraction,
        r.time_all_throttled_ms,
        power::columns(r.power.as_ref())
    )
}

/// The baseline line and why a power column is empty, under both tables.
fn power_notes(report: &IdleManagerReport) {
    println!(
        "{}",
        super::density_power::baseline_line(&report.power_baseline)
    );
    let runs = report
        .base_power
        .iter()
        .chain(report.injection.iter().map(|r| &r.power))
        .chain(report.quota.iter().filter_map(|r| r.power.as_ref()));
    for line in power::notes(runs) {
        println!("{line}");
    }
}

/// Runs the idle-manager experiment; `Ok(false)` if some VM failed.
pub fn run(args: &IdleManagerArgs) -> Result<bool, BenchError> {
    let period_ms = u64::try_from(args.period.as_millis()).unwrap_or(u64::MAX);
    if period_ms < 2 {
        return Err(BenchError::Period(args.period));
    }
    let (lull, guest) = (
        lull_binary(args.common.lull.as_ref())?,
        guest_path("spin", args.common.kit.as_ref())?,
    );
    let work = work_dir(args.common.work_dir.as_ref())?;
    eprintln!("bench: idle-manager, logs in {}", work.display());
    eprintln!("bench: power baseline, no VM");
    let plan = Plan {
        lull,
        guest,
        work,
        ms: u64::try_from(args.duration.as_millis()).unwrap_or(u64::MAX),
        power: args.power.clone(),
        baseline: args.power.baseline(args.duration),
    };
    let mut report = IdleManagerReport {
        schema: IDLE_MANAGER_SCHEMA.into(),
        host: host::host_info(),
        duration_s: args.duration.as_secs_f64(),
        period_ms,
        base_iterations_per_ms: 0.0,
        power_baseline: plan.baseline.clone(),
        base_power: None,
        injection: Vec::new(),
        quota: Vec::new(),
        failures: Vec::new(),
    };
    let base = plan.run("base", vec![plan.spec("base", 2, &[])])?;
    report.base_power = base.power(plan.ms, &plan.baseline);
    let base_it = match base.vms.into_iter().next() {
        Some(Ok((it, _))) => it,
        Some(Err(e)) => {
            report.failures.push(e);
            0
        }
        None => 0,
    };
    report.base_iterations_per_ms = base_it as f64 / plan.ms as f64;
    injection_runs(&plan, args, period_ms, base_it, &mut report)?;
    injection_table(&report);
    quota_runs(&plan, args, period_ms, &mut report)?;
    power_notes(&report);
    for f in &report.failures {
        println!("  failed: {f}");
    }
    if let Some(path) = &args.common.json {
        write_json(path, &report)?;
    }
    Ok(report.failures.is_empty())
}

/// One VM of 2 vCPUs per `--percents` value, under idle injection: its throughput against
/// the base run's (`base_it` iterations), and its power.
fn injection_runs(
    plan: &Plan,
    args: &IdleManagerArgs,
    period_ms: u64,
    base_it: u64,
    report: &mut IdleManagerReport,
) -> Result<(), BenchError> {
    for &pct in &args.percents {
        let name = format!("inject-{pct}");
        let knob = [
            "--idle-inject".to_string(),
            format!("percent={pct},period={period_ms}"),
        ];
        let run = plan.run(&name, vec![plan.spec(&name, 2, &knob)])?;
        let power = run.power(plan.ms, &plan.baseline);
        match (run.vms.into_iter().next(), power) {
            (Some(Ok((it, m))), Some(p)) => {
                report
                    .injection
                    .push(injection_row(pct, it, base_it, &m, p));
            }
            (Some(Err(e)), _) => report.failures.push(e),
            _ => report.failures.push(format!("{name}: no VM ran")),
        }
    }
    Ok(())
}

/// Per `--vms` count and quota phase (aligned, random), that many 1-vCPU VMs under a 50%
/// CPU quota: their throughput, how often all of them are throttled at once, and their
/// power (printed as they come).
fn quota_runs(
    plan: &Plan,
    args: &IdleManagerArgs,
    period_ms: u64,
    report: &mut IdleManagerReport,
) -> Result<(), BenchError> {
    let ms = plan.ms as f64;
    println!(
        "\ncpu quota 50% (quota={},period={period_ms}), 1 vCPU per VM, spin {} ms",
        period_ms / 2,
        plan.ms
    );
    println!(
        "{:>4} {:>8} {:>30} {:>22} {:>17}{}",
        "VMs",
        "phase",
        "iter/ms per VM",
        "periods all throttled",
        "ms all throttled",
        power::header()
    );
    for &n in &args.vms {
        for phase in ["aligned", "random"] {
            let knob = [
                "--cpu-quota".to_string(),
                format!("quota={},period={period_ms},phase={phase}", period_ms / 2),
            ];
            let specs = (0..n)
                .map(|i| plan.spec(&format!("quota-{phase}-n{n}-vm{i}"), 1, &knob))
                .collect();
            let label = format!("quota {phase} N={n}");
            let run = plan.run(&label, specs)?;
            let power = run.power(plan.ms, &plan.baseline);
            let (ok, failed): (Vec<_>, Vec<_>) = run.vms.into_iter().partition(Result::is_ok);
            if failed.is_empty() {
                let runs: Vec<(u64, RunReport)> = ok.into_iter().flatten().collect();
                let mut row = quota_row(n, phase, ms, &runs);
                row.power = power;
                println!("{}", quota_line(&row));
                report.quota.push(row);
            } else {
                report
                    .failures
                    .extend(failed.into_iter().filter_map(Result::err));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_reports_its_iterations() {
        let log = "spin: 2 vCPU(s), 2706 iterations in 500 ms (5 per ms)\nspin: PASS\n";
        assert_eq!(spin_iterations(log), Some(2706));
        assert_eq!(spin_iterations("spin: PASS"), None);
    }

    #[test]
    fn overlaps_are_where_every_set_is_open() {
        let a = vec![(0, 10), (20, 30)];
        let b = vec![(5, 25)];
        assert_eq!(overlap_all(&[a.clone(), b]), vec![(5, 10), (20, 25)]);
        // Touching is not overlapping.
        assert_eq!(overlap_all(&[vec![(0, 10)], vec![(10, 20)]]), vec![]);
        assert_eq!(overlap_all(std::slice::from_ref(&a)), a);
        assert_eq!(overlap_all(&[]), vec![]);
    }

    #[test]
    fn quota_rounds_count_periods_throttled_together() {
        let m = |iv: &[(u64, u64)]| {
            crate::lull_metrics::report(
                serde_json::json!({"cpu_quota": {"intervals": iv, "throttled_periods": iv.len()}}),
            )
        };
        // VM 0 is throttled in 3 periods; VM 1 overlaps the first two of them.
        let runs = vec![
            (1000, m(&[(0, 10), (20, 30), (40, 50)])),
            (3000, m(&[(5, 25)])),
        ];
        let r = quota_row(2, "aligned", 1000.0, &runs);
        assert_eq!(r.throughput_per_ms, vec![1.0, 3.0]);
        assert_eq!(r.throttled_periods, vec![3, 1]);
        assert!((r.periods_all_throttled_fraction - 2.0 / 3.0).abs() < 1e-9);
        assert!((r.time_all_throttled_ms - 10e-6).abs() < 1e-12);
    }

    #[test]
    fn injection_shares_come_from_the_metrics() {
        let m = crate::lull_metrics::report(serde_json::json!({
            "run_time_ms": 1000,
            "vcpus": [{"injected_idle_ns": 200_000_000u64}, {"injected_idle_ns": 300_000_000u64}],
            "idle_inject": {"all_idle_together_ns": 125_000_000u64},
        }));
        let power = power::run_power(
            run_work(1000, &[&(750, m.clone())]),
            Reading::missing("no window"),
            &Reading::missing("off"),
        );
        let r = injection_row(25, 750, 1000, &m, power);
        assert_eq!(r.achieved_percent, 25.0);
        assert_eq!(r.together_percent, 50.0);
        assert_eq!(r.throughput_percent, 75.0);
        assert_eq!(r.power.package_watts.reason.as_deref(), Some("no window"));
    }

    #[test]
    fn a_run_works_the_sum_of_its_vms_and_of_their_threads() {
        let m = |cpu: &[u64]| {
            let threads: Vec<_> = cpu
                .iter()
                .map(|c| serde_json::json!({"cpu_ns": c}))
                .collect();
            crate::lull_metrics::report(serde_json::json!({ "threads": threads }))
        };
        let (a, b) = ((100, m(&[1_000, 2_000])), (50, m(&[500])));
        let w = run_work(2000, &[&a, &b]);
        assert_eq!(w.iterations, 150);
        assert_eq!(w.seconds, 2.0);
        assert_eq!(w.cpu_ns, Some(3_500));
        // A VM whose report lists no thread leaves the CPU time unknown, not low.
        let c = (10, m(&[]));
        assert_eq!(run_work(2000, &[&a, &c]).cpu_ns, None);
    }
}
