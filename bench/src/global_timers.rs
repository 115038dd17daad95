//! `lull bench global-timers`: who wakes for global timers, per timer model, with every vCPU
//! idle and with one busy, in one run.
//!
//! Global timers are the ones no vCPU owns (device and housekeeping deadlines, here the load
//! of `lull run --global-timers COUNT`, each re-armed ~10 ms after it fires). The pull model's
//! promise is that a running vCPU expires them at its exits and a halted vCPU is never woken
//! for them; with every vCPU idle one of them has to wake, and none should wake for nothing.
//!
//! ```text
//! for case in --cases (all-idle: idle-sim busy=0; one-busy: busy=1, vCPU 0 spins):
//!     for model in --models (pull, push, central):
//!         one VM of idle-sim with --global-timers -> lull's --metrics:
//!         global fires (vCPUs + central's timer thread), wake-ups of blocked vCPUs by cause,
//!         empty wake-ups (`other`: found nothing to do; the timer model's own count),
//!         wake-ups retargeted by another thread, and every lull thread's voluntary context
//!         switches (host wake-ups, the timer thread's included)
//! ```
//!
//! The load must be the same in every model for the comparison to be fair: the table's
//! last line gives the spread of global fires per second across models, per case.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use clap::Args;
use lull_schema::RunReport;
use serde::{Deserialize, Serialize};
use timer::ModelKind;

use super::common::{guest_path, lull_binary, read_metrics, work_dir, CommonArgs};
use super::error::BenchError;
use super::fleet::{self, VmSpec, Watch};
use super::guest_output::parse_idle_sim;
use super::host::{self, HostInfo};
use super::lull_metrics::MetricsSum;
use super::report;
use super::units::parse_duration;

/// Schema tag of the JSON this experiment writes.
pub const GLOBAL_TIMERS_SCHEMA: &str = "lull-bench-global-timers/1";

/// What the vCPUs do while the global-timer load runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Case {
    /// Every vCPU idle (halted between its own timers): someone must wake for global timers.
    AllIdle,
    /// vCPU 0 spins the whole time (idle-sim `busy=1`): it can expire every global timer.
    OneBusy,
}

impl Case {
    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::AllIdle => "all-idle",
            Self::OneBusy => "one-busy",
        }
    }

    /// idle-sim's `busy=` for this case.
    fn busy(self) -> u32 {
        match self {
            Self::AllIdle => 0,
            Self::OneBusy => 1,
        }
    }
}

/// Flags of `lull bench global-timers`.
#[derive(Debug, Args)]
pub struct GlobalTimersArgs {
    /// Cases, comma-separated: all-idle (every vCPU halts between its own timers), one-busy
    /// (vCPU 0 spins).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "all-idle,one-busy"
    )]
    pub cases: Vec<Case>,
    /// Timer models, comma-separated (each case runs every model, in this order).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_values_t = ModelKind::ALL
    )]
    pub models: Vec<ModelKind>,
    /// The load: `lull run --global-timers` (COUNT per vCPU[,period=MS]).
    #[arg(long, default_value = "4", value_name = "COUNT[,period=MS]")]
    pub global_timers: String,
    /// vCPUs of the VM.
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// How long each VM runs: a number with a unit (10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Results, lull binary, kit and logs.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One (case, model) run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GlobalTimersRow {
    /// `all-idle` or `one-busy`.
    pub case: String,
    /// `pull`, `push` or `central`.
    pub model: String,
    /// Whether the guest passed and lull exited with its status.
    pub passed: bool,
    /// Global timer expiries (every vCPU's and `central`'s timer thread's).
    pub global_fires: u64,
    /// The same per second of the guest's run.
    pub global_fires_per_s: f64,
    /// Wake-ups of blocked vCPU threads, every cause.
    pub blocked_wakeups: u64,
    /// Wake-ups of blocked vCPUs whose cause was a global timer (its own or another vCPU's).
    pub global_timer_wakeups: u64,
    /// `global_timer_wakeups` per global expiry.
    pub global_timer_wakeups_per_expiry: f64,
    /// Wake-ups of blocked vCPUs that found nothing to do (`wakeups.other`).
    pub empty_wakeups: u64,
    /// Empty wake-ups the timer model counted itself (`timers.empty_wakeups`).
    pub model_empty_wakeups: u64,
    /// Sleepers' host wake-ups moved by another thread without waking them.
    pub wake_retargets: u64,
    /// Voluntary context switches of every lull thread (vCPUs, VMM, timer thread).
    pub host_wakeups: u64,
    /// `host_wakeups` per global expiry.
    pub host_wakeups_per_expiry: f64,
    /// Why the run failed, if it did.
    pub failure: Option<String>,
}

