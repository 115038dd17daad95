//! `lull bench wakeup`: how long an IPI takes to wake a halted vCPU, per halt-polling mode.
//!
//! One 2-vCPU VM of the `wake-ipi` guest per (mode, delay): vCPU 1 announces its halt and
//! halts; vCPU 0 sends it an IPI `delay` later; the target's handler measures the delay with
//! rdtsc. Short delays land inside a halt-polling window, long ones after it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;
use lull_schema::{RunReport, ThreadStat};

use super::common::{guest_path, lull_binary, lull_has_flag, read_metrics, work_dir, CommonArgs};
use super::error::BenchError;
use super::fleet::{self, VmSpec, Watch};
use super::guest_output::parse_wake_ipi;
use super::host;
use super::report::{self, WakeupReport, WakeupRow, WAKEUP_SCHEMA};

/// A VM configuration of the wake-up experiment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WakeMode {
    /// `--irqchip kernel`: KVM's in-kernel LAPIC and KVM's own halt polling.
    Kernel,
    /// `--irqchip user --halt-poll VALUE` (`off`, `adaptive` or a window such as `200us`).
    User(String),
}

impl WakeMode {
    /// The name in tables and JSON (`kernel`, `user-off`, `user-200us`, ...).
    pub fn name(&self) -> String {
        match self {
            Self::Kernel => "kernel".into(),
            Self::User(p) => format!("user-{p}"),
        }
    }
}

/// A `--modes` word that is neither `kernel` nor `user-<halt-poll>`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "Bad wake-up mode {0:?}: use kernel, user-off, user-adaptive or user-<window> (user-200us)"
)]
pub struct WakeModeError(String);

impl FromStr for WakeMode {
    type Err = WakeModeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "kernel" => Ok(Self::Kernel),
            other => match other.strip_prefix("user-") {
                Some(p) if !p.is_empty() => Ok(Self::User(p.to_string())),
                _ => Err(WakeModeError(s.to_string())),
            },
        }
    }
}

/// Flags of `lull bench wakeup`.
#[derive(Debug, Args)]
pub struct WakeupArgs {
    /// Modes, comma-separated: kernel, user-off, `user-<window>` (e.g. user-200us), user-adaptive.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kernel,user-off,user-200us,user-adaptive"
    )]
    pub modes: Vec<WakeMode>,
    /// Delays between the target's halt and the IPI, microseconds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,50")]
    pub delays: Vec<u64>,
    /// Samples per run.
    #[arg(long, default_value_t = 200)]
    pub count: u32,
    /// Timer model of the user-irqchip modes.
    #[arg(long, default_value = "pull")]
    pub timer_model: String,
    /// Results, lull binary, kit and logs.
    #[command(flatten)]
    pub common: CommonArgs,
}

fn thread_per_sample(
    metrics: &RunReport,
    thread: &str,
    field: fn(&ThreadStat) -> u64,
    count: u32,
) -> Option<f64> {
    metrics
        .threads
        .iter()
        .find(|t| t.name == thread)
        .map(|t| field(t) as f64 / f64::from(count.max(1)))
}

/// Runs the wake-up experiment; `Ok(false)` if some run failed.
pub fn run(args: &WakeupArgs) -> Result<bool, BenchError> {
    let lull = lull_binary(args.common.lull.as_ref())?;
    let guest = guest_path("wake-ipi", args.common.kit.as_ref())?;
    let has_halt_poll = lull_has_flag(&lull, "--halt-poll");
    if !has_halt_poll {
        eprintln!(
            "bench: {} has no --halt-poll yet: the user modes run without it",
            lull.display()
        );
    }
    let work = work_dir(args.common.work_dir.as_ref())?;
    eprintln!("bench: wakeup, logs in {}", work.display());
    let mut report = WakeupReport {
        schema: WAKEUP_SCHEMA.into(),
        host: host::host_info(),
        count: args.count,
        halt_poll_applied: has_halt_poll,
        results: Vec::new(),
    };
    println!(
        "wakeup: IPI to a halted vCPU, {} samples per run (KVM halt_poll_ns = {})",
        args.count,
        report
            .host
            .kvm_halt_poll_ns
            .map_or_else(|| "?".to_string(), |v| v.to_string())
    );
    println!("{}", report::wakeup_header());
    let setup = Setup {
        args,
        lull,
        guest,
        has_halt_poll,
        work,
    };
    let mut all_ok = true;
    for mode in &args.modes {
        for &delay in &args.delays {
            let (row, passed) = setup.run_one(mode, delay)?;
            all_ok &= passed;
            println!("{}", report::wakeup_line(&row));
            report.results.push(row);
            if let Some(path) = &args.common.json {
                report::write_json(path, &report)?;
            }
        }
    }
    Ok(all_ok)
}

