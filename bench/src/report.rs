//! The results of `lull bench`: JSON documents with stable field names (schema names
//! `lull-bench-density/1`, `lull-bench-wakeup/1` and `lull-bench-timer-modes/1`, documented in `docs/PERFORMANCE.md`)
//! and the text tables printed as rows complete.

use serde::{Deserialize, Serialize};

use super::guest_output::{LatencySummary, WakeIpiReport};
use super::host::HostInfo;

/// Schema name of the density JSON.
pub const DENSITY_SCHEMA: &str = "lull-bench-density/1";
/// Schema name of the wake-up JSON.
pub const WAKEUP_SCHEMA: &str = "lull-bench-wakeup/1";
/// Schema name of the timer-modes JSON.
pub const TIMER_MODES_SCHEMA: &str = "lull-bench-timer-modes/1";

/// What `lull bench density` was asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DensityParams {
    /// VM counts, in run order.
    pub vms: Vec<u32>,
    /// vCPUs per VM.
    pub cpus_per_vm: u32,
    /// Guest ELF.
    pub guest: String,
    /// Guest command line (duration included).
    pub guest_cmdline: String,
    /// How long each guest runs its timers, seconds.
    pub duration_s: f64,
    /// Guest RAM per VM, MiB.
    pub memory_mib: u64,
    /// Modes, in run order.
    pub modes: Vec<String>,
    /// `--global-timers` as asked (user irqchip modes only).
    pub global_timers: Option<String>,
    /// Whether the lull binary had `--global-timers` and it was passed.
    pub global_timers_applied: bool,
}

/// One (mode, VM count) of the density experiment. Rates are per vCPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DensityRow {
    /// `kernel`, `pull`, `push`, `central`, `qemu-on`, `qemu-off`.
    pub mode: String,
    /// VMs run at once.
    pub vms: u32,
    /// vCPUs over all VMs.
    pub vcpus: u32,
    /// VMs that exited as the guest asked (lull status 1) with a PASS line.
    pub vms_ok: u32,
    /// Length of the steady-state window (all VMs booted, none exited), seconds.
    pub window_s: f64,
    /// Host CPU time of all VMM threads per vCPU, in percent of one host core (window).
    pub host_cpu_percent_per_vcpu: f64,
    /// Host CPU time of the whole fleet, in percent of one host core (window).
    pub host_cpu_percent_total: f64,
    /// Voluntary context switches (block + wake-up) of all VMM threads per vCPU per second.
    pub host_wakeups_per_vcpu_s: f64,
    /// Voluntary + involuntary context switches per vCPU per second.
    pub host_ctxt_switches_per_vcpu_s: f64,
    /// Guest timer events per vCPU per second (the guests' own counts over their duration).
    pub guest_timer_events_per_vcpu_s: f64,
    /// `host_wakeups_per_vcpu_s / guest_timer_events_per_vcpu_s` (IPIs add a few).
    pub host_wakeups_per_timer_event: f64,
    /// Wake-ups of halted vCPU threads (lull: `vcpus[].wakeups` of every cause; kernel
    /// irqchip: KVM's `halt_wakeup`) per guest timer event, whole run; `null` for QEMU.
    pub halted_vcpu_wakeups_per_timer_event: Option<f64>,
    /// Wake-ups of blocked vCPUs caused by a global timer (`vcpus[].wakeups.global_timer`),
    /// summed over the fleet; `null` where lull does not report it.
    pub global_timer_wakeups: Option<u64>,
    /// Global timer expiries summed over the fleet: on the vCPUs (`vcpus[].global_timer_fires`)
    /// and on the `central` model's timer thread (`global_timers.timer_thread_fires`); `null`
    /// where lull reports neither.
    pub global_timer_fires: Option<u64>,
    /// KVM exits (KVM's own `exits` counter) per vCPU per second of run time; `null` for QEMU.
    pub vm_exits_per_vcpu_s: Option<f64>,
    /// Guest timer lateness over all VMs (TSC at the handler - deadline).
    pub lateness: LatencySummary,
    /// IPI latency between sibling vCPUs over all VMs.
    pub ipi_latency: LatencySummary,
    /// Timer interrupts that came early (beyond the guest's 10 us tolerance).
    pub early_interrupts: u64,
    /// Mean over VMs of the largest `VmRSS` of the VMM process, KiB.
    pub rss_kib_per_vm: f64,
    /// Mean guest-RAM part of the RSS at the window start, KiB (`null` if not found).
    pub guest_ram_rss_kib_per_vm: Option<f64>,
    /// Mean rest of the RSS (the VMM's own memory) at the window start, KiB.
    pub vmm_rss_kib_per_vm: Option<f64>,
    /// What went wrong, one line per failed VM.
    pub failures: Vec<String>,
}

/// The density JSON document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DensityReport {
    /// Always [`DENSITY_SCHEMA`].
    pub schema: String,
    /// The host.
    pub host: HostInfo,
    /// The request.
    pub params: DensityParams,
    /// One row per (mode, VM count), in run order.
    pub results: Vec<DensityRow>,
}

