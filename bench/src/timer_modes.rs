//! `lull bench timer-modes`: what one guest timer event costs under each irqchip and timer
//! model, measured with the `lapic-timer` guest (one-shot div1, one-shot div16, periodic and
//! TSC-deadline timers of 1 ms, `--count` of each, waiting in HLT).
//!
//! ```text
//! for rep in 1..=--reps, for mode in --modes (interleaved, so host noise hits every mode):
//!     run lapic-timer with count=10 (small) and count=--count (big), one vCPU
//!     per-event cost = (big totals - small totals) / (big events - small events)
//!         -> boot, console output and exit drop out of the difference
//! row per mode = median over the reps
//! ```
//!
//! The totals come from lull's `--metrics`: KVM's own exit counter (in-kernel exits
//! included), the exits that reached lull, the vCPU thread's and the `central` timer thread's
//! voluntary context switches (host wake-ups) and the CPU time of every lull thread. The
//! lateness is the guest's own: rdtsc in the TSC-deadline interrupt handler minus the deadline.
//!
//! Port I/O exits are left out of both exit counts: the guest's only port I/O is its serial
//! console (one exit per character) and the test-exit port, none of it part of a timer event,
//! and its console is not the same from run to run (a note such as "3 of 10 current-count
//! checks came after expiry" comes with a loaded host). Counted in, one such line in the small
//! run (~80 exits) outweighed the 40 events a short run differences (CI once saw 0.25 exits
//! reaching lull per event, where every event exits at least for its HLT).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use lull_schema::{RunReport, ThreadStat, VcpuReadout};
use serde::{Deserialize, Serialize};

use super::common::{guest_path, lull_binary, work_dir, CommonArgs};
use super::density::Mode;
use super::error::BenchError;
use super::guest_output::parse_lapic_timer;
use super::host;
use super::report::{self, median, TimerModesReport, TimerModesRow, TIMER_MODES_SCHEMA};
use super::single_run::{self, SingleRun};

/// Timer events of the small run (each of the guest's four timer modes runs this many).
const SMALL_COUNT: u32 = 10;
/// Exits that reach lull, by the vCPU counters of lull's `--metrics`, port I/O left out (see
/// the top comment).
const LULL_EXITS: &[fn(&VcpuReadout) -> u64] = &[
    |v| v.mmio_read,
    |v| v.mmio_write,
    |v| v.hlt,
    |v| v.msr,
    |v| v.irq_window,
    |v| v.other,
];

/// Flags of `lull bench timer-modes`.
#[derive(Debug, Args)]
pub struct TimerModesArgs {
    /// Timer events per guest timer mode in the measured run (11 to 256; the guest's maximum).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(11..=256))]
    pub count: u32,
    /// Repetitions per mode; rows are medians over them.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
    /// Modes, comma-separated: kernel, pull, push, central. Default: all four.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub modes: Vec<Mode>,
    /// Results, lull binary, kit and logs.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// What one lapic-timer run added up to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RunTotals {
    /// Timer interrupts the guest measured, over its four timer modes.
    pub events: u64,
    /// TSC-deadline lateness, median, ns.
    pub tsc_deadline_p50_ns: i64,
    /// TSC-deadline lateness, 99th percentile, ns.
    pub tsc_deadline_p99_ns: i64,
    /// KVM's exit counter less port I/O (`None` where lull could not read KVM's statistics).
    pub kvm_exits: Option<u64>,
    /// Exits that reached lull, port I/O left out.
    pub lull_exits: u64,
    /// Voluntary context switches of the vCPU thread.
    pub vcpu_wakeups: u64,
    /// Voluntary context switches of the `central` model's timer thread (0 without one).
    pub timer_thread_wakeups: u64,
    /// CPU time of every lull thread, ns.
    pub cpu_ns: u64,
}

fn thread_field(m: &RunReport, name: &str, field: fn(&ThreadStat) -> u64) -> Option<u64> {
    m.threads.iter().find(|t| t.name == name).map(field)
}

