//! `lull bench latency`: lateness of short TSC deadlines that the guest re-arms from its own
//! timer interrupt handler (cyclictest-like guests, high-rate hrtimers), per irqchip and timer
//! model, with and without the guest's paravirtual EOI.
//!
//! ```text
//! for rep in 1..=--reps, for pattern in --patterns, for pv in --pv, for mode in --modes
//! (interleaved, so host noise hits every mode):
//!     one 1-vCPU VM of idle-sim pattern=<pattern> delta=--delta for --duration:
//!         its handler takes the TSC, writes the next deadline (TSC + delta), EOIs;
//!         rearm-halt halts between interrupts, rearm-busy writes to the serial port
//!     -> the guest's lateness histogram (p50, p99, max, early count), lull's thread CPU
//! row per (pattern, pv, mode) = medians over the reps; ratios to the kernel row of its
//! (pattern, pv) group
//! ```
//!
//! The host CPU per event is every lull thread's CPU time over the whole run divided by the
//! guest's timer interrupts: boot and exit (tens of milliseconds) are in it, in every mode
//! alike, so runs of a few seconds keep them to a few percent.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::common::{guest_path, lull_binary, work_dir, CommonArgs};
use super::density::Mode;
use super::error::BenchError;
use super::host;
use super::latency_report::{self, LatencyReport, RunMeasure, LATENCY_SCHEMA};
use super::report;
use super::single_run::{self, SingleRun};
use super::timer_modes::modes;
use super::units::parse_duration;

/// What the guest does between its timer interrupts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Pattern {
    /// Halts: every deadline wakes a halted vCPU.
    RearmHalt,
    /// Writes to the serial port: the vCPU runs and exits for port I/O at every character.
    RearmBusy,
}

impl Pattern {
    /// idle-sim's `pattern=` and the name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::RearmHalt => "rearm-halt",
            Self::RearmBusy => "rearm-busy",
        }
    }
}

/// The paravirtual features the guest is asked to use (it falls back where they are not
/// offered: the table and JSON say what it used).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Pv {
    /// The EOI register and IA32_TSC_DEADLINE.
    None,
    /// KVM's PV EOI (lull's own with `--irqchip user`, KVM's with `kernel`).
    Eoi,
    /// PV EOI and lull's PV deadline (rearm-halt only; `kernel` has no PV deadline).
    EoiDeadline,
}

impl Pv {
    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Eoi => "eoi",
            Self::EoiDeadline => "eoi-deadline",
        }
    }

    /// idle-sim's parameters for it.
    fn cmdline(self) -> &'static str {
        match self {
            Self::None => "pv_eoi=0 pv_deadline=0",
            Self::Eoi => "pv_eoi=1 pv_deadline=0",
            Self::EoiDeadline => "pv_eoi=1 pv_deadline=1",
        }
    }
}

/// Flags of `lull bench latency`.
#[derive(Debug, Args)]
pub struct LatencyArgs {
    /// How long each run's guest re-arms its timer (e.g. 1s for a quick look, 5s to measure).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// How far ahead the guest arms each deadline, TSC cycles (200000 is ~77 us at 2.6 GHz).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1000..))]
    pub delta: u64,
    /// 1: the guest's handler does its bookkeeping after its EOI (its tail, in which a short
    /// deadline passes on hosts that emulate guest kernel code); 0: before its WRMSR, so the
    /// deadline passes while the vCPU halts (idle-sim `tail=`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=1))]
    pub tail: u32,
    /// Patterns, comma-separated: rearm-halt, rearm-busy. Default: both.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "rearm-halt,rearm-busy"
    )]
    pub patterns: Vec<Pattern>,
    /// Paravirtual features, comma-separated: none, eoi, eoi-deadline.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "none,eoi")]
    pub pv: Vec<Pv>,
    /// Modes, comma-separated: kernel, pull, push, central. Default: all four.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub modes: Vec<Mode>,
    /// Repetitions per row; rows are medians over them.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
    /// Results, lull binary, kit and logs.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// The (pattern, pv) groups to run: PV deadline only where the vCPU halts.
fn groups(patterns: &[Pattern], pvs: &[Pv]) -> Vec<(Pattern, Pv)> {
    let mut out = Vec::new();
    for &p in patterns {
        for &pv in pvs {
            let deadline_while_running = pv == Pv::EoiDeadline && p == Pattern::RearmBusy;
            if !deadline_while_running && !out.contains(&(p, pv)) {
                out.push((p, pv));
            }
        }
    }
    out
}

struct Plan<'a> {
    args: &'a LatencyArgs,
    lull: PathBuf,
    guest: PathBuf,
    work: PathBuf,
}

