//! What the density experiment costs the host in power (issue 28): a sampler reads the
//! host's power counters (`power/`) all along a fleet run; the row's steady-state window is
//! cut from those samples and set against a baseline window measured with no VM.
//!
//! ```text
//! baseline:  sampler, no VM, --duration            -> PowerWindow (the host at rest)
//! each row:  sampler |--s--s--s--s--s--s--s--|      samples every period (same as baseline)
//!            fleet        |==== window ====|        the row's window (fleet::Window::span)
//!            power            |s--------s|          first and last sample inside it
//!            -> per VM and per vCPU above the baseline: W, J, idle exits/s; per state
//!               residency; host idle exits per guest timer event; LOC, RES, VMM switches/s
//! ```
//!
//! A figure that cannot be had is a [`Reading`] without a value and with the reason (no RAPL
//! on a virtual machine, `energy_uj` readable by root only, no meter given), never a 0.

use super::density_power_row::{opt, DensityPower};
use super::power::meter::{Meter, MeterConfig, MeterError, MeterRecord};
use super::power::{PowerError, PowerSample, PowerWindow, Reading};
use super::report::{DensityReport, DensityRow};
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Why a power figure of a row is missing (the reasons of the readers pass through as text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DensityPowerError {
    /// The sampler's thread could not start.
    #[error("the power sampler could not start: {0}")]
    Thread(String),
    /// Fewer than two samples fell inside the window.
    #[error("fewer than 2 power samples (one every {0:?}) fell inside the window: run longer (--duration)")]
    TooFewSamples(Duration),
    /// The row has no steady-state window.
    #[error("the row has no steady-state window: nothing to measure")]
    NoWindow,
    /// The baseline lacks the figure.
    #[error("no baseline: {0}")]
    Baseline(String),
    /// No RAPL zone covers the package.
    #[error("no RAPL package or psys zone among {0}")]
    NoPackageZone(String),
    /// The guests counted no timer event.
    #[error("the guests counted no timer events")]
    NoTimerEvents,
}

/// The sampling period for runs of `duration`: one twentieth of it, 250 ms to 1 s (each
/// sample reads a few files per host CPU; the baseline samples alike, so its own cost is
/// subtracted).
pub fn period(duration: Duration) -> Duration {
    (duration / 20).clamp(Duration::from_millis(250), Duration::from_secs(1))
}

/// The power samples of a run (the host's, no process) and the meter's, while it goes on.
#[derive(Debug)]
pub struct Sampler {
    period: Duration,
    stop: mpsc::Sender<()>,
    thread: Result<JoinHandle<Vec<PowerSample>>, String>,
    meter: Option<Result<Meter, MeterError>>,
}

/// What a [`Sampler`] took.
#[derive(Debug)]
pub struct Samples {
    period: Duration,
    samples: Result<Vec<PowerSample>, String>,
    meter: Option<Result<MeterRecord, MeterError>>,
}

impl Sampler {
    /// Starts sampling the host now, one sample every `period`, and the meter `meter` if
    /// given.
    pub fn start(period: Duration, meter: Option<&str>) -> Sampler {
        let meter = meter.map(|cmd| Meter::start(MeterConfig::new(cmd)));
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("power-sampler".into())
            .spawn(move || {
                let mut samples = Vec::new();
                let start = Instant::now();
                let mut next = Duration::ZERO;
                loop {
                    samples.push(PowerSample::take(Path::new("/"), &[]));
                    next += period;
                    let wait = next.saturating_sub(start.elapsed());
                    match stopped.recv_timeout(wait) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return samples,
                    }
                }
            })
            .map_err(|e| e.to_string());
        Sampler {
            period,
            stop,
            thread,
            meter,
        }
    }

    /// Stops sampling (one last sample is taken now).
    pub fn stop(self) -> Samples {
        let _ = self.stop.send(());
        let samples = self.thread.and_then(|t| {
            t.join()
                .map_err(|_| "the power sampler's thread panicked".to_string())
        });
        Samples {
            period: self.period,
            samples: samples.map(|mut s| {
                s.push(PowerSample::take(Path::new("/"), &[]));
                s
            }),
            meter: self.meter.map(|m| m.and_then(Meter::stop)),
        }
    }
}