/// Adds up a run from the guest's console and lull's metrics; `None` if either lacks a part.
pub fn totals(console: &str, m: &RunReport) -> Option<RunTotals> {
    let lines = parse_lapic_timer(console);
    let tsc = lines.iter().find(|l| l.mode == "tsc-deadline")?;
    let vcpu = m.vcpus.first()?;
    let port_io = vcpu.io_in + vcpu.io_out;
    Some(RunTotals {
        events: lines.iter().map(|l| l.n).sum(),
        tsc_deadline_p50_ns: tsc.p50_ns,
        tsc_deadline_p99_ns: tsc.p99_ns,
        kvm_exits: m
            .kvm
            .as_ref()
            .and_then(|k| k.get("exits"))
            .map(|e| e.saturating_sub(port_io)),
        lull_exits: LULL_EXITS.iter().map(|exits| exits(vcpu)).sum(),
        vcpu_wakeups: thread_field(m, "vcpu0", |t| t.voluntary_ctxt_switches)?,
        timer_thread_wakeups: thread_field(m, "timers", |t| t.voluntary_ctxt_switches).unwrap_or(0),
        cpu_ns: m.threads.iter().map(|t| t.cpu_ns).sum(),
    })
}

/// Costs per timer event of one repetition: the difference of a big and a small run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerEvent {
    /// TSC-deadline lateness of the big run, median, us.
    pub p50_us: f64,
    /// TSC-deadline lateness of the big run, 99th percentile, us.
    pub p99_us: f64,
    /// KVM exits per event.
    pub kvm_exits: Option<f64>,
    /// Exits that reached lull per event.
    pub lull_exits: f64,
    /// vCPU thread wake-ups per event.
    pub vcpu_wakeups: f64,
    /// Timer thread wake-ups per event.
    pub timer_thread_wakeups: f64,
    /// Host CPU time per event, us.
    pub cpu_us: f64,
}

/// The per-event costs of `big` over `small`; `None` if `big` has no more events.
pub fn per_event(big: &RunTotals, small: &RunTotals) -> Option<PerEvent> {
    let events = big.events.checked_sub(small.events).filter(|&e| e > 0)? as f64;
    let d = |b: u64, s: u64| (b as f64 - s as f64) / events;
    Some(PerEvent {
        p50_us: big.tsc_deadline_p50_ns as f64 / 1000.0,
        p99_us: big.tsc_deadline_p99_ns as f64 / 1000.0,
        kvm_exits: big.kvm_exits.zip(small.kvm_exits).map(|(b, s)| d(b, s)),
        lull_exits: d(big.lull_exits, small.lull_exits),
        vcpu_wakeups: d(big.vcpu_wakeups, small.vcpu_wakeups),
        timer_thread_wakeups: d(big.timer_thread_wakeups, small.timer_thread_wakeups),
        cpu_us: d(big.cpu_ns, small.cpu_ns) / 1000.0,
    })
}

/// The row of `mode` over its repetitions.
pub fn row(mode: Mode, reps: &[PerEvent], failures: Vec<String>) -> TimerModesRow {
    let med = |f: fn(&PerEvent) -> f64| median(reps.iter().map(f).collect());
    TimerModesRow {
        mode: mode.name().into(),
        reps_ok: u32::try_from(reps.len()).unwrap_or(u32::MAX),
        tsc_deadline_p50_us: med(|r| r.p50_us),
        tsc_deadline_p99_us: med(|r| r.p99_us),
        kvm_exits_per_event: median(reps.iter().filter_map(|r| r.kvm_exits).collect()),
        lull_exits_per_event: med(|r| r.lull_exits),
        vcpu_wakeups_per_event: med(|r| r.vcpu_wakeups),
        timer_thread_wakeups_per_event: med(|r| r.timer_thread_wakeups),
        cpu_us_per_event: med(|r| r.cpu_us),
        failures,
    }
}

struct Plan {
    lull: PathBuf,
    guest: PathBuf,
    work: PathBuf,
}

