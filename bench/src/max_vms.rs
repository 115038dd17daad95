//! `lull bench density --max-vms CAP`: per mode, the most VMs (N VMs x `--cpus`) whose window
//! meets every bound of `--slo` (slo.rs), searched by doubling from 1 VM, then by bisection.
//!
//! ```text
//! doubling:  1 ok, 2 ok, 4 ok, 8 FAIL           (each step a density run of --duration)
//! bisection: 6 ok, 7 FAIL  -> 6, stopped by the bound that failed at 7
//! limits:    CAP reached (all met)             -> CAP, stopped by `cap`
//!            N x (guest RAM + VMM RSS) > 90% of MemAvailable -> the most that fit, `memory`
//! ```
//!
//! [`search`] is pure over a `measure(n)` closure; [`run`] measures with density.rs's runs.
//! Bisection assumes that a count above a failing one fails too: if the outcomes are not
//! monotone the result is a count that met the SLO whose next count failed.

use std::path::PathBuf;

use super::density::{DensityArgs, Mode, Plan};
use super::error::BenchError;
use super::host;
use super::max_vms_plot;
use super::max_vms_report::{MaxVmsMode, MaxVmsReport, MaxVmsStep, Stop, MAX_VMS_SCHEMA};
use super::power::{PowerWindow, Reading};
use super::report;
use super::slo::{self, Slo, Verdict};

/// Share of `MemAvailable` the VMs may take (the rest for the host and lull's peaks).
const MEMORY_SHARE: f64 = 0.9;

/// What one step of the search measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Every bound was met.
    pub met: bool,
    /// The bounds that were not.
    pub failed: Vec<String>,
    /// The VMM's own resident memory per VM, bytes, if measured.
    pub vmm_bytes_per_vm: Option<f64>,
}

/// What bounds the search besides the SLO.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Search up to this many VMs.
    pub cap: u32,
    /// The host's `MemAvailable` with no VM, bytes (`None`: unknown, no memory bound).
    pub mem_available: Option<u64>,
    /// Guest RAM per VM, bytes.
    pub guest_bytes: u64,
    /// The VMM's own memory per VM before one is measured, bytes.
    pub vmm_guess: u64,
}