impl Samples {
    /// The window between the first and the last sample inside `span`.
    pub fn window(&self, span: Option<(Instant, Instant)>) -> Reading<PowerWindow> {
        let samples = match &self.samples {
            Ok(s) => s,
            Err(e) => return Reading::missing(DensityPowerError::Thread(e.clone())),
        };
        let Some((from, to)) = span else {
            return Reading::missing(DensityPowerError::NoWindow);
        };
        let inside: Vec<&PowerSample> = samples
            .iter()
            .filter(|s| s.at >= from && s.at <= to)
            .collect();
        match (inside.first(), inside.last()) {
            (Some(a), Some(b)) if b.at > a.at => {
                Reading::ok(a.window_to(b, self.meter(a.at, b.at)))
            }
            _ => Reading::missing(DensityPowerError::TooFewSamples(self.period)),
        }
    }

    /// The window from the first sample to the last.
    pub fn whole(&self) -> Reading<PowerWindow> {
        match &self.samples {
            Ok(s) => self.window(s.first().zip(s.last()).map(|(a, b)| (a.at, b.at))),
            Err(e) => Reading::missing(DensityPowerError::Thread(e.clone())),
        }
    }

    fn meter(&self, from: Instant, to: Instant) -> Reading<super::power::meter::MeterWindow> {
        match &self.meter {
            None => Reading::missing(PowerError::NoMeter),
            Some(Err(e)) => Reading::missing(e),
            Some(Ok(record)) => Reading::from(record.between(from, to)),
        }
    }
}

/// The baseline: the host with no VM for `duration`, sampled as the rows are.
pub fn baseline(duration: Duration, meter: Option<&str>) -> Reading<PowerWindow> {
    let sampler = Sampler::start(period(duration), meter);
    // The baseline is a measured window of this length, not a wait for something.
    std::thread::sleep(duration);
    sampler.stop().whole()
}

/// The package power and energy of a window: the sum of its `package-*` zones (else its
/// `psys` zone), `(W, J)`.
pub(crate) fn package(w: &PowerWindow) -> Result<(f64, f64), String> {
    let zones = match (&w.energy.value, &w.energy.reason) {
        (Some(z), _) => z,
        (None, why) => return Err(why.clone().unwrap_or_default()),
    };
    let pick = |prefix: &str| -> Option<Result<(f64, f64), String>> {
        let chosen: Vec<_> = zones
            .iter()
            .filter(|z| z.name.starts_with(prefix))
            .collect();
        if chosen.is_empty() {
            return None;
        }
        let mut sum = (0.0, 0.0);
        for z in chosen {
            match (z.watts.value, z.joules.value) {
                (Some(w), Some(j)) => sum = (sum.0 + w, sum.1 + j),
                _ => {
                    let why = z.watts.reason.clone().or_else(|| z.joules.reason.clone());
                    return Some(Err(format!("{}: {}", z.name, why.unwrap_or_default())));
                }
            }
        }
        Some(Ok(sum))
    };
    pick("package").or_else(|| pick("psys")).unwrap_or_else(|| {
        let names: Vec<&str> = zones.iter().map(|z| z.name.as_str()).collect();
        Err(DensityPowerError::NoPackageZone(names.join(", ")).to_string())
    })
}

/// What the host wake-up figures count where the host has cpuidle states.
const CPUIDLE_EXITS: &str = "cpuidle idle exits";
/// ... and where it has none: the interrupts that wake a host CPU, above the baseline.
const IRQ_PROXY: &str = "LOC+RES+CAL interrupts above the baseline";

/// The host's local timer, rescheduling and function-call interrupts per second in `w`.
fn wakeup_irqs_per_s(w: &PowerWindow) -> Result<f64, String> {
    Ok(value(&w.local_timer_irqs_per_s)?
        + value(&w.resched_irqs_per_s)?
        + value(&w.call_irqs_per_s)?)
}

/// `f(row value, baseline value)`, or why either is missing.
fn above<T>(
    row: Result<T, String>,
    base: Result<T, String>,
    f: impl FnOnce(T, T) -> f64,
) -> Reading<f64> {
    match (row, base) {
        (Ok(r), Ok(b)) => Reading::ok(f(r, b)),
        (Err(e), _) => Reading::missing(e),
        (_, Err(e)) => Reading::missing(DensityPowerError::Baseline(e)),
    }
}