impl Plan {
    /// Boots lapic-timer once with `count`; the totals, or why the run failed.
    fn run(
        &self,
        mode: Mode,
        count: u32,
        rep: u32,
    ) -> Result<Result<RunTotals, String>, BenchError> {
        let stem = self
            .work
            .join(format!("timer-modes-{}-c{count}-r{rep}", mode.name()));
        let (vm, metrics) = single_run::run(SingleRun {
            lull: &self.lull,
            guest: &self.guest,
            stem: stem.clone(),
            flags: ["--memory", "64M", "--cmdline", &format!("count={count}")]
                .map(String::from)
                .to_vec(),
            mode,
            boot_marker: "lapic-timer: ",
            deadline: Duration::from_secs(300),
            // Four timer modes of `count` 1-ms timers, plus the boot.
            expected: Duration::from_millis(4 * u64::from(count)) + Duration::from_secs(2),
            label: format!("{} count={count} rep {rep}", mode.name()),
        })?;
        if vm.code != Some(1) || !vm.console.contains("lapic-timer: PASS") {
            return Ok(Err(single_run::failure(&format!("count={count}"), &vm)));
        }
        Ok(metrics
            .and_then(|m| totals(&vm.console, &m))
            .ok_or_else(|| {
                format!(
                    "count={count}: no lateness lines or metrics in {}",
                    stem.display()
                )
            }))
    }
}

/// The modes to run: `--modes`, or all four lull modes; QEMU has no `--metrics`.
pub(crate) fn modes(asked: &[Mode]) -> Result<Vec<Mode>, BenchError> {
    if asked.is_empty() {
        return Ok(Mode::ALL.into_iter().filter(|m| !m.is_qemu()).collect());
    }
    if let Some(q) = asked.iter().find(|m| m.is_qemu()) {
        return Err(BenchError::NoModes(format!(
            "{} has no lull --metrics: use kernel, pull, push or central",
            q.name()
        )));
    }
    Ok(asked.to_vec())
}

/// Runs the timer-modes experiment; `Ok(false)` if some run failed.
pub fn run(args: &TimerModesArgs) -> Result<bool, BenchError> {
    let modes = modes(&args.modes)?;
    let plan = Plan {
        lull: lull_binary(args.common.lull.as_ref())?,
        guest: guest_path("lapic-timer", args.common.kit.as_ref())?,
        work: work_dir(args.common.work_dir.as_ref())?,
    };
    eprintln!("bench: timer-modes, logs in {}", plan.work.display());
    println!(
        "timer-modes: lapic-timer count={} (and {SMALL_COUNT} to difference out boot and exit), \
         {} rep(s) per mode, medians",
        args.count, args.reps
    );
    let mut reps: Vec<(Vec<PerEvent>, Vec<String>)> = vec![Default::default(); modes.len()];
    for rep in 1..=args.reps {
        for (i, &mode) in modes.iter().enumerate() {
            let small = plan.run(mode, SMALL_COUNT, rep)?;
            let big = plan.run(mode, args.count, rep)?;
            match (big, small) {
                (Ok(b), Ok(s)) => match per_event(&b, &s) {
                    Some(p) => reps[i].0.push(p),
                    None => reps[i]
                        .1
                        .push(format!("rep {rep}: no more events at count={}", args.count)),
                },
                (Err(e), _) | (_, Err(e)) => reps[i].1.push(format!("rep {rep}: {e}")),
            }
        }
    }
    let report = TimerModesReport {
        schema: TIMER_MODES_SCHEMA.into(),
        host: host::host_info(),
        count: args.count,
        small_count: SMALL_COUNT,
        reps: args.reps,
        results: modes
            .iter()
            .zip(reps)
            .map(|(&mode, (per, failures))| row(mode, &per, failures))
            .collect(),
    };
    println!("{}", report::timer_modes_header());
    for r in &report.results {
        println!("{}", report::timer_modes_line(r));
        for f in &r.failures {
            println!("  {} failed: {f}", r.mode);
        }
    }
    if let Some(path) = &args.common.json {
        report::write_json(path, &report)?;
    }
    Ok(report.results.iter().all(|r| r.failures.is_empty()))
}

#[cfg(test)]
mod tests {
    use timer::ModelKind;

    use super::*;

