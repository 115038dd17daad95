//! The rows of `lull bench latency`: what one run measured, the medians over the repetitions
//! of one (pattern, PV, mode), their ratios to `--irqchip kernel` in the same group, the table
//! and the JSON document.

use lull_schema::RunReport;
use serde::{Deserialize, Serialize};

use super::guest_output::parse_idle_sim;
use super::host::HostInfo;
use super::report::{median, opt};

/// Schema name of the latency JSON document.
pub const LATENCY_SCHEMA: &str = "lull-bench-latency/1";

/// What one idle-sim run of a re-arm pattern measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunMeasure {
    /// Timer interrupts the guest took.
    pub events: u64,
    /// Interrupts that came before their deadline (beyond the guest's `early_ns`).
    pub early: u64,
    /// Lateness, median (upper bound of its bucket), ns.
    pub p50_ns: u64,
    /// Lateness, 99th percentile (upper bound of its bucket), ns.
    pub p99_ns: u64,
    /// Largest lateness, exact, ns.
    pub max_ns: u64,
    /// CPU time of every lull thread over the whole run (boot and exit included), ns.
    pub cpu_ns: u64,
    /// The guest ended its interrupts through PV EOI (its header says `eoi pv`).
    pub pv_eoi: bool,
    /// The guest armed its deadlines through lull's PV deadline (`tsc-deadline (pv)`).
    pub pv_deadline: bool,
}

/// The measure of a run of `pattern` from the guest's console and lull's metrics; `None` if
/// the guest did not pass, took no timer interrupt, or did not say it ran `pattern` (an
/// idle-sim older than the pattern runs its mix instead).
pub fn measure(console: &str, m: &RunReport, pattern: &str) -> Option<RunMeasure> {
    let g = parse_idle_sim(console);
    if !g.passed || g.events == 0 {
        return None;
    }
    let header = console
        .lines()
        .find(|l| l.starts_with("idle-sim: ") && l.contains(" CPUs "))?;
    if !header.contains(&format!(", {pattern}, ")) {
        return None;
    }
    let s = g.lateness.summary();
    Some(RunMeasure {
        events: g.events,
        early: g.early,
        p50_ns: s.p50_ns,
        p99_ns: s.p99_ns,
        max_ns: s.max_ns,
        cpu_ns: m.threads.iter().map(|t| t.cpu_ns).sum(),
        pv_eoi: header.contains("eoi pv"),
        pv_deadline: header.contains("tsc-deadline (pv)"),
    })
}

/// One (pattern, PV, mode): medians over its repetitions and ratios to the kernel row of its
/// (pattern, PV) group (`null` where no repetition succeeded or there is no kernel row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyRow {
    /// `rearm-halt` or `rearm-busy`.
    pub pattern: String,
    /// What the guest was asked to use: `none`, `eoi` or `eoi-deadline`.
    pub pv: String,
    /// `kernel`, `pull`, `push` or `central`.
    pub mode: String,
    /// Repetitions that passed.
    pub reps_ok: u32,
    /// Every passing repetition used PV EOI (`eoi`, `eoi-deadline` asked, and offered).
    pub pv_eoi_used: bool,
    /// Every passing repetition used lull's PV deadline.
    pub pv_deadline_used: bool,
    /// Timer interrupts per run, median.
    pub events: Option<f64>,
    /// Early interrupts, summed over the repetitions (0 expected).
    pub early: u64,
    /// Lateness, median of the runs' medians, us.
    pub p50_us: Option<f64>,
    /// Lateness, median of the runs' 99th percentiles, us.
    pub p99_us: Option<f64>,
    /// Lateness, median of the runs' maxima, us.
    pub max_us: Option<f64>,
    /// Host CPU (every lull thread, boot and exit included) per timer interrupt, median, us.
    pub cpu_us_per_event: Option<f64>,
    /// `p50_us` over the kernel row's.
    pub p50_vs_kernel: Option<f64>,
    /// `p99_us` over the kernel row's.
    pub p99_vs_kernel: Option<f64>,
    /// `cpu_us_per_event` over the kernel row's.
    pub cpu_vs_kernel: Option<f64>,
    /// What went wrong, one line per failed repetition.
    pub failures: Vec<String>,
}