/// A reading as a result (its reason as the error).
fn value<T: Clone>(r: &Reading<T>) -> Result<T, String> {
    r.value
        .clone()
        .ok_or_else(|| r.reason.clone().unwrap_or_default())
}

/// The power figures of `row`, whose window is `window`, against `baseline`.
pub fn row_power(
    row: &DensityRow,
    window: Reading<PowerWindow>,
    baseline: &Reading<PowerWindow>,
) -> DensityPower {
    let (vms, vcpus) = (f64::from(row.vms.max(1)), f64::from(row.vcpus.max(1)));
    let w = value(&window);
    let b = value(baseline);
    let pkg = w.clone().and_then(|w| package(&w));
    let base_pkg = b.clone().and_then(|b| package(&b));
    let seconds = w.as_ref().map_or(0.0, |w| w.seconds);
    let joules_above = |(_, j): (f64, f64), (bw, _): (f64, f64)| j - bw * seconds;
    let exits = w.clone().and_then(|w| value(&w.idle_exits_per_s));
    let base_exits = b.clone().and_then(|b| value(&b.idle_exits_per_s));
    let meter = w.clone().and_then(|w| value(&w.meter).map(|m| m.watts));
    let base_meter = b.clone().and_then(|b| value(&b.meter).map(|m| m.watts));
    let events_per_s = row.guest_timer_events_per_vcpu_s * f64::from(row.vcpus);
    let on_window = |f: fn(&PowerWindow) -> &Reading<f64>| match &w {
        Ok(w) => f(w).clone(),
        Err(e) => Reading::missing(e),
    };
    // Host wake-ups: cpuidle's idle exits where the host has idle states, else the interrupts
    // that wake a host CPU (a proxy), each above the no-VM baseline.
    let proxy = w.clone().and_then(|w| wakeup_irqs_per_s(&w));
    let base_proxy = b.clone().and_then(|b| wakeup_irqs_per_s(&b));
    let (wakeups, base_wakeups, source) = match (&exits, &base_exits) {
        (Ok(_), Ok(_)) => (exits.clone(), base_exits.clone(), CPUIDLE_EXITS),
        _ => (proxy, base_proxy, IRQ_PROXY),
    };
    let wakeups_above = above(wakeups.clone(), base_wakeups, |r, b| r - b);
    DensityPower {
        watts_per_vm: above(pkg.clone(), base_pkg.clone(), |r, b| (r.0 - b.0) / vms),
        watts_per_vcpu: above(pkg.clone(), base_pkg.clone(), |r, b| (r.0 - b.0) / vcpus),
        joules_per_vm: above(pkg.clone(), base_pkg.clone(), |r, b| {
            joules_above(r, b) / vms
        }),
        joules_per_vcpu: above(pkg, base_pkg, |r, b| joules_above(r, b) / vcpus),
        meter_watts_per_vm: above(meter, base_meter, |r, b| (r - b) / vms),
        idle_exits_per_vcpu_s: above(exits.clone(), base_exits, |r, b| (r - b) / vcpus),
        residency: match &w {
            Ok(w) => Reading::from(value(&w.idle).map(|i| i.states)),
            Err(e) => Reading::missing(e),
        },
        host_wakeups_per_vcpu_s: match &wakeups_above.value {
            Some(x) => Reading::ok(x / vcpus),
            None => wakeups_above.clone(),
        },
        host_wakeups_source: wakeups_above.value.map(|_| source.to_string()),
        host_wakeups_per_timer_event: match (&exits, &wakeups_above.value) {
            _ if events_per_s <= 0.0 => Reading::missing(DensityPowerError::NoTimerEvents),
            (Ok(x), _) => Reading::ok(x / events_per_s),
            (Err(_), Some(x)) => Reading::ok(x / events_per_s),
            (Err(e), None) => Reading::missing(format!(
                "{e}; and {}",
                wakeups_above.reason.clone().unwrap_or_default()
            )),
        },
        local_timer_irqs_per_s: on_window(|w| &w.local_timer_irqs_per_s),
        resched_irqs_per_s: on_window(|w| &w.resched_irqs_per_s),
        vmm_context_switches_per_s: if row.window_s > 0.0 {
            Reading::ok(row.host_ctxt_switches_per_vcpu_s * f64::from(row.vcpus))
        } else {
            Reading::missing(DensityPowerError::NoWindow)
        },
        window,
    }
}