impl Plan<'_> {
    /// One VM; its measure, or why it failed.
    fn run(
        &self,
        pattern: Pattern,
        pv: Pv,
        mode: Mode,
        rep: u32,
    ) -> Result<Result<RunMeasure, String>, BenchError> {
        let label = format!(
            "{} pv={} {} rep {rep}",
            pattern.name(),
            pv.name(),
            mode.name()
        );
        let stem = self.work.join(format!(
            "latency-{}-{}-{}-r{rep}",
            pattern.name(),
            pv.name(),
            mode.name()
        ));
        let cmdline = format!(
            "cpus=1 duration_ms={} pattern={} delta={} tail={} {}",
            self.args.duration.as_millis(),
            pattern.name(),
            self.args.delta,
            self.args.tail,
            pv.cmdline()
        );
        let (vm, metrics) = single_run::run(SingleRun {
            lull: &self.lull,
            guest: &self.guest,
            stem: stem.clone(),
            flags: vec![
                "--cpus".into(),
                "1".into(),
                "--memory".into(),
                "64M".into(),
                "--cmdline".into(),
                cmdline,
            ],
            mode,
            boot_marker: "idle-sim: ",
            deadline: self.args.duration + Duration::from_secs(120),
            expected: self.args.duration + Duration::from_secs(1),
            label: label.clone(),
        })?;
        if vm.code != Some(1) {
            return Ok(Err(single_run::failure(&label, &vm)));
        }
        Ok(metrics
            .and_then(|m| latency_report::measure(&vm.console, &m, pattern.name()))
            .ok_or_else(|| {
                format!(
                    "{label}: no PASS, no timer interrupt, not pattern={} (an old kit: `make \
                     guests`) or no metrics in {}",
                    pattern.name(),
                    stem.display()
                )
            }))
    }
}

/// Runs the latency experiment; `Ok(false)` if some run failed.
pub fn run(args: &LatencyArgs) -> Result<bool, BenchError> {
    let modes = modes(&args.modes)?;
    let groups = groups(&args.patterns, &args.pv);
    let plan = Plan {
        args,
        lull: lull_binary(args.common.lull.as_ref())?,
        guest: guest_path("idle-sim", args.common.kit.as_ref())?,
        work: work_dir(args.common.work_dir.as_ref())?,
    };
    eprintln!("bench: latency, logs in {}", plan.work.display());
    println!(
        "latency: idle-sim re-arming its TSC deadline {} cycles ahead from its handler (tail={}), \
         1 vCPU, {:?} per run, {} rep(s), medians; ratios to kernel in the same pattern and pv",
        args.delta, args.tail, args.duration, args.reps
    );
    let cells: Vec<(Pattern, Pv, Mode)> = groups
        .iter()
        .flat_map(|&(p, pv)| modes.iter().map(move |&m| (p, pv, m)))
        .collect();
    let mut results: Vec<(Vec<RunMeasure>, Vec<String>)> = vec![Default::default(); cells.len()];
    for rep in 1..=args.reps {
        for (i, &(pattern, pv, mode)) in cells.iter().enumerate() {
            match plan.run(pattern, pv, mode, rep)? {
                Ok(m) => {
                    if m.early > 0 {
                        let early =
                            format!("rep {rep}: {} interrupt(s) before their deadline", m.early);
                        results[i].1.push(early);
                    }
                    results[i].0.push(m);
                }
                Err(e) => results[i].1.push(e),
            }
        }
    }
    let rows = cells
        .iter()
        .zip(results)
        .map(|(&(pattern, pv, mode), (runs, failures))| {
            latency_report::row(pattern.name(), pv.name(), mode.name(), &runs, failures)
        })
        .collect();
    let report = LatencyReport {
        schema: LATENCY_SCHEMA.into(),
        host: host::host_info(),
        duration_s: args.duration.as_secs_f64(),
        delta_tsc: args.delta,
        tail: args.tail,
        reps: args.reps,
        results: latency_report::with_kernel_ratios(rows),
    };
    println!("{}", latency_report::header());
    for r in &report.results {
        println!("{}", latency_report::line(r));
        for f in &r.failures {
            println!("  failed: {f}");
        }
    }
    if let Some(path) = &args.common.json {
        report::write_json(path, &report)?;
    }
    Ok(report.results.iter().all(|r| r.failures.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pv_deadline_runs_only_where_the_vcpu_halts() {
        let g = groups(
            &[Pattern::RearmHalt, Pattern::RearmBusy],
            &[Pv::None, Pv::EoiDeadline, Pv::None],
        );
        assert_eq!(
            g,
            vec![
                (Pattern::RearmHalt, Pv::None),
                (Pattern::RearmHalt, Pv::EoiDeadline),
                (Pattern::RearmBusy, Pv::None),
            ]
        );
    }
}
