//! What a run of `lull bench idle-manager` costs the host, and the guest's throughput per unit
//! of that cost: performance per watt, the figure idle injection is judged by (issue 28).
//!
//! ```text
//! baseline:  sampler, no VM, --duration                  -> PowerWindow (the host at rest)
//! each run:  sampler |--s--s--s--s--s--s--s--s--|         from the VMs' launch to their exit
//!            spin VMs  |===== iterations =====|           the guests count their loop
//!            -> package W (and above the baseline), iterations per joule = throughput / W,
//!               iterations per CPU-second of lull's threads (where no energy is readable),
//!               the meter's W and iterations per its joule, host idle exits/s, deepest
//!               idle state's residency
//! ```
//!
//! Throughput per watt is the guests' iterations per second of their run divided by the
//! run's mean package power (the whole package: what the host pays, idle cores included; the
//! share above the baseline is reported beside it). A figure that cannot be had is a
//! [`Reading`] with its reason, never a 0.

use serde::{Deserialize, Serialize};

use super::density_power::{missing_reasons, package};
use super::power::{PowerWindow, Reading};

/// Why a figure of a run is missing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunPowerError {
    /// lull's report listed no thread CPU time.
    #[error("lull reported no CPU time of its threads")]
    NoCpuTime,
    /// The guests counted no iterations, or ran for no time.
    #[error("the guests reported no iterations")]
    NoIterations,
    /// The baseline lacks the figure.
    #[error("no baseline: {0}")]
    Baseline(String),
    /// The power did not exceed zero.
    #[error("package power of {0} W: no throughput per watt")]
    NoPower(f64),
}

/// The power of one run (one or several spin VMs started together) and its throughput per
/// unit of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunPower {
    /// Everything measured from the launch of the run's VMs to their exit.
    pub window: Reading<PowerWindow>,
    /// RAPL package power over the run, W.
    pub package_watts: Reading<f64>,
    /// RAPL package power above the no-VM baseline, W.
    pub watts_above_baseline: Reading<f64>,
    /// Throughput per watt: guest iterations per second over package watts (iterations per
    /// joule).
    pub iterations_per_joule: Reading<f64>,
    /// The external meter's mean power over the run, W.
    pub meter_watts: Reading<f64>,
    /// Guest iterations per second over the meter's watts.
    pub meter_iterations_per_joule: Reading<f64>,
    /// CPU time of every lull thread of the run, seconds.
    pub cpu_seconds: Reading<f64>,
    /// Guest iterations per CPU-second of lull's threads (the figure where energy is
    /// unreadable).
    pub iterations_per_cpu_second: Reading<f64>,
    /// Host CPU idle exits per second over the run, every host CPU.
    pub idle_exits_per_s: Reading<f64>,
    /// Share of the host CPUs' time spent in their deepest idle state.
    pub deepest_residency: Reading<f64>,
}

/// What the guests of a run did: iterations over how long, and lull's CPU time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunWork {
    /// Loop iterations, every VM of the run.
    pub iterations: u64,
    /// How long each guest counted, seconds.
    pub seconds: f64,
    /// CPU time of every lull thread of the run, ns (`None` if lull reported none).
    pub cpu_ns: Option<u64>,
}

/// `x / d`, or `err` where `d` is not above zero.
fn per(x: f64, d: f64, err: impl FnOnce(f64) -> RunPowerError) -> Result<f64, String> {
    if d > 0.0 {
        Ok(x / d)
    } else {
        Err(err(d).to_string())
    }
}