/// The row of one (pattern, PV, mode) from its passing runs; ratios are left to
/// [`with_kernel_ratios`].
pub fn row(
    pattern: &str,
    pv: &str,
    mode: &str,
    runs: &[RunMeasure],
    failures: Vec<String>,
) -> LatencyRow {
    let med = |f: fn(&RunMeasure) -> f64| median(runs.iter().map(f).collect());
    LatencyRow {
        pattern: pattern.into(),
        pv: pv.into(),
        mode: mode.into(),
        reps_ok: u32::try_from(runs.len()).unwrap_or(u32::MAX),
        pv_eoi_used: !runs.is_empty() && runs.iter().all(|r| r.pv_eoi),
        pv_deadline_used: !runs.is_empty() && runs.iter().all(|r| r.pv_deadline),
        events: med(|r| r.events as f64),
        early: runs.iter().map(|r| r.early).sum(),
        p50_us: med(|r| r.p50_ns as f64 / 1000.0),
        p99_us: med(|r| r.p99_ns as f64 / 1000.0),
        max_us: med(|r| r.max_ns as f64 / 1000.0),
        cpu_us_per_event: med(|r| r.cpu_ns as f64 / 1000.0 / r.events as f64),
        p50_vs_kernel: None,
        p99_vs_kernel: None,
        cpu_vs_kernel: None,
        failures,
    }
}

/// Fills every row's ratios to the `kernel` row of its (pattern, PV) group.
pub fn with_kernel_ratios(mut rows: Vec<LatencyRow>) -> Vec<LatencyRow> {
    let kernels: Vec<LatencyRow> = rows
        .iter()
        .filter(|r| r.mode == "kernel")
        .cloned()
        .collect();
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    for r in &mut rows {
        let Some(k) = kernels
            .iter()
            .find(|k| k.pattern == r.pattern && k.pv == r.pv)
        else {
            continue;
        };
        r.p50_vs_kernel = ratio(r.p50_us, k.p50_us);
        r.p99_vs_kernel = ratio(r.p99_us, k.p99_us);
        r.cpu_vs_kernel = ratio(r.cpu_us_per_event, k.cpu_us_per_event);
    }
    rows
}

/// The latency JSON document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyReport {
    /// Always [`LATENCY_SCHEMA`].
    pub schema: String,
    /// The host.
    pub host: HostInfo,
    /// How long each run's guest re-armed its timer, s.
    pub duration_s: f64,
    /// How far ahead each deadline was armed, TSC cycles.
    pub delta_tsc: u64,
    /// 1: the guest's handler recorded after its EOI; 0: before its WRMSR.
    pub tail: u32,
    /// Repetitions per row.
    pub reps: u32,
    /// One row per (pattern, PV, mode), in that order.
    pub results: Vec<LatencyRow>,
}

/// Header of the latency table.
pub fn header() -> String {
    format!(
        "{:<11}{:<20}{:<8}{:>5}{:>8}{:>6}{:>8}{:>8}{:>9}{:>9}{:>9}{:>10}{:>9}",
        "pattern",
        "pv",
        "mode",
        "reps",
        "events",
        "early",
        "p50_us",
        "p99_us",
        "max_us",
        "p50/kern",
        "p99/kern",
        "cpu_us/ev",
        "cpu/kern"
    )
}

