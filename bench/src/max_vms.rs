//! `lull bench density --max-vms CAP`: per mode, the most VMs (N VMs x `--cpus`) whose window
//! meets every bound of `--slo` (slo.rs), searched by doubling from 1 VM, then by bisection.
//!
//! ```text
//! doubling:  1 ok, 2 ok, 4 ok, 8 FAIL           (each step a density run of --duration)
//! bisection: 6 ok, 7 FAIL  -> 6, stopped by the bound that failed at 7
//! limits:    CAP reached (all met)             -> CAP, stopped by `cap`
//!            N x what one VM holds > 90% of MemAvailable  -> the most that fit, `memory`
//!            N x one VM's threads > 90% of the threads the host has left -> `threads`
//! ```
//!
//! What one VM holds is measured, not its nominal RAM: its PSS (lull and guest together, the
//! pages clones share divided among them) as the last step's window opened; before the first
//! step, a guess. Its threads likewise (lull's /proc/PID/status); the host's room for threads
//! is the least of `threads-max`, `pid_max` and the cgroup's `pids.max`, less what runs.
//!
//! The lateness bound may be relative (`lateness_vs_one_vm`, slo.rs): a multiple of the p99
//! that one VM had on this host, in the first mode searched (kernel's, which goes first).
//!
//! [`search`] is pure over a `measure(n)` closure; [`run`] measures with density.rs's runs,
//! linux_max_vms.rs with clones of the kit's Linux.
//! Bisection assumes that a count above a failing one fails too: if the outcomes are not
//! monotone the result is a count that met the SLO whose next count failed.

use std::path::PathBuf;
use std::time::Duration;

use super::density::{DensityArgs, Mode, Plan};
use super::error::BenchError;
use super::host;
use super::max_vms_plot;
use super::max_vms_report::{MaxVmsMode, MaxVmsReport, MaxVmsStep, Stop, MAX_VMS_SCHEMA};
use super::power::Reading;
use super::proc_sample;
use super::report::{self, DensityParams, DensityRow, SkippedMode};
use super::slo::{self, Slo, Verdict};

/// Share of `MemAvailable`, and of the threads the host has left, the VMs may take (the rest
/// for the host and lull's peaks).
const HOST_SHARE: f64 = 0.9;

/// What one step of the search measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Every bound was met.
    pub met: bool,
    /// The bounds that were not.
    pub failed: Vec<String>,
    /// What one VM held, bytes (its PSS), if measured.
    pub held_bytes_per_vm: Option<f64>,
    /// One VM's threads (lull's), if measured.
    pub threads_per_vm: Option<f64>,
}

/// What one VM takes of each host resource that bounds the search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerVm {
    /// Memory, bytes.
    pub bytes: f64,
    /// Threads.
    pub threads: f64,
}

/// What bounds the search besides the SLO.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Search up to this many VMs.
    pub cap: u32,
    /// The host's `MemAvailable` with no VM, bytes (`None`: unknown, no memory bound).
    pub mem_available: Option<u64>,
    /// The threads the host can still start with no VM (`None`: unknown, no thread bound).
    pub threads_available: Option<u64>,
    /// What one VM takes before one is measured.
    pub guess: PerVm,
}