/// The JSON of `lull bench global-timers`.
#[derive(Debug, Serialize, Deserialize)]
pub struct GlobalTimersReport {
    /// [`GLOBAL_TIMERS_SCHEMA`].
    pub schema: String,
    /// The host it ran on.
    pub host: HostInfo,
    /// `--global-timers` as given.
    pub global_timers: String,
    /// vCPUs of the VM.
    pub cpus: u32,
    /// Seconds each VM ran.
    pub duration_s: f64,
    /// One row per (case, model), in run order.
    pub results: Vec<GlobalTimersRow>,
}

/// Voluntary context switches of every thread lull reports.
fn thread_wakeups(m: &RunReport) -> u64 {
    m.threads.iter().map(|t| t.voluntary_ctxt_switches).sum()
}

/// `n / fires` (0 without fires).
fn per(n: u64, fires: u64) -> f64 {
    if fires == 0 {
        0.0
    } else {
        n as f64 / fires as f64
    }
}

/// A row from one run's metrics (`None`: lull wrote none).
fn row(case: Case, model: ModelKind, duration: Duration, m: Option<&RunReport>) -> GlobalTimersRow {
    let sum = m.map(MetricsSum::of).unwrap_or_default();
    let fires = sum.global_timer_fires.unwrap_or(0);
    let global = sum.global_timer_wakeups.unwrap_or(0);
    let host_wakeups = m.map_or(0, thread_wakeups);
    GlobalTimersRow {
        case: case.name().into(),
        model: model.as_str().into(),
        passed: m.is_some(),
        global_fires: fires,
        global_fires_per_s: fires as f64 / duration.as_secs_f64(),
        blocked_wakeups: sum.halted_wakeups,
        global_timer_wakeups: global,
        global_timer_wakeups_per_expiry: per(global, fires),
        empty_wakeups: sum.wakeup_causes.get("other").copied().unwrap_or(0),
        // What a row reads from lull's `--metrics` JSON beyond [`MetricsSum`].
        model_empty_wakeups: m.and_then(|m| m.timers).map_or(0, |t| t.empty_wakeups),
        wake_retargets: m.and_then(|m| m.timers).map_or(0, |t| t.wake_retargets),
        host_wakeups,
        host_wakeups_per_expiry: per(host_wakeups, fires),
        failure: None,
    }
}

/// The table's header line.
fn header() -> String {
    format!(
        "{:<9}{:<8}{:>8}{:>9}{:>9}{:>9}{:>10}{:>7}{:>8}{:>8}{:>9}{:>10}",
        "case",
        "model",
        "fires",
        "fires/s",
        "blocked",
        "global",
        "glob/exp",
        "empty",
        "e_model",
        "retarg",
        "host_wk",
        "host/exp"
    )
}

/// One table line.
fn line(r: &GlobalTimersRow) -> String {
    if let Some(f) = &r.failure {
        return format!("{:<9}{:<8}  failed: {f}", r.case, r.model);
    }
    format!(
        "{:<9}{:<8}{:>8}{:>9.1}{:>9}{:>9}{:>10.3}{:>7}{:>8}{:>8}{:>9}{:>10.3}",
        r.case,
        r.model,
        r.global_fires,
        r.global_fires_per_s,
        r.blocked_wakeups,
        r.global_timer_wakeups,
        r.global_timer_wakeups_per_expiry,
        r.empty_wakeups,
        r.model_empty_wakeups,
        r.wake_retargets,
        r.host_wakeups,
        r.host_wakeups_per_expiry
    )
}