/// One row as a table line; the PV actually used follows the one asked for (`eoi=reg` where
/// the guest fell back to the EOI register).
pub fn line(r: &LatencyRow) -> String {
    let pv = match (r.pv.as_str(), r.pv_eoi_used, r.pv_deadline_used) {
        ("none", _, _) | (_, true, true) | ("eoi", true, _) => r.pv.clone(),
        (asked, eoi, _) if r.reps_ok > 0 => {
            format!("{asked}({})", if eoi { "no-dl" } else { "reg" })
        }
        (asked, _, _) => asked.to_string(),
    };
    format!(
        "{:<11}{:<20}{:<8}{:>5}{:>8}{:>6}{:>8}{:>8}{:>9}{:>9}{:>9}{:>10}{:>9}",
        r.pattern,
        pv,
        r.mode,
        r.reps_ok,
        opt(r.events, 0),
        r.early,
        opt(r.p50_us, 0),
        opt(r.p99_us, 0),
        opt(r.max_us, 0),
        opt(r.p50_vs_kernel, 2),
        opt(r.p99_vs_kernel, 2),
        opt(r.cpu_us_per_event, 1),
        opt(r.cpu_vs_kernel, 2)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn console(events: u64, early: u64, p50: u64, pv: &str) -> String {
        format!(
            "idle-sim: 1 CPUs (0 busy), rearm-halt, tsc-deadline, delta 200000 tsc, duration 1000 \
             ms, eoi {pv}\n\
             ........\n\
             idle-sim: cpu 0: events {events} ipis_sent 0 ipis_received 0 early {early}\n\
             idle-sim: lateness_ns n={events} min 1 p50 {p50} p99 {p50} max 900000 mean {p50}\n\
             idle-sim: hist lateness {}-{p50}:{events}\n\
             idle-sim: ipi_ns n=0\n\
             idle-sim: PASS\n",
            p50 - 1
        )
    }

    fn metrics(cpu_ns: u64) -> RunReport {
        crate::lull_metrics::report(serde_json::json!({
            "threads": [{"name": "lull", "cpu_ns": 1000},
                        {"name": "vcpu0", "cpu_ns": cpu_ns - 1000}],
        }))
    }

    #[test]
    fn a_run_measures_from_console_and_metrics() {
        let m = measure(
            &console(4000, 1, 100_000, "pv"),
            &metrics(80_000_000),
            "rearm-halt",
        );
        let m = m.unwrap();
        assert_eq!((m.events, m.early), (4000, 1));
        assert_eq!((m.p50_ns, m.p99_ns, m.max_ns), (100_000, 100_000, 900_000));
        assert_eq!(m.cpu_ns, 80_000_000);
        assert!(m.pv_eoi && !m.pv_deadline);
        let failed = console(4000, 0, 100_000, "register").replace("PASS", "FAIL: x");
        assert_eq!(measure(&failed, &metrics(2000), "rearm-halt"), None);
        assert_eq!(
            measure(&console(0, 0, 100, "pv"), &metrics(2000), "rearm-halt"),
            None
        );
        // The guest ran another pattern (or an old idle-sim its mix): not this row's figures.
        let halt = console(4000, 0, 100_000, "pv");
        assert_eq!(measure(&halt, &metrics(2000), "rearm-busy"), None);
    }

    #[test]
    fn rows_are_medians_with_ratios_to_their_groups_kernel() {
        let run = |p50_ns: u64, cpu_ns: u64| RunMeasure {
            events: 1000,
            early: 0,
            p50_ns,
            p99_ns: 2 * p50_ns,
            max_ns: 3 * p50_ns,
            cpu_ns,
            pv_eoi: false,
            pv_deadline: false,
        };
        let kernel = [
            run(100_000, 20_000_000),
            run(300_000, 40_000_000),
            run(200_000, 30_000_000),
        ];
        let pull = [run(250_000, 45_000_000)];
        let rows = with_kernel_ratios(vec![
            row("rearm-halt", "none", "kernel", &kernel, Vec::new()),
            row(
                "rearm-halt",
                "none",
                "pull",
                &pull,
                vec!["rep 2: status 8".into()],
            ),
            row("rearm-halt", "eoi", "pull", &pull, Vec::new()),
        ]);
        assert_eq!(rows[0].p50_us, Some(200.0));
        assert_eq!(rows[0].cpu_us_per_event, Some(30.0));
        assert_eq!(rows[0].p50_vs_kernel, Some(1.0));
        assert_eq!(rows[1].p50_vs_kernel, Some(1.25));
        assert_eq!(rows[1].p99_vs_kernel, Some(1.25));
        assert_eq!(rows[1].cpu_vs_kernel, Some(1.5));
        assert_eq!(rows[1].reps_ok, 1);
        // No kernel row in the `eoi` group: no ratio rather than one to another group's kernel.
        assert_eq!(rows[2].p50_vs_kernel, None);
        assert!(line(&rows[1]).contains("1.25"));
    }

    #[test]
    fn a_pv_the_guest_could_not_use_shows_in_the_table() {
        let mut r = row("rearm-busy", "eoi", "pull", &[], Vec::new());
        assert!(!r.pv_eoi_used);
        assert!(line(&r).contains(" eoi "));
        r.reps_ok = 1;
        assert!(line(&r).contains("eoi(reg)"));
    }
}