/// The most VMs of `per_vm` each, up to `upto`, within `share` of `available`.
fn fit_count(available: f64, per_vm: f64, upto: u32) -> u32 {
    let budget = available * HOST_SHARE;
    let fit = |n: u32| f64::from(n) * per_vm <= budget;
    // Bisection over the counts: fit(lo) holds, fit(hi + 1) does not.
    let (mut lo, mut hi) = (0u32, upto);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fit(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

impl Limits {
    /// The most VMs of `per` each, up to `upto`, that the host's memory and threads hold, and
    /// the bound that holds fewer than `upto` (the cap if none does).
    fn room(&self, per: PerVm, upto: u32) -> (u32, Stop) {
        let memory = self.mem_available.map(|avail| {
            let fits = fit_count(avail as f64, per.bytes, upto);
            let stop = Stop::Memory {
                fits,
                per_vm_bytes: per.bytes,
                available_bytes: avail,
            };
            (fits, stop)
        });
        let threads = self.threads_available.map(|avail| {
            let fits = fit_count(avail as f64, per.threads, upto);
            let stop = Stop::Threads {
                fits,
                per_vm: per.threads,
                available: avail,
            };
            (fits, stop)
        });
        [memory, threads]
            .into_iter()
            .flatten()
            .filter(|(fits, _)| *fits < upto)
            .min_by_key(|(fits, _)| *fits)
            .unwrap_or((upto, Stop::Cap { cap: self.cap }))
    }
}

/// The result of a search.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// The counts measured, in order.
    pub tried: Vec<u32>,
    /// The most VMs that met the SLO (0: not even one).
    pub max_vms: u32,
    /// Why not more.
    pub stop: Stop,
}

/// Searches the most VMs within the SLO: doubling from 1, then bisection between the last
/// count that met it and the first that did not, never past the cap or the memory.
pub fn search(limits: &Limits, mut measure: impl FnMut(u32) -> Outcome) -> Found {
    let mut per = limits.guess;
    let mut tried = Vec::new();
    let (mut lo, mut n) = (0u32, 1u32);
    let mut step = |n: u32, per: &mut PerVm, tried: &mut Vec<u32>| {
        let o = measure(n);
        tried.push(n);
        if let Some(bytes) = o.held_bytes_per_vm {
            per.bytes = bytes;
        }
        if let Some(threads) = o.threads_per_vm {
            per.threads = threads;
        }
        o
    };
    // Doubling: up to the first failure, the cap, the memory or the threads.
    let (mut hi, mut failed) = loop {
        let (fits, bound) = limits.room(per, limits.cap);
        let next = n.min(limits.cap).min(fits);
        if next <= lo {
            let stop = if lo >= limits.cap {
                Stop::Cap { cap: limits.cap }
            } else {
                bound
            };
            return Found {
                tried,
                max_vms: lo,
                stop,
            };
        }
        let o = step(next, &mut per, &mut tried);
        if !o.met {
            break (next, o.failed);
        }
        lo = next;
        n = next.saturating_mul(2);
    };
    // Bisection between lo (met) and hi (failed).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let (fits, bound) = limits.room(per, limits.cap);
        if mid > fits {
            return Found {
                tried,
                max_vms: lo.min(fits),
                stop: bound,
            };
        }
        let o = step(mid, &mut per, &mut tried);
        if o.met {
            lo = mid;
        } else {
            (hi, failed) = (mid, o.failed);
        }
    }
    Found {
        tried,
        max_vms: lo,
        stop: Stop::Slo { vms: hi, failed },
    }
}

/// What one booted VM of `args` takes before one is measured: its guest RAM and 32 MiB of
/// lull's own, 8 threads.
fn guess(args: &DensityArgs) -> PerVm {
    PerVm {
        bytes: (args.memory_bytes() + (32 << 20)) as f64,
        threads: 8.0,
    }
}

/// The host's limits for a search up to `cap` VMs of `guess` each.
pub(crate) fn host_limits(cap: u32, guess: PerVm) -> Limits {
    Limits {
        cap,
        mem_available: proc_sample::mem_available_kib().map(|k| k * 1024),
        threads_available: proc_sample::threads_available(),
        guess,
    }
}

/// The report before its first search.
pub(crate) fn empty_report(
    params: DensityParams,
    cap: u32,
    slo: &Slo,
    limits: &Limits,
    skipped: Vec<SkippedMode>,
) -> MaxVmsReport {
    MaxVmsReport {
        schema: MAX_VMS_SCHEMA.into(),
        host: host::host_info(),
        params,
        cap,
        slo: slo.clone(),
        mem_available_bytes: limits.mem_available,
        threads_available: limits.threads_available,
        lateness_reference_p99_ns: None,
        power_baseline: Reading::missing("not measured yet"),
        modes: Vec::new(),
        skipped,
    }
}

/// Prints the search's header: what it runs and its bounds.
pub(crate) fn print_header(
    report: &MaxVmsReport,
    cpus_per_vm: u32,
    step: Duration,
    row_header: String,
) {
    println!(
        "max-vms: up to {} VMs x {cpus_per_vm} vCPUs per mode, {step:?} per step, SLO {}",
        report.cap,
        slo_text(&report.slo)
    );
    println!("{row_header}  verdict");
}

/// Kernel first: a relative lateness bound multiplies the p99 of the first mode's one VM.
pub(crate) fn kernel_first(modes: &mut [Mode]) {
    modes.sort_by_key(|m| *m != Mode::Kernel);
}