    /// `exits` HLT and `exits` MMIO-write exits, 100 console characters, 3 x `exits` in KVM's count
    /// (plus the console's).
    fn metrics(exits: u64, vcpu_wakeups: u64, timer_thread: Option<u64>, cpu_ns: u64) -> RunReport {
        let mut threads = vec![
            serde_json::json!({"name": "lull", "voluntary_ctxt_switches": 3, "cpu_ns": 1000}),
            serde_json::json!({"name": "vcpu0", "voluntary_ctxt_switches": vcpu_wakeups,
                               "cpu_ns": cpu_ns - 1000}),
        ];
        if let Some(w) = timer_thread {
            threads.push(
                serde_json::json!({"name": "timers", "voluntary_ctxt_switches": w,
                                            "cpu_ns": 0}),
            );
        }
        crate::lull_metrics::report(serde_json::json!({
            "vcpus": [{"io_in": 0, "io_out": 100, "mmio_read": 0, "mmio_write": exits,
                       "hlt": exits, "msr": 0, "irq_window": 0, "other": 0}],
            "threads": threads,
            "kvm": {"exits": 3 * exits + 100},
        }))
    }

    fn console(n: u64) -> String {
        format!(
            "lapic-timer: one-shot div1: n={n} lateness ns min 1 p50 2 p99 3 max 4\n\
             lapic-timer: tsc-deadline: n={n} lateness ns min 1 p50 {} p99 9000 max 9999\n\
             lapic-timer: PASS\n",
            n * 100
        )
    }

    #[test]
    fn costs_per_event_difference_out_the_boot() {
        let small = totals(&console(10), &metrics(1_000, 30, Some(5), 2_000_000)).unwrap();
        let big = totals(&console(210), &metrics(1_800, 430, Some(5), 42_000_000)).unwrap();
        assert_eq!((small.events, big.events), (20, 420));
        assert_eq!(big.lull_exits, 3_600);
        let p = per_event(&big, &small).unwrap();
        // 400 more events: 1600 more lull exits, 400 more wake-ups, 40 ms more CPU.
        assert_eq!(p.lull_exits, 4.0);
        assert_eq!(p.kvm_exits, Some(6.0));
        assert_eq!(p.vcpu_wakeups, 1.0);
        assert_eq!(p.timer_thread_wakeups, 0.0);
        assert_eq!(p.cpu_us, 100.0);
        assert_eq!((p.p50_us, p.p99_us), (21.0, 9.0));
        assert_eq!(per_event(&small, &small), None);
    }

    #[test]
    fn console_exits_are_not_timer_event_exits() {
        // The small run printed one more console line (80 more port I/O exits, in KVM's count
        // too): the per-event exits are those of the runs without it.
        let mut chatty = metrics(1_000, 30, Some(5), 2_000_000);
        chatty.vcpus[0].io_out = 180;
        let kvm = chatty.kvm.as_mut().expect("the report has KVM's counters");
        kvm.insert("exits".to_string(), 3 * 1_000 + 180);
        let small = totals(&console(10), &chatty).unwrap();
        let big = totals(&console(210), &metrics(1_800, 430, Some(5), 42_000_000)).unwrap();
        let p = per_event(&big, &small).unwrap();
        assert_eq!((p.lull_exits, p.kvm_exits), (4.0, Some(6.0)));
    }

    #[test]
    fn a_run_without_its_report_has_no_totals() {
        assert_eq!(
            totals("lapic-timer: PASS", &metrics(1, 1, None, 2000)),
            None
        );
        assert_eq!(
            totals(
                &console(10),
                &crate::lull_metrics::report(serde_json::json!({}))
            ),
            None
        );
    }

    #[test]
    fn rows_are_medians() {
        let rep = |x: f64| PerEvent {
            p50_us: x,
            p99_us: x,
            kvm_exits: None,
            lull_exits: x,
            vcpu_wakeups: x,
            timer_thread_wakeups: 0.0,
            cpu_us: x,
        };
        let r = row(
            Mode::User(ModelKind::Central),
            &[rep(5.0), rep(1.0), rep(3.0)],
            Vec::new(),
        );
        assert_eq!((r.mode.as_str(), r.reps_ok), ("central", 3));
        assert_eq!(r.cpu_us_per_event, Some(3.0));
        assert_eq!(r.kvm_exits_per_event, None);
    }

    #[test]
    fn qemu_modes_are_refused() {
        assert!(modes(&[Mode::User(ModelKind::Pull), Mode::QemuOn]).is_err());
        assert_eq!(modes(&[]).unwrap().len(), 4);
    }
}