/// The lines under the table: the baseline, and why a power column is empty (each reason
/// once).
pub fn notes(report: &DensityReport) -> Vec<String> {
    let Some(base) = &report.power_baseline else {
        return Vec::new();
    };
    let mut lines = vec![baseline_line(base)];
    let powers = report.results.iter().filter_map(|r| r.power.as_ref());
    let proxied = report
        .results
        .iter()
        .filter_map(|r| r.power.as_ref())
        .any(|p| p.host_wakeups_source.as_deref() == Some(IRQ_PROXY));
    if proxied {
        lines.push(format!(
            "hwk/v/s, hwk/tev: host wake-ups counted as {IRQ_PROXY} (a proxy: this host has no \
             cpuidle states to count idle exits)"
        ));
    }
    lines.extend(missing_reasons(powers.flat_map(|p| {
        [
            ("idlx/v/s", &p.idle_exits_per_vcpu_s),
            ("hwk/v/s", &p.host_wakeups_per_vcpu_s),
            ("W/VM", &p.watts_per_vm),
            ("hwk/tev", &p.host_wakeups_per_timer_event),
        ]
    })));
    lines
}

/// The line that states the no-VM baseline under a table (or why there is none).
pub(crate) fn baseline_line(base: &Reading<PowerWindow>) -> String {
    match &base.value {
        Some(b) => format!(
            "power baseline (no VM, {:.1} s): host idle exits {}/s, LOC {}/s, RES {}/s, \
             CAL {}/s, package {} W",
            b.seconds,
            opt(Some(&b.idle_exits_per_s), 0),
            opt(Some(&b.local_timer_irqs_per_s), 0),
            opt(Some(&b.resched_irqs_per_s), 0),
            opt(Some(&b.call_irqs_per_s), 0),
            package(b).map_or_else(|_| "-".into(), |(w, _)| format!("{w:.1}")),
        ),
        None => format!(
            "power baseline: none ({})",
            base.reason.as_deref().unwrap_or("")
        ),
    }
}