/// Per case: the spread of global fires per second across the models that passed,
/// `(max - min) / max` (the load is only comparable when this is small).
pub fn load_spread(rows: &[GlobalTimersRow]) -> Vec<(String, f64)> {
    let mut cases: Vec<&str> = rows.iter().map(|r| r.case.as_str()).collect();
    cases.dedup();
    cases
        .into_iter()
        .filter_map(|case| {
            let rates: Vec<f64> = rows
                .iter()
                .filter(|r| r.case == case && r.failure.is_none())
                .map(|r| r.global_fires_per_s)
                .collect();
            let max = rates.iter().copied().fold(f64::NAN, f64::max);
            let min = rates.iter().copied().fold(f64::NAN, f64::min);
            (max > 0.0).then(|| (case.to_string(), (max - min) / max))
        })
        .collect()
}

/// The `lull run` command of one (case, model) VM.
fn command(
    args: &GlobalTimersArgs,
    lull: &Path,
    guest: &Path,
    case: Case,
    model: ModelKind,
) -> Command {
    let mut c = Command::new(lull);
    c.arg("run")
        .arg("--kernel")
        .arg(guest)
        .args(["--cpus", &args.cpus.to_string(), "--memory", "64M"])
        .args(["--irqchip", "user", "--timer-model", model.as_str()])
        .args(["--global-timers", &args.global_timers])
        .arg("--cmdline")
        .arg(format!(
            "duration_ms={} busy={}",
            args.duration.as_millis(),
            case.busy()
        ));
    c
}