/// Runs the search up to `cap` VMs for every mode of `args`, prints the steps and the result
/// table, writes the JSON and the plot; `Ok(false)` if a mode held not even one VM.
pub fn run(args: &DensityArgs, cap: u32) -> Result<bool, BenchError> {
    let (plan, mut modes, skipped) = Plan::new(args)?;
    kernel_first(&mut modes);
    let limits = host_limits(cap, guess(args));
    let params = plan.empty_report(&modes, Vec::new()).params;
    let mut report = empty_report(params, cap, &args.slo, &limits, skipped);
    print_header(&report, args.cpus, args.duration, report::density_header());
    report.power_baseline = args.power_baseline();
    let baseline = report.power_baseline.clone();
    for &mode in &modes {
        let searched = search_mode(&mut report, mode.name(), &limits, args.cpus, |n| {
            plan.measure(mode, n, &baseline)
        })?;
        report.modes.push(searched);
        set_ratios(&mut report.modes);
        if let Some(path) = &args.common.json {
            report::write_json(path, &report)?;
        }
    }
    finish(&report, args.plot.as_ref())?;
    Ok(report.modes.iter().all(|m| m.max_vms > 0))
}

/// Searches the most VMs of the mode `name` (`cpus_per_vm` vCPUs each) within `report`'s
/// SLO, `measure(n)` running n VMs; the first one-VM step measured sets the report's lateness
/// reference. The first error ends the search.
pub(crate) fn search_mode(
    report: &mut MaxVmsReport,
    name: &str,
    limits: &Limits,
    cpus_per_vm: u32,
    mut measure: impl FnMut(u32) -> Result<DensityRow, BenchError>,
) -> Result<MaxVmsMode, BenchError> {
    let host_cpus = report.host.cpus;
    let mut steps: Vec<MaxVmsStep> = Vec::new();
    let mut error = None;
    let found = search(limits, |n| {
        if error.is_some() {
            return error_outcome();
        }
        eprintln!(
            "bench: max-vms {name}: step {} with {n} VM(s)",
            steps.len() + 1
        );
        let row = match measure(n) {
            Ok(row) => row,
            Err(e) => {
                error.get_or_insert(e);
                return error_outcome();
            }
        };
        if n == 1 && report.lateness_reference_p99_ns.is_none() && row.lateness.n > 0 {
            report.lateness_reference_p99_ns = Some(row.lateness.p99_ns);
        }
        let verdicts = slo::judge(
            &report.slo,
            &row,
            host_cpus,
            report.lateness_reference_p99_ns,
        );
        let step = MaxVmsStep {
            vms: n,
            met: verdicts.iter().all(|v| v.met),
            verdicts,
            row,
        };
        match step.row.linux {
            // linux_density printed the row (and its clone and failure lines) already.
            Some(_) => println!("  {name} N={n}: {}", verdict_text(&step)),
            None => println!(
                "{}  {}",
                report::density_line(&step.row),
                verdict_text(&step)
            ),
        }
        let outcome = Outcome {
            met: step.met,
            failed: failed_bounds(&step.verdicts),
            held_bytes_per_vm: step.row.pss_kib_per_vm.map(|k| k * 1024.0),
            threads_per_vm: step.row.threads_per_vm,
        };
        steps.push(step);
        outcome
    });
    if let Some(e) = error {
        return Err(e);
    }
    Ok(MaxVmsMode {
        mode: name.into(),
        steps,
        max_vms: found.max_vms,
        max_vcpus: found.max_vms * cpus_per_vm,
        stopped_by: found.stop,
        ratio_to_kernel: None,
    })
}

/// The outcome of a step that could not be measured.
fn error_outcome() -> Outcome {
    Outcome {
        met: false,
        failed: vec!["error".into()],
        held_bytes_per_vm: None,
        threads_per_vm: None,
    }
}

/// After the last mode: the result table, the modes left out, the plot.
pub(crate) fn finish(report: &MaxVmsReport, plot: Option<&PathBuf>) -> Result<(), BenchError> {
    for line in result_table(report) {
        println!("{line}");
    }
    for s in &report.skipped {
        println!("{} skipped: {}", s.mode, s.reason);
    }
    if let Some(path) = plot {
        let svg = max_vms_plot::svg(report)?;
        crate::report::write_output(path, svg.as_bytes())?;
        eprintln!("bench: plot written to {}", path.display());
    }
    Ok(())
}

fn failed_bounds(verdicts: &[Verdict]) -> Vec<String> {
    verdicts
        .iter()
        .filter(|v| !v.met)
        .map(|v| v.bound.clone())
        .collect()
}