/// One (mode, delay) of the wake-up experiment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WakeupRow {
    /// `kernel`, or `user-<halt-poll>` (`user-off`, `user-200us`, `user-adaptive`).
    pub mode: String,
    /// `--halt-poll` passed to lull (`null`: kernel irqchip, or lull lacks the flag).
    pub halt_poll: Option<String>,
    /// Time from the target's halt announcement to the IPI, microseconds.
    pub delay_us: u64,
    /// IPI to handler latency as the guest measured it.
    pub latency: Option<WakeIpiReport>,
    /// Host CPU time of the target vCPU thread per sample, microseconds (lull only).
    pub target_cpu_us_per_sample: Option<f64>,
    /// Host wake-ups (voluntary context switches) of the target vCPU thread per sample.
    pub target_wakeups_per_sample: Option<f64>,
    /// Why the run failed, if it did.
    pub failure: Option<String>,
}

/// The wake-up JSON document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WakeupReport {
    /// Always [`WAKEUP_SCHEMA`].
    pub schema: String,
    /// The host.
    pub host: HostInfo,
    /// Samples per run.
    pub count: u32,
    /// Whether the lull binary had `--halt-poll`.
    pub halt_poll_applied: bool,
    /// Rows in run order.
    pub results: Vec<WakeupRow>,
}

/// One mode of the timer-modes experiment: medians over the repetitions of the costs per
/// guest timer event (`null` where no repetition succeeded or lull did not report it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimerModesRow {
    /// `kernel`, `pull`, `push`, `central`.
    pub mode: String,
    /// Repetitions whose two runs both passed.
    pub reps_ok: u32,
    /// TSC-deadline lateness of the measured run, median, us.
    pub tsc_deadline_p50_us: Option<f64>,
    /// TSC-deadline lateness of the measured run, 99th percentile, us.
    pub tsc_deadline_p99_us: Option<f64>,
    /// KVM exits (KVM's own counter, in-kernel exits included) per event.
    pub kvm_exits_per_event: Option<f64>,
    /// Exits that reached lull (`vcpus[0]` exit counters) per event.
    pub lull_exits_per_event: Option<f64>,
    /// Host wake-ups (voluntary context switches) of the vCPU thread per event.
    pub vcpu_wakeups_per_event: Option<f64>,
    /// Host wake-ups of the `central` model's timer thread per event (0 for the others).
    pub timer_thread_wakeups_per_event: Option<f64>,
    /// Host CPU time of all lull threads per event, us.
    pub cpu_us_per_event: Option<f64>,
    /// What went wrong, one line per failed repetition.
    pub failures: Vec<String>,
}

/// The timer-modes JSON document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimerModesReport {
    /// Always [`TIMER_MODES_SCHEMA`].
    pub schema: String,
    /// The host.
    pub host: HostInfo,
    /// Timer events per guest timer mode of the measured run.
    pub count: u32,
    /// Timer events per guest timer mode of the run subtracted from it.
    pub small_count: u32,
    /// Repetitions per mode.
    pub reps: u32,
    /// One row per mode, in run order.
    pub results: Vec<TimerModesRow>,
}

/// The median (the mean of the middle two for an even count); `None` for no values.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.prec$}"))
}