/// Runs the experiment; `Ok(false)` if some run failed.
pub fn run(args: &GlobalTimersArgs) -> Result<bool, BenchError> {
    let lull = lull_binary(args.common.lull.as_ref())?;
    let guest = guest_path("idle-sim", args.common.kit.as_ref())?;
    let work = work_dir(args.common.work_dir.as_ref())?;
    eprintln!("bench: global-timers, logs in {}", work.display());
    let mut report = GlobalTimersReport {
        schema: GLOBAL_TIMERS_SCHEMA.into(),
        host: host::host_info(),
        global_timers: args.global_timers.clone(),
        cpus: args.cpus,
        duration_s: args.duration.as_secs_f64(),
        results: Vec::new(),
    };
    println!(
        "global-timers: 1 VM x {} vCPUs, idle-sim, --global-timers {}, {:?} per run",
        args.cpus, args.global_timers, args.duration
    );
    println!("{}", header());
    let mut all_ok = true;
    for &case in &args.cases {
        for &model in &args.models {
            let stem = work.join(format!("global-{}-{}", case.name(), model.as_str()));
            let serial = stem.with_extension("console");
            let metrics = stem.with_extension("json");
            let _ = std::fs::remove_file(&serial);
            let _ = std::fs::remove_file(&metrics);
            let mut c = command(args, &lull, &guest, case, model);
            c.arg("--serial")
                .arg(format!("file={}", serial.display()))
                .arg("--metrics")
                .arg(&metrics);
            let label = format!("{} {}", case.name(), model.as_str());
            eprintln!("bench: global-timers {label}");
            let watch = Watch {
                boot_marker: "idle-sim: ".into(),
                end_markers: vec!["idle-sim: cpu 0: ".into()],
                guest_bytes: 64 << 20,
                deadline: args.duration + Duration::from_secs(60),
                settle: Duration::from_secs(1),
                planned: None,
                stagger: false,
                label,
                expected: args.duration + Duration::from_secs(2),
            };
            let spec = VmSpec {
                command: c,
                serial,
                stderr: stem.with_extension("stderr"),
                api: None,
                restore: None,
            };
            let fleet = fleet::run(vec![spec], &watch)?;
            let vm = &fleet.vms[0];
            let guest_passed = parse_idle_sim(&vm.console).passed;
            let m = read_metrics(&metrics);
            let mut r = row(case, model, args.duration, m.as_ref());
            r.passed = r.passed && guest_passed && vm.code == Some(1);
            if !r.passed {
                let last = vm.console.lines().chain(vm.stderr.lines()).last();
                r.failure = Some(format!("status {:?}: {}", vm.code, last.unwrap_or("")));
            }
            all_ok &= r.passed;
            println!("{}", line(&r));
            report.results.push(r);
            if let Some(path) = &args.common.json {
                report::write_json(path, &report)?;
            }
        }
    }
    for (case, spread) in load_spread(&report.results) {
        println!(
            "{case}: global fires per second differ by {:.1}% across models",
            spread * 100.0
        );
    }
    Ok(all_ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metrics() -> RunReport {
        crate::lull_metrics::report(json!({
            "vcpus": [
                { "wakeups": { "timer": 5, "global_timer": 7, "other": 2 }, "global_timer_fires": 30 },
                { "wakeups": { "timer": 4, "global_timer": 1 }, "global_timer_fires": 10 }
            ],
            "global_timers": { "timer_thread_fires": 0 },
            "timers": { "empty_wakeups": 3, "wake_retargets": 9 },
            "threads": [
                { "name": "vcpu0", "voluntary_ctxt_switches": 20 },
                { "name": "vcpu1", "voluntary_ctxt_switches": 6 },
                { "name": "timer", "voluntary_ctxt_switches": 14 }
            ]
        }))
    }

    #[test]
    fn a_row_reads_fires_wakeups_by_cause_and_every_thread() {
        let m = metrics();
        let r = row(
            Case::AllIdle,
            ModelKind::Pull,
            Duration::from_secs(2),
            Some(&m),
        );
        assert_eq!(r.global_fires, 40);
        assert_eq!(r.global_fires_per_s, 20.0);
        assert_eq!(r.blocked_wakeups, 19);
        assert_eq!(r.global_timer_wakeups, 8);
        assert_eq!(r.global_timer_wakeups_per_expiry, 0.2);
        assert_eq!((r.empty_wakeups, r.model_empty_wakeups), (2, 3));
        assert_eq!(r.wake_retargets, 9);
        assert_eq!(r.host_wakeups, 40);
        assert_eq!(r.host_wakeups_per_expiry, 1.0);
    }

    #[test]
    fn a_run_without_metrics_is_a_failed_row_without_division_by_zero() {
        let r = row(
            Case::OneBusy,
            ModelKind::Central,
            Duration::from_secs(1),
            None,
        );
        assert!(!r.passed);
        assert_eq!(r.global_timer_wakeups_per_expiry, 0.0);
        assert_eq!(r.host_wakeups_per_expiry, 0.0);
    }

    fn rated(case: &str, rate: f64) -> GlobalTimersRow {
        let mut r = row(Case::AllIdle, ModelKind::Pull, Duration::from_secs(1), None);
        r.case = case.into();
        r.global_fires_per_s = rate;
        r
    }

    #[test]
    fn the_load_spread_is_per_case_and_leaves_failed_runs_out() {
        let mut failed = rated("one-busy", 10.0);
        failed.failure = Some("status None".into());
        let rows = [
            rated("all-idle", 800.0),
            rated("all-idle", 760.0),
            rated("one-busy", 400.0),
            rated("one-busy", 400.0),
            failed,
        ];
        let spread = load_spread(&rows);
        assert_eq!(spread.len(), 2);
        assert_eq!(spread[0].0, "all-idle");
        assert!((spread[0].1 - 0.05).abs() < 1e-12);
        assert_eq!(spread[1], ("one-busy".to_string(), 0.0));
    }

    #[test]
    fn the_vm_runs_the_case_and_model_asked_for() {
        let args = GlobalTimersArgs {
            cases: vec![Case::OneBusy],
            models: vec![ModelKind::Central],
            global_timers: "4,period=5".into(),
            cpus: 2,
            duration: Duration::from_millis(1500),
            common: CommonArgs {
                json: None,
                lull: None,
                kit: None,
                work_dir: None,
            },
        };
        let c = command(
            &args,
            Path::new("/l"),
            Path::new("/g.elf"),
            Case::OneBusy,
            ModelKind::Central,
        );
        let words: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = words.join(" ");
        assert!(joined.contains("--timer-model central"), "{joined}");
        assert!(joined.contains("--global-timers 4,period=5"), "{joined}");
        assert!(
            joined.ends_with("--cmdline duration_ms=1500 busy=1"),
            "{joined}"
        );
    }
}