/// The power figures of a run that did `work` over `window`, against `baseline`.
pub fn run_power(
    work: RunWork,
    window: Reading<PowerWindow>,
    baseline: &Reading<PowerWindow>,
) -> RunPower {
    let w: Result<&PowerWindow, String> = window
        .value
        .as_ref()
        .ok_or_else(|| window.reason.clone().unwrap_or_default());
    let watts = w.clone().and_then(|w| package(w).map(|(watts, _)| watts));
    let base_watts = match &baseline.value {
        Some(b) => package(b).map(|(watts, _)| watts),
        None => Err(baseline.reason.clone().unwrap_or_default()),
    };
    let meter = w.clone().and_then(|w| match &w.meter.value {
        Some(m) => Ok(m.watts),
        None => Err(w.meter.reason.clone().unwrap_or_default()),
    });
    let rate = per(work.iterations as f64, work.seconds, |_| {
        RunPowerError::NoIterations
    })
    .and_then(|r| {
        if work.iterations > 0 {
            Ok(r)
        } else {
            Err(RunPowerError::NoIterations.to_string())
        }
    });
    let cpu_seconds = work
        .cpu_ns
        .filter(|&ns| ns > 0)
        .map(|ns| ns as f64 / 1e9)
        .ok_or_else(|| RunPowerError::NoCpuTime.to_string());
    let per_watt = |watts: Result<f64, String>| {
        rate.clone()
            .and_then(|r| watts.and_then(|w| per(r, w, RunPowerError::NoPower)))
    };
    RunPower {
        package_watts: Reading::from(watts.clone()),
        watts_above_baseline: Reading::from(watts.clone().and_then(|r| {
            base_watts
                .map(|b| r - b)
                .map_err(|e| RunPowerError::Baseline(e).to_string())
        })),
        iterations_per_joule: Reading::from(per_watt(watts)),
        meter_watts: Reading::from(meter.clone()),
        meter_iterations_per_joule: Reading::from(per_watt(meter)),
        iterations_per_cpu_second: Reading::from(
            cpu_seconds
                .clone()
                .and_then(|s| per(work.iterations as f64, s, |_| RunPowerError::NoCpuTime)),
        ),
        cpu_seconds: Reading::from(cpu_seconds),
        idle_exits_per_s: match &w {
            Ok(w) => w.idle_exits_per_s.clone(),
            Err(e) => Reading::missing(e),
        },
        deepest_residency: Reading::from(w.and_then(|w| match &w.idle.value {
            Some(i) => Ok(i.deepest_residency),
            None => Err(w.idle.reason.clone().unwrap_or_default()),
        })),
        window,
    }
}

/// `r`'s value with `prec` decimals in `width` columns, or `-`.
fn cell(r: Option<&Reading<f64>>, width: usize, prec: usize) -> String {
    match r.and_then(|r| r.value) {
        Some(v) => format!("{v:>width$.prec$}"),
        None => format!("{:>width$}", "-"),
    }
}

/// The power columns' header (package W, W above the baseline, iterations per joule,
/// iterations per CPU-second, host idle exits per second, deepest state's residency).
pub fn header() -> String {
    format!(
        "{:>8}{:>8}{:>10}{:>11}{:>9}{:>7}",
        "W", "W>base", "it/J", "it/CPU-s", "idlx/s", "deep%"
    )
}

/// The power columns of a run (`-` where a figure is missing; [`notes`] says why).
pub fn columns(p: Option<&RunPower>) -> String {
    let deep = p
        .and_then(|p| p.deepest_residency.value)
        .map_or_else(|| format!("{:>7}", "-"), |d| format!("{:>7.1}", d * 100.0));
    format!(
        "{}{}{}{}{}{deep}",
        cell(p.map(|p| &p.package_watts), 8, 1),
        cell(p.map(|p| &p.watts_above_baseline), 8, 1),
        cell(p.map(|p| &p.iterations_per_joule), 10, 0),
        cell(p.map(|p| &p.iterations_per_cpu_second), 11, 0),
        cell(p.map(|p| &p.idle_exits_per_s), 9, 0),
    )
}