impl Limits {
    /// The most VMs of `per_vm` bytes each, up to `upto`, that fit in the memory's share
    /// (`upto` if memory is unknown).
    fn fits(&self, per_vm: f64, upto: u32) -> u32 {
        let Some(avail) = self.mem_available else {
            return upto;
        };
        let budget = avail as f64 * MEMORY_SHARE;
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
    let mut per_vm = (limits.guest_bytes + limits.vmm_guess) as f64;
    let mut tried = Vec::new();
    let (mut lo, mut n) = (0u32, 1u32);
    let memory = |per_vm: f64, fits: u32| Stop::Memory {
        fits,
        per_vm_bytes: per_vm,
        available_bytes: limits.mem_available.unwrap_or(0),
    };
    let mut step = |n: u32, per_vm: &mut f64, tried: &mut Vec<u32>| {
        let o = measure(n);
        tried.push(n);
        if let Some(vmm) = o.vmm_bytes_per_vm {
            *per_vm = limits.guest_bytes as f64 + vmm;
        }
        o
    };
    // Doubling: up to the first failure, the cap or the memory.
    let (mut hi, mut failed) = loop {
        let fits = limits.fits(per_vm, limits.cap);
        let next = n.min(limits.cap).min(fits);
        if next <= lo {
            let stop = if lo >= limits.cap {
                Stop::Cap { cap: limits.cap }
            } else {
                memory(per_vm, fits)
            };
            return Found {
                tried,
                max_vms: lo,
                stop,
            };
        }
        let o = step(next, &mut per_vm, &mut tried);
        if !o.met {
            break (next, o.failed);
        }
        lo = next;
        n = next.saturating_mul(2);
    };
    // Bisection between lo (met) and hi (failed).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let fits = limits.fits(per_vm, limits.cap);
        if mid > fits {
            return Found {
                tried,
                max_vms: lo.min(fits),
                stop: memory(per_vm, fits),
            };
        }
        let o = step(mid, &mut per_vm, &mut tried);
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

/// `MemAvailable` of this host, bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The VMM's own memory per VM before one is measured: 32 MiB.
const VMM_GUESS: u64 = 32 << 20;

/// Runs the search up to `cap` VMs for every mode of `args`, prints the steps and the result
/// table, writes the JSON and the plot; `Ok(false)` if a mode held not even one VM.
pub fn run(args: &DensityArgs, cap: u32) -> Result<bool, BenchError> {
    let (plan, modes, skipped) = Plan::new(args)?;
    let slo = args.slo.clone();
    let cpus = host::host_info().cpus;
    let mut report = MaxVmsReport {
        schema: MAX_VMS_SCHEMA.into(),
        host: host::host_info(),
        params: plan.empty_report(&modes, Vec::new()).params,
        cap,
        slo: slo.clone(),
        mem_available_bytes: mem_available(),
        power_baseline: Reading::missing("not measured yet"),
        modes: Vec::new(),
        skipped,
    };
    println!(
        "max-vms: up to {cap} VMs x {} vCPUs per mode, {:?} per step, SLO {}",
        args.cpus,
        args.duration,
        slo_text(&slo)
    );
    report.power_baseline = args.power_baseline();
    println!("{}  verdict", report::density_header());
    let limits = Limits {
        cap,
        mem_available: report.mem_available_bytes,
        guest_bytes: args.memory_bytes(),
        vmm_guess: VMM_GUESS,
    };
    for &mode in &modes {
        let searched = search_mode(&plan, mode, &limits, &report.power_baseline, cpus)?;
        report.modes.push(searched);
        set_ratios(&mut report.modes);
        if let Some(path) = &args.common.json {
            report::write_json(path, &report)?;
        }
    }
    finish(&report, args.plot.as_ref())?;
    Ok(report.modes.iter().all(|m| m.max_vms > 0))
}

/// Searches the most VMs of `mode` within the SLO, each count a run of `plan` measured
/// against `baseline` on a host of `cpus` CPUs; the first error ends the search.
fn search_mode(
    plan: &Plan,
    mode: Mode,
    limits: &Limits,
    baseline: &Reading<PowerWindow>,
    cpus: usize,
) -> Result<MaxVmsMode, BenchError> {
    let mut steps: Vec<MaxVmsStep> = Vec::new();
    let mut error = None;
    let found = search(limits, |n| {
        if error.is_some() {
            return error_outcome();
        }
        eprintln!(
            "bench: max-vms {}: step {} with {n} VM(s)",
            mode.name(),
            steps.len() + 1
        );
        let step = match measure_step(plan, mode, n, baseline, cpus) {
            Ok(step) => step,
            Err(e) => {
                error.get_or_insert(e);
                return error_outcome();
            }
        };
        let outcome = Outcome {
            met: step.met,
            failed: failed_bounds(&step.verdicts),
            vmm_bytes_per_vm: step.row.vmm_rss_kib_per_vm.map(|k| k * 1024.0),
        };
        steps.push(step);
        outcome
    });
    if let Some(e) = error {
        return Err(e);
    }
    Ok(MaxVmsMode {
        mode: mode.name().into(),
        steps,
        max_vms: found.max_vms,
        max_vcpus: found.max_vms * plan.args.cpus,
        stopped_by: found.stop,
        ratio_to_kernel: None,
    })
}

/// The outcome of a step that could not be measured.
fn error_outcome() -> Outcome {
    Outcome {
        met: false,
        failed: vec!["error".into()],
        vmm_bytes_per_vm: None,
    }
}

/// Runs `n` VMs in `mode`, judges the row by the SLO and prints it with its verdict.
fn measure_step(
    plan: &Plan,
    mode: Mode,
    n: u32,
    baseline: &Reading<PowerWindow>,
    cpus: usize,
) -> Result<MaxVmsStep, BenchError> {
    let row = plan.measure(mode, n, baseline)?;
    let verdicts = slo::judge(&plan.args.slo, &row, cpus);
    let step = MaxVmsStep {
        vms: n,
        met: verdicts.iter().all(|v| v.met),
        verdicts,
        row,
    };
    println!(
        "{}  {}",
        report::density_line(&step.row),
        verdict_text(&step)
    );
    Ok(step)
}

/// After the last mode: the result table, the modes left out, the plot.
fn finish(report: &MaxVmsReport, plot: Option<&PathBuf>) -> Result<(), BenchError> {
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
    let mut s = format!(
        "lateness_p99 <= {} ms, host_busy <= {}%",
        slo.lateness_p99_ns as f64 / 1e6,
        slo.host_busy_percent
    );
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
            Some(f) => format!("{} {f:.2} {} > {}", v.bound, v.unit, v.limit),
            None => format!("{} not measured", v.bound),
        })
        .collect();
    format!("FAILED: {}", why.join(", "))
}

/// Sets every mode's ratio to kernel's count.
fn set_ratios(modes: &mut [MaxVmsMode]) {
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
            guest_bytes: 64 * MIB,
            vmm_guess: 32 * MIB,
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
            vmm_bytes_per_vm: None,
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
        // 1000 MiB available: 90% holds 9 VMs of 64 + 32 MiB, then 7 of 64 + 64 MiB once a
        // VMM is measured at 64 MiB.
        let mut l = limits(64);
        l.mem_available = Some(1000 * MIB);
        let f = search(&l, fake(|_| true));
        assert_eq!(f.tried, vec![1, 2, 4, 8, 9]);
        assert_eq!(f.max_vms, 9);
        assert!(matches!(f.stop, Stop::Memory { fits: 9, .. }), "{f:?}");
        let measured = |n: u32| Outcome {
            met: true,
            failed: vec![],
            vmm_bytes_per_vm: Some((64 * MIB + u64::from(n)) as f64),
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