fn opt_u(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn us(ns: u64) -> String {
    format!("{:.0}", ns as f64 / 1000.0)
}

/// Header of the density table.
pub fn density_header() -> String {
    format!(
        "{:<9}{:>4}{:>6}{:>5} {:>9}{:>9}{:>9}{:>8}{:>8}{:>8}{:>8}{:>8}{:>10}{:>8}{:>8}{:>8}{:>9}",
        "mode",
        "VMs",
        "vCPUs",
        "ok",
        "cpu%/vcpu",
        "wake/v/s",
        "csw/v/s",
        "ev/v/s",
        "wake/ev",
        "halt/ev",
        "glob_wk",
        "glob_fi",
        "exits/v/s",
        "p50_us",
        "p99_us",
        "max_us",
        "rss_KiB"
    )
}

/// One density row as a table line.
pub fn density_line(r: &DensityRow) -> String {
    format!(
        "{:<9}{:>4}{:>6}{:>5} {:>9.3}{:>9.1}{:>9.1}{:>8.2}{:>8.2}{:>8}{:>8}{:>8}{:>10}{:>8}{:>8}{:>8}{:>9.0}",
        r.mode,
        r.vms,
        r.vcpus,
        r.vms_ok,
        r.host_cpu_percent_per_vcpu,
        r.host_wakeups_per_vcpu_s,
        r.host_ctxt_switches_per_vcpu_s,
        r.guest_timer_events_per_vcpu_s,
        r.host_wakeups_per_timer_event,
        opt(r.halted_vcpu_wakeups_per_timer_event, 2),
        opt_u(r.global_timer_wakeups),
        opt_u(r.global_timer_fires),
        opt(r.vm_exits_per_vcpu_s, 1),
        us(r.lateness.p50_ns),
        us(r.lateness.p99_ns),
        us(r.lateness.max_ns),
        r.rss_kib_per_vm
    )
}

/// Header of the wake-up table.
pub fn wakeup_header() -> String {
    format!(
        "{:<15}{:>9}{:>5}{:>8}{:>8}{:>8}{:>8}{:>9}{:>9}{:>11}{:>10}",
        "mode",
        "delay_us",
        "n",
        "min_us",
        "p50_us",
        "p90_us",
        "p99_us",
        "max_us",
        "mean_us",
        "cpu_us/smp",
        "wake/smp"
    )
}

/// One wake-up row as a table line.
pub fn wakeup_line(r: &WakeupRow) -> String {
    let Some(l) = r.latency else {
        return format!(
            "{:<15}{:>9}  failed: {}",
            r.mode,
            r.delay_us,
            r.failure.as_deref().unwrap_or("no result")
        );
    };
    format!(
        "{:<15}{:>9}{:>5}{:>8}{:>8}{:>8}{:>8}{:>9}{:>9}{:>11}{:>10}",
        r.mode,
        r.delay_us,
        l.n,
        us(l.min_ns),
        us(l.p50_ns),
        us(l.p90_ns),
        us(l.p99_ns),
        us(l.max_ns),
        us(l.mean_ns),
        opt(r.target_cpu_us_per_sample, 1),
        opt(r.target_wakeups_per_sample, 2)
    )
}

/// Header of the timer-modes table.
pub fn timer_modes_header() -> String {
    format!(
        "{:<9}{:>5}{:>8}{:>8}{:>11}{:>11}{:>11}{:>10}{:>10}",
        "mode",
        "reps",
        "p50_us",
        "p99_us",
        "kvm_ex/ev",
        "lull_ex/ev",
        "vcpu_wk/ev",
        "thr_wk/ev",
        "cpu_us/ev"
    )
}

/// One timer-modes row as a table line.
pub fn timer_modes_line(r: &TimerModesRow) -> String {
    format!(
        "{:<9}{:>5}{:>8}{:>8}{:>11}{:>11}{:>11}{:>10}{:>10}",
        r.mode,
        r.reps_ok,
        opt(r.tsc_deadline_p50_us, 0),
        opt(r.tsc_deadline_p99_us, 0),
        opt(r.kvm_exits_per_event, 2),
        opt(r.lull_exits_per_event, 2),
        opt(r.vcpu_wakeups_per_event, 2),
        opt(r.timer_thread_wakeups_per_event, 2),
        opt(r.cpu_us_per_event, 1)
    )
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json<T: Serialize>(
    path: &std::path::Path,
    value: &T,
) -> Result<(), super::BenchError> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    std::fs::write(path, text).map_err(|e| super::BenchError::Io(path.to_path_buf(), e))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A row of `mode` with `n` VMs whose host CPU per vCPU is `cpu` (and wake-ups 10 x `cpu`).
    pub(crate) fn density_row(mode: &str, n: u32, cpu: f64) -> DensityRow {
        DensityRow {
            mode: mode.into(),
            vms: n,
            vcpus: 2 * n,
            vms_ok: n,
            window_s: 1.0,
            host_cpu_percent_per_vcpu: cpu,
            host_cpu_percent_total: cpu * f64::from(2 * n),
            host_wakeups_per_vcpu_s: 10.0 * cpu,
            host_ctxt_switches_per_vcpu_s: 10.0 * cpu,
            guest_timer_events_per_vcpu_s: 10.0,
            host_wakeups_per_timer_event: cpu,
            halted_vcpu_wakeups_per_timer_event: None,
            global_timer_wakeups: None,
            global_timer_fires: None,
            vm_exits_per_vcpu_s: None,
            lateness: LatencySummary::default(),
            ipi_latency: LatencySummary::default(),
            early_interrupts: 0,
            rss_kib_per_vm: 4096.0,
            guest_ram_rss_kib_per_vm: None,
            vmm_rss_kib_per_vm: None,
            failures: Vec::new(),
        }
    }

    /// A report of 2-vCPU VMs holding `results`.
    pub(crate) fn density_report(results: Vec<DensityRow>) -> DensityReport {
        DensityReport {
            schema: DENSITY_SCHEMA.into(),
            host: crate::host::host_info(),
            params: DensityParams {
                vms: results.iter().map(|r| r.vms).collect(),
                cpus_per_vm: 2,
                guest: "idle-sim.elf".into(),
                guest_cmdline: "duration_ms=1000 <mix>".into(),
                duration_s: 1.0,
                memory_mib: 64,
                modes: results.iter().map(|r| r.mode.clone()).collect(),
                global_timers: None,
                global_timers_applied: false,
            },
            results,
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn a_report_reads_back_as_written() {
        let report = density_report(vec![density_row("pull", 4, 0.5)]);
        let json = serde_json::to_string(&report).unwrap();
        let back: DensityReport = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        assert!(density_line(&back.results[0]).starts_with("pull        4     8    4"));
    }
}