/// What every run of the experiment shares.
struct Setup<'a> {
    args: &'a WakeupArgs,
    lull: PathBuf,
    guest: PathBuf,
    /// Whether the lull binary takes `--halt-poll`.
    has_halt_poll: bool,
    work: PathBuf,
}

impl Setup<'_> {
    /// One VM in `mode` with IPIs `delay` µs after the halt: its row, and whether it passed.
    fn run_one(&self, mode: &WakeMode, delay: u64) -> Result<(WakeupRow, bool), BenchError> {
        let args = self.args;
        let stem = self.work.join(format!("wakeup-{}-d{delay}", mode.name()));
        let serial = stem.with_extension("console");
        let metrics = stem.with_extension("json");
        let _ = std::fs::remove_file(&serial);
        let (command, halt_poll) = self.command(mode, delay, &serial, &metrics);
        let label = format!("{} delay {delay} us", mode.name());
        eprintln!("bench: wakeup {label}");
        let watch = Watch {
            boot_marker: "wake-ipi: ".into(),
            end_markers: Vec::new(),
            guest_bytes: 64 << 20,
            deadline: Duration::from_secs(120 + u64::from(args.count) / 10),
            settle: Duration::from_secs(0),
            planned: None,
            stagger: false,
            label,
            // About a millisecond per sample (the guest's gap) plus the boot.
            expected: Duration::from_millis(u64::from(args.count)) + Duration::from_secs(2),
        };
        let spec = VmSpec {
            command,
            serial,
            stderr: stem.with_extension("stderr"),
            api: None,
            restore: None,
        };
        let run = fleet::run(vec![spec], &watch)?;
        let vm = &run.vms[0];
        let passed = vm.code == Some(1) && vm.console.contains("wake-ipi: PASS");
        let m = read_metrics(&metrics);
        let row = WakeupRow {
            mode: mode.name(),
            halt_poll,
            delay_us: delay,
            latency: parse_wake_ipi(&vm.console),
            target_cpu_us_per_sample: m
                .as_ref()
                .and_then(|m| thread_per_sample(m, "vcpu1", |t| t.cpu_ns, args.count))
                .map(|ns| ns / 1000.0),
            target_wakeups_per_sample: m.as_ref().and_then(|m| {
                thread_per_sample(m, "vcpu1", |t| t.voluntary_ctxt_switches, args.count)
            }),
            failure: (!passed).then(|| {
                format!(
                    "status {:?}: {}",
                    vm.code,
                    vm.console
                        .lines()
                        .chain(vm.stderr.lines())
                        .last()
                        .unwrap_or("")
                )
            }),
        };
        Ok((row, passed))
    }

    /// The `lull run` of one VM, and the `--halt-poll` it was given (if any).
    fn command(
        &self,
        mode: &WakeMode,
        delay: u64,
        serial: &Path,
        metrics: &Path,
    ) -> (Command, Option<String>) {
        let mut c = Command::new(&self.lull);
        c.arg("run")
            .arg("--kernel")
            .arg(&self.guest)
            .args(["--cpus", "2", "--memory", "64M"])
            .arg("--cmdline")
            .arg(format!("count={} delay_us={delay}", self.args.count))
            .arg("--serial")
            .arg(format!("file={}", serial.display()))
            .arg("--metrics")
            .arg(metrics);
        let mut halt_poll = None;
        match mode {
            WakeMode::Kernel => {
                c.args(["--irqchip", "kernel"]);
            }
            WakeMode::User(p) => {
                c.args(["--irqchip", "user", "--timer-model", &self.args.timer_model]);
                if self.has_halt_poll {
                    c.args(["--halt-poll", p]);
                    halt_poll = Some(p.clone());
                }
            }
        }
        (c, halt_poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!("kernel".parse(), Ok(WakeMode::Kernel));
        assert_eq!("user-off".parse(), Ok(WakeMode::User("off".into())));
        assert_eq!(
            "user-200us".parse::<WakeMode>().map(|m| m.name()),
            Ok("user-200us".to_string())
        );
        assert!("user-".parse::<WakeMode>().is_err());
        assert!("qemu".parse::<WakeMode>().is_err());
    }
}