/// Why a power column of `runs` is empty, each reason once.
pub fn notes<'a>(runs: impl IntoIterator<Item = &'a RunPower>) -> Vec<String> {
    missing_reasons(runs.into_iter().flat_map(|p| {
        [
            ("W", &p.package_watts),
            ("W>base", &p.watts_above_baseline),
            ("it/CPU-s", &p.iterations_per_cpu_second),
            ("idlx/s", &p.idle_exits_per_s),
        ]
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::power::PowerError;

    /// A window of 4 s with package power `pkg` W (beside a DRAM zone that does not count),
    /// 300 idle exits per second, no cpuidle detail, no meter.
    fn window(pkg: Option<f64>) -> Reading<PowerWindow> {
        crate::density_power::tests::window(4.0, pkg, 300.0)
    }

    /// 30,000 iterations in 3 s with 1.5 CPU-seconds of lull.
    const WORK: RunWork = RunWork {
        iterations: 30_000,
        seconds: 3.0,
        cpu_ns: Some(1_500_000_000),
    };

    #[test]
    fn throughput_per_watt_is_the_iteration_rate_over_package_power() {
        let p = run_power(WORK, window(Some(25.0)), &window(Some(10.0)));
        assert_eq!(p.package_watts.value, Some(25.0));
        assert_eq!(p.watts_above_baseline.value, Some(15.0));
        // 10,000 iterations per second over 25 W.
        assert_eq!(p.iterations_per_joule.value, Some(400.0));
        assert_eq!(p.cpu_seconds.value, Some(1.5));
        assert_eq!(p.iterations_per_cpu_second.value, Some(20_000.0));
        assert_eq!(p.idle_exits_per_s.value, Some(300.0));
        assert_eq!(p.deepest_residency.reason.as_deref(), Some("no cpuidle"));
        assert_eq!(
            p.meter_iterations_per_joule.reason,
            Some(PowerError::NoMeter.to_string())
        );
    }

    #[test]
    fn without_energy_the_cpu_second_figure_remains_and_every_other_says_why() {
        let p = run_power(WORK, window(None), &window(None));
        for r in [
            &p.package_watts,
            &p.watts_above_baseline,
            &p.iterations_per_joule,
        ] {
            assert_eq!(r.value, None);
            assert!(r.reason.as_deref().unwrap().contains("no RAPL"), "{r:?}");
        }
        assert_eq!(p.iterations_per_cpu_second.value, Some(20_000.0));
        // A baseline that was not measured is named as the baseline's.
        let p = run_power(WORK, window(Some(25.0)), &Reading::missing("off"));
        assert_eq!(
            p.watts_above_baseline.reason.as_deref(),
            Some("no baseline: off")
        );
        assert_eq!(p.iterations_per_joule.value, Some(400.0));
        // No iterations, no CPU time: reasons, not zeros.
        let idle = RunWork {
            iterations: 0,
            seconds: 3.0,
            cpu_ns: None,
        };
        let p = run_power(idle, window(Some(25.0)), &window(Some(10.0)));
        assert_eq!(
            p.iterations_per_joule.reason,
            Some(RunPowerError::NoIterations.to_string())
        );
        assert_eq!(
            p.iterations_per_cpu_second.reason,
            Some(RunPowerError::NoCpuTime.to_string())
        );
        // No window at all: every figure carries its reason.
        let p = run_power(WORK, Reading::missing("sampler stopped"), &window(None));
        assert_eq!(
            p.idle_exits_per_s.reason.as_deref(),
            Some("sampler stopped")
        );
        assert_eq!(p.package_watts.reason.as_deref(), Some("sampler stopped"));
    }

    #[test]
    fn the_table_shows_dashes_and_notes_say_why_once() {
        let p = run_power(WORK, window(None), &window(None));
        let cols = columns(Some(&p));
        assert_eq!(cols.len(), header().len());
        assert_eq!(
            cols,
            format!(
                "{:>8}{:>8}{:>10}{:>11}{:>9}{:>7}",
                "-", "-", "-", "20000", "300", "-"
            )
        );
        let lines = notes([&p, &p]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("W missing: no RAPL"), "{lines:?}");
        assert!(lines[1].starts_with("W>base missing: no RAPL"), "{lines:?}");
        assert_eq!(columns(None).len(), header().len());
    }
}