fn slo_text(slo: &Slo) -> String {
    let mut s = format!("lateness_p99 <= {} ms", slo.lateness_p99_ns as f64 / 1e6);
    if let Some(x) = slo.lateness_vs_one_vm {
        s.push_str(&format!(" or {x}x one VM's (the first mode's)"));
    }
    s.push_str(&format!(", host_busy <= {}%", slo.host_busy_percent));
    if let Some(ipi) = slo.ipi_p99_ns {
        s.push_str(&format!(", ipi_p99 <= {} ms", ipi as f64 / 1e6));
    }
    s + ", no VM failing"
}

fn verdict_text(step: &MaxVmsStep) -> String {
    if step.met {
        return "met".into();
    }
    let why: Vec<String> = step
        .verdicts
        .iter()
        .filter(|v| !v.met)
        .map(|v| match v.figure {
            Some(f) => format!("{} {f:.2} {} > {:.2}", v.bound, v.unit, v.limit),
            None => format!("{} not measured", v.bound),
        })
        .collect();
    format!("FAILED: {}", why.join(", "))
}

/// Sets every mode's ratio to kernel's count.
pub(crate) fn set_ratios(modes: &mut [MaxVmsMode]) {
    let kernel = modes.iter().find(|m| m.mode == "kernel").map(|m| m.max_vms);
    for m in modes.iter_mut() {
        m.ratio_to_kernel = match kernel {
            Some(k) if k > 0 && m.mode != "kernel" => Some(f64::from(m.max_vms) / f64::from(k)),
            _ => None,
        };
    }
}

fn stop_text(stop: &Stop) -> String {
    match stop {
        Stop::Cap { cap } => format!("cap ({cap})"),
        Stop::Memory {
            fits,
            per_vm_bytes,
            available_bytes,
        } => format!(
            "memory ({fits} x {:.0} MiB in 90% of {} MiB available)",
            per_vm_bytes / f64::from(1u32 << 20),
            available_bytes >> 20
        ),
        Stop::Threads {
            fits,
            per_vm,
            available,
        } => format!("threads ({fits} x {per_vm:.0} in 90% of {available} left)"),
        Stop::Slo { vms, failed } => format!("{} at {vms} VMs", failed.join(", ")),
    }
}