/// `COLUMN missing: REASON` for every reading of a table column that has no value, each line
/// once, in the order met.
pub(crate) fn missing_reasons<'a>(
    readings: impl IntoIterator<Item = (&'a str, &'a Reading<f64>)>,
) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for (what, r) in readings {
        if let Some(why) = &r.reason {
            let line = format!("{what} missing: {why}");
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
    }
    lines
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::density_power_row::columns;
    use crate::power::rapl::ZoneEnergy;
    use crate::report::tests::{density_report, density_row};

    fn zone(name: &str, watts: f64, seconds: f64) -> ZoneEnergy {
        ZoneEnergy {
            zone: format!("intel-rapl:{name}"),
            name: name.into(),
            joules: Reading::ok(watts * seconds),
            watts: Reading::ok(watts),
        }
    }

    /// A window of `seconds` with package power `pkg` W (and a DRAM zone, not counted),
    /// `exits` idle exits per second, no cpuidle detail and no meter.
    pub(crate) fn window(seconds: f64, pkg: Option<f64>, exits: f64) -> Reading<PowerWindow> {
        Reading::ok(PowerWindow {
            seconds,
            energy: match pkg {
                Some(w) => Reading::ok(vec![
                    zone("package-0", w, seconds),
                    zone("dram", 3.0, seconds),
                ]),
                None => {
                    Reading::missing("no RAPL powercap zones (virtual machine or unsupported CPU)")
                }
            },
            idle: Reading::missing("no cpuidle"),
            idle_exits_per_s: Reading::ok(exits),
            local_timer_irqs_per_s: Reading::ok(250.0),
            resched_irqs_per_s: Reading::ok(5.0),
            call_irqs_per_s: Reading::missing("-"),
            processes: Vec::new(),
            context_switches_per_s: Reading::missing(PowerError::NoProcesses),
            meter: Reading::missing(PowerError::NoMeter),
        })
    }

    /// 4 VMs x 2 vCPUs, 100 guest timer events per vCPU per second.
    fn row() -> DensityRow {
        let mut r = density_row("pull", 4, 1.0);
        r.guest_timer_events_per_vcpu_s = 100.0;
        r
    }

    /// The pull / kernel line compares the host wake-ups of the power figures (here the
    /// host's idle exits above the baseline), named as what they count, apart from the
    /// wake-ups of lull's own threads.
    #[test]
    fn the_ratio_line_compares_host_wakeups_above_the_baseline() {
        let base = window(3.0, None, 200.0);
        let mut kernel = density_row("kernel", 4, 1.0);
        kernel.power = Some(row_power(&kernel, window(2.0, None, 1000.0), &base));
        let mut pull = row();
        pull.power = Some(row_power(&pull, window(2.0, None, 600.0), &base));
        let lines = crate::report::pull_kernel_ratios(&density_report(vec![kernel, pull]));
        // (600 - 200) / (1000 - 200) idle exits per second above the baseline.
        assert!(
            lines[0].ends_with(
                "VMM-thread wake-ups per timer interrupt 1.00, host wake-ups per vCPU-s above the baseline 0.50 (cpuidle idle exits)"
            ),
            "{lines:?}"
        );
    }

    #[test]
    fn figures_are_per_vm_and_per_vcpu_above_the_baseline() {
        let p = row_power(
            &row(),
            window(2.0, Some(20.0), 1000.0),
            &window(3.0, Some(10.0), 200.0),
        );
        assert_eq!(p.watts_per_vm.value, Some(2.5));
        assert_eq!(p.watts_per_vcpu.value, Some(1.25));
        // 40 J in the window, 10 W x 2 s of it the baseline's.
        assert_eq!(p.joules_per_vm.value, Some(5.0));
        assert_eq!(p.joules_per_vcpu.value, Some(2.5));
        assert_eq!(p.idle_exits_per_vcpu_s.value, Some(100.0));
        // 1000 exits/s over 8 vCPUs x 100 events/s.
        assert_eq!(p.host_wakeups_per_timer_event.value, Some(1.25));
        assert_eq!(p.local_timer_irqs_per_s.value, Some(250.0));
        assert_eq!(p.residency.reason.as_deref(), Some("no cpuidle"));
        // density_row's 10 switches per vCPU per second, 8 vCPUs.
        assert_eq!(p.vmm_context_switches_per_s.value, Some(80.0));
        assert_eq!(
            p.meter_watts_per_vm.reason,
            Some(PowerError::NoMeter.to_string())
        );
    }

    #[test]
    fn missing_energy_is_null_with_its_reason_never_zero() {
        let p = row_power(&row(), window(2.0, None, 1000.0), &window(3.0, None, 200.0));
        for r in [
            &p.watts_per_vm,
            &p.watts_per_vcpu,
            &p.joules_per_vm,
            &p.joules_per_vcpu,
        ] {
            assert_eq!(r.value, None);
            assert!(
                r.reason
                    .as_deref()
                    .unwrap()
                    .starts_with("no RAPL powercap zones"),
                "{r:?}"
            );
        }
        assert_eq!(p.idle_exits_per_vcpu_s.value, Some(100.0));
        // Without a baseline nothing is "above" it; without events there is no ratio.
        let none = Reading::missing("stopped");
        let mut quiet = row();
        quiet.guest_timer_events_per_vcpu_s = 0.0;
        let p = row_power(&quiet, window(2.0, Some(20.0), 1000.0), &none);
        assert_eq!(
            p.watts_per_vm.reason.as_deref(),
            Some("no baseline: stopped")
        );
        assert_eq!(
            p.host_wakeups_per_timer_event.reason,
            Some(DensityPowerError::NoTimerEvents.to_string())
        );
        // No window: every figure says so.
        let p = row_power(&row(), Reading::missing(DensityPowerError::NoWindow), &none);
        assert_eq!(
            p.idle_exits_per_vcpu_s.reason,
            Some(DensityPowerError::NoWindow.to_string())
        );
    }

    /// [`window`] of a host without cpuidle states: `irqs` LOC, RES and CAL per second.
    fn window_without_cpuidle(irqs: [f64; 3]) -> Reading<PowerWindow> {
        let mut w = window(2.0, None, 0.0);
        if let Some(w) = w.value.as_mut() {
            w.idle_exits_per_s = Reading::missing("no cpuidle states (driver none)");
            w.local_timer_irqs_per_s = Reading::ok(irqs[0]);
            w.resched_irqs_per_s = Reading::ok(irqs[1]);
            w.call_irqs_per_s = Reading::ok(irqs[2]);
        }
        w
    }

    #[test]
    fn without_cpuidle_host_wakeups_are_the_interrupts_above_the_baseline() {
        let base = window_without_cpuidle([200.0, 10.0, 0.0]);
        let p = row_power(&row(), window_without_cpuidle([1000.0, 50.0, 10.0]), &base);
        assert_eq!(p.idle_exits_per_vcpu_s.value, None);
        // (1060 - 210) interrupts/s above the baseline, over 8 vCPUs and 800 events/s.
        assert_eq!(p.host_wakeups_per_vcpu_s.value, Some(106.25));
        assert_eq!(p.host_wakeups_per_timer_event.value, Some(1.0625));
        assert_eq!(p.host_wakeups_source.as_deref(), Some(IRQ_PROXY));
        let mut r = row();
        r.power = Some(p);
        let mut report = density_report(vec![r]);
        report.power_baseline = Some(base.clone());
        let lines = notes(&report);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("LOC+RES+CAL") && l.contains("proxy")),
            "{lines:?}"
        );
        // With cpuidle states, the idle exits are the figure, named as such.
        let p = row_power(&row(), window(2.0, None, 1000.0), &window(3.0, None, 200.0));
        assert_eq!(p.host_wakeups_per_vcpu_s.value, Some(100.0));
        assert_eq!(p.host_wakeups_source.as_deref(), Some(CPUIDLE_EXITS));
        // Neither: null, with both reasons.
        let mut blind = window_without_cpuidle([0.0; 3]);
        if let Some(w) = blind.value.as_mut() {
            w.call_irqs_per_s = Reading::missing("no CAL row");
        }
        let p = row_power(&row(), blind, &base);
        assert_eq!(p.host_wakeups_per_vcpu_s.value, None);
        assert_eq!(p.host_wakeups_source, None);
        let why = p.host_wakeups_per_timer_event.reason.unwrap_or_default();
        assert!(why.contains("cpuidle") && why.contains("CAL"), "{why}");
    }

    #[test]
    fn the_table_shows_dashes_and_says_why_once() {
        let base = window(3.0, None, 200.0);
        let mut rows = vec![row(), row()];
        for r in &mut rows {
            r.power = Some(row_power(r, window(2.0, None, 1000.0), &base));
        }
        let mut report = density_report(rows);
        report.power_baseline = Some(base);
        assert_eq!(
            columns(report.results[0].power.as_ref()),
            format!("{:>10}{:>9}{:>8}{:>8}", "100.0", "100.0", "-", "1.25")
        );
        let lines = notes(&report);
        assert!(
            lines[0].starts_with("power baseline (no VM, 3.0 s): host idle exits 200/s"),
            "{lines:?}"
        );
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[1].starts_with("W/VM missing: no RAPL powercap zones"),
            "{lines:?}"
        );
        assert!(notes(&density_report(Vec::new())).is_empty());
    }

    #[test]
    fn a_sampler_on_this_host_cuts_windows_from_its_samples() {
        let before = Instant::now();
        let samples = Sampler::start(Duration::from_millis(250), None).stop();
        let whole = samples.whole();
        let w = whole.value.as_ref().expect("a first and a last sample");
        assert!(w.seconds > 0.0);
        // Idle exits where the host has cpuidle states, the reason where it has none.
        assert_eq!(
            w.idle_exits_per_s.value.is_some(),
            crate::power::test_tree::host_has_cpuidle_states(),
            "{w:?}"
        );
        assert_ne!(
            w.idle_exits_per_s.value.is_some(),
            w.idle_exits_per_s.reason.is_some()
        );
        assert_eq!(w.meter.reason, Some(PowerError::NoMeter.to_string()));
        assert_eq!(
            samples.window(None).reason,
            Some(DensityPowerError::NoWindow.to_string())
        );
        assert_eq!(
            samples.window(Some((before, before))).reason,
            Some(DensityPowerError::TooFewSamples(Duration::from_millis(250)).to_string())
        );
    }

    #[test]
    fn the_sampling_period_follows_the_run() {
        assert_eq!(period(Duration::from_secs(2)), Duration::from_millis(250));
        assert_eq!(period(Duration::from_secs(10)), Duration::from_millis(500));
        assert_eq!(period(Duration::from_secs(60)), Duration::from_secs(1));
    }
}