/// The result table: the most VMs per mode, the ratio to kernel, what stopped the search.
pub fn result_table(report: &MaxVmsReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<9}{:>8}{:>8}{:>10}{:>7}  {}",
        "mode", "max_VMs", "vCPUs", "/kernel", "steps", "stopped by"
    )];
    for m in &report.modes {
        lines.push(format!(
            "{:<9}{:>8}{:>8}{:>10}{:>7}  {}",
            m.mode,
            m.max_vms,
            m.max_vcpus,
            m.ratio_to_kernel
                .map_or_else(|| "-".into(), |r| format!("{r:.2}")),
            m.steps.len(),
            stop_text(&m.stopped_by)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn limits(cap: u32) -> Limits {
        Limits {
            cap,
            mem_available: None,
            threads_available: None,
            guess: PerVm {
                bytes: (96 * MIB) as f64,
                threads: 4.0,
            },
        }
    }

    /// A measure that meets the SLO where `ok(n)`, recording the counts asked.
    fn fake(ok: impl Fn(u32) -> bool) -> impl FnMut(u32) -> Outcome {
        move |n| Outcome {
            met: ok(n),
            failed: if ok(n) {
                vec![]
            } else {
                vec!["lateness_p99".into()]
            },
            held_bytes_per_vm: None,
            threads_per_vm: None,
        }
    }

    #[test]
    fn a_monotone_host_is_found_by_doubling_then_bisection() {
        let f = search(&limits(64), fake(|n| n <= 6));
        assert_eq!(f.tried, vec![1, 2, 4, 8, 6, 7]);
        assert_eq!(f.max_vms, 6);
        assert_eq!(
            f.stop,
            Stop::Slo {
                vms: 7,
                failed: vec!["lateness_p99".into()]
            }
        );
    }

    #[test]
    fn non_monotone_outcomes_give_a_met_count_whose_next_failed() {
        // 4 fails but 5 and 6 would pass: bisection between 2 and 4 settles on 3 | 4.
        let ok = |n: u32| n != 4 && n <= 6;
        let f = search(&limits(64), fake(ok));
        assert_eq!(f.tried, vec![1, 2, 4, 3]);
        assert_eq!(f.max_vms, 3);
        assert!(ok(f.max_vms) && f.tried.contains(&(f.max_vms + 1)) && !ok(f.max_vms + 1));
    }

    #[test]
    fn the_cap_ends_a_search_that_always_meets() {
        let f = search(&limits(5), fake(|_| true));
        assert_eq!(f.tried, vec![1, 2, 4, 5]);
        assert_eq!((f.max_vms, f.stop), (5, Stop::Cap { cap: 5 }));
        // A cap that is a power of two is reached by doubling alone.
        let f = search(&limits(4), fake(|_| true));
        assert_eq!(f.tried, vec![1, 2, 4]);
        assert_eq!(f.max_vms, 4);
    }

    #[test]
    fn memory_stops_the_search_before_the_host_runs_out() {
        // 1000 MiB available: 90% holds 9 VMs of the 96 MiB guessed, then 7 of 128 MiB once a
        // VM is measured to hold that much.
        let mut l = limits(64);
        l.mem_available = Some(1000 * MIB);
        let f = search(&l, fake(|_| true));
        assert_eq!(f.tried, vec![1, 2, 4, 8, 9]);
        assert_eq!(f.max_vms, 9);
        assert!(matches!(f.stop, Stop::Memory { fits: 9, .. }), "{f:?}");
        let measured = |n: u32| Outcome {
            met: true,
            failed: vec![],
            held_bytes_per_vm: Some((128 * MIB + u64::from(n)) as f64),
            threads_per_vm: None,
        };
        let f = search(&l, measured);
        assert_eq!(f.tried, vec![1, 2, 4, 7]);
        assert_eq!(f.max_vms, 7);
        assert!(
            matches!(f.stop, Stop::Memory { fits: 7, per_vm_bytes, available_bytes }
                if per_vm_bytes == (128 * MIB + 7) as f64 && available_bytes == 1000 * MIB),
            "{f:?}"
        );
        // Not even one VM fits: nothing runs.
        l.mem_available = Some(50 * MIB);
        let f = search(&l, fake(|_| panic!("nothing fits: no run")));
        assert_eq!((f.tried.len(), f.max_vms), (0, 0));
        assert!(matches!(f.stop, Stop::Memory { fits: 0, .. }));
    }

    #[test]
    fn threads_stop_the_search_when_they_run_out_before_memory() {
        // 100 threads left: 90 for VMs; 9 VMs of the 10 measured (4 guessed: 22 would fit).
        let mut l = limits(64);
        l.mem_available = Some(100_000 * MIB);
        l.threads_available = Some(100);
        let measured = |_| Outcome {
            met: true,
            failed: vec![],
            held_bytes_per_vm: Some((8 * MIB) as f64),
            threads_per_vm: Some(10.0),
        };
        let f = search(&l, measured);
        assert_eq!(f.tried, vec![1, 2, 4, 8, 9]);
        assert_eq!(f.max_vms, 9);
        assert!(
            matches!(f.stop, Stop::Threads { fits: 9, per_vm, available: 100 } if per_vm == 10.0),
            "{f:?}"
        );
        // Plenty of threads: memory binds, and is named (200 MiB: 90% holds 1 VM of the
        // 96 MiB guessed, then 22 of the 8 MiB measured).
        l.threads_available = Some(1_000_000);
        l.mem_available = Some(200 * MIB);
        let f = search(&l, measured);
        assert_eq!(f.tried, vec![1, 2, 4, 8, 16, 22]);
        assert!(matches!(f.stop, Stop::Memory { fits: 22, .. }), "{f:?}");
    }

    #[test]
    fn all_failing_at_one_vm_holds_none() {
        let f = search(&limits(64), fake(|_| false));
        assert_eq!(f.tried, vec![1]);
        assert_eq!(f.max_vms, 0);
        assert!(matches!(f.stop, Stop::Slo { vms: 1, .. }));
    }

    #[test]
    fn ratios_are_to_kernels_count() {
        let m = |mode: &str, n: u32| MaxVmsMode {
            mode: mode.into(),
            steps: Vec::new(),
            max_vms: n,
            max_vcpus: 2 * n,
            stopped_by: Stop::Cap { cap: 8 },
            ratio_to_kernel: None,
        };
        let mut modes = vec![m("kernel", 4), m("pull", 6)];
        set_ratios(&mut modes);
        assert_eq!(modes[0].ratio_to_kernel, None);
        assert_eq!(modes[1].ratio_to_kernel, Some(1.5));
    }
}
