//! The results of `lull bench`: JSON documents with stable field names (schema names
//! `lull-bench-density/2`, `lull-bench-wakeup/1` and `lull-bench-timer-modes/1`, documented in `docs/bench/README.md`)
//! and the text tables printed as rows complete.

use serde::{Deserialize, Serialize};

use super::density_power_row::{self, DensityPower};
use super::guest_output::{LatencySummary, WakeIpiReport};
use super::host::HostInfo;
use super::power::{PowerWindow, Reading};

/// Schema name of the density JSON.
pub const DENSITY_SCHEMA: &str = "lull-bench-density/2";
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
    /// `--guest linux`: how its workload and window were set (absent for the other guests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linux: Option<LinuxParams>,
    /// `--power-meter`: the command that prints the host's watts, if one was given.
    #[serde(default)]
    pub power_meter: Option<String>,
    /// `--timer-slack`: the slacks the user-irqchip modes ran with, one row each (absent: not
    /// given).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timer_slack: Vec<String>,
}

/// How `lull bench density --guest linux` ran its kernels.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LinuxParams {
    /// Workloads (`idle`, `timers`), in run order.
    pub workloads: Vec<String>,
    /// The window asked for, seconds (`duration_s` is the same).
    pub window_s: f64,
    /// The boot spread allowed for, per VM count: `[vms, seconds]`.
    pub boot_spread_s: Vec<(u32, f64)>,
    /// Wait after the last VM started its workload before the window opens, seconds.
    pub settle_s: f64,
    /// The window closes this long before the first VM's workload ends, seconds.
    pub margin_s: f64,
}

/// A mode that was asked for (or is a default) but cannot run here.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SkippedMode {
    /// The mode (`qemu-on`, `qemu-off`).
    pub mode: String,
    /// Why it was left out.
    pub reason: String,
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
    /// Voluntary + nonvoluntary context switches per vCPU per second.
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
    /// KVM exits (KVM's own `exits` counter) less the port I/O exits (the guest's console) per
    /// vCPU per second of run time; `null` for QEMU.
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
    /// Mean PSS per VM at the window start (`/proc/PID/smaps_rollup`, lull and guest: what
    /// a VM holds, the pages VMs share divided among them), KiB.
    #[serde(default)]
    pub pss_kib_per_vm: Option<f64>,
    /// Mean threads per VM (lull's) at the window start.
    #[serde(default)]
    pub threads_per_vm: Option<f64>,
    /// What went wrong, one line per failed VM.
    pub failures: Vec<String>,
    /// `--guest linux`: the workload's own figures and the window (absent for the others).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linux: Option<LinuxRow>,
    /// What the row cost the host in power, above the baseline (absent in reports before
    /// schema 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<DensityPower>,
    /// `lull run --timer-slack` of the row's VMs (`--timer-slack` of the bench; absent: not
    /// given, lull's default `off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer_slack: Option<String>,
    /// Wake-ups of blocked vCPUs that served more than one timer expiry, summed over the
    /// fleet (`vcpus[].wake_multi_expiry`); absent where lull does not report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_expiry_wakeups: Option<u64>,
    /// Expiries those wake-ups served beyond their first, summed over the fleet
    /// (`vcpus[].wake_coalesced`: k expiries count k - 1, the host wake-ups the VMs' own
    /// coalescing saved); absent where lull does not report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesced_expiries: Option<u64>,
    /// With a timer slack S: guest timer lateness less S (the host's delay past the slack, 0
    /// within it), over all VMs, from the lateness histogram (`Histogram::past`: its
    /// quantiles and maximum less S, the mean from bucket midpoints); absent without a slack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lateness_past_slack: Option<LatencySummary>,
}

impl DensityRow {
    /// The mode as the tables show it: with its timer slack, if given (`pull@1ms`).
    pub fn label(&self) -> String {
        match &self.timer_slack {
            Some(s) => format!("{}@{s}", self.mode),
            None => self.mode.clone(),
        }
    }

    /// The name of its line in the plot: the mode, and the Linux workload if there is one.
    pub fn series(&self) -> String {
        match &self.linux {
            Some(l) => format!("{} {}", self.label(), l.workload),
            None => self.label(),
        }
    }
}

/// What a row of `--guest linux` adds. The guest's rates are its own counts over its whole
/// workload (guest clock); the host's are over the window inside it, in which every VM ran
/// the workload. In the generic fields of the row a guest "timer event" is a local APIC
/// timer interrupt (`loc`), and `lateness` holds the `timers` workload's hrtimer lateness
/// (`n`: timer events; p50: median of the VMs' p50s, p99: largest of their p99s, max and
/// mean exact: the guest prints percentiles, not its histogram).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LinuxRow {
    /// `idle` or `timers`.
    pub workload: String,
    /// Each VM's workload length, seconds (guest command line).
    pub workload_s: u64,
    /// Guest time from boot to the workload (`boot_ms`), shortest and longest VM, seconds.
    pub boot_s: (f64, f64),
    /// Host time between the first and the last VM starting the workload, seconds.
    pub start_spread_s: f64,
    /// Why the window is shorter than asked, or missing, if it is.
    pub window_note: Option<String>,
    /// Local APIC timer interrupts per vCPU per second (guest `loc`).
    pub loc_per_vcpu_s: f64,
    /// Passes through the guest's idle loop (one per HLT) per vCPU per second.
    pub guest_idle_calls_per_vcpu_s: f64,
    /// Rescheduling + function-call IPIs received per vCPU per second.
    pub guest_ipis_per_vcpu_s: f64,
    /// Guest idle residency, mean over the VMs, percent.
    pub guest_idle_pct: f64,
    /// `timers`: hrtimer events per vCPU per second.
    pub timer_events_per_vcpu_s: Option<f64>,
    /// `timers`: lateness when the timer's thread ran again (same combination as `lateness`).
    pub thread_wake: Option<LatencySummary>,
    /// Wake-ups of halted vCPUs (lull's count of every cause, or KVM's `halt_wakeup` with the
    /// kernel irqchip) per vCPU per second of the window; `null` for QEMU.
    pub halted_vcpu_wakeups_per_vcpu_s: Option<f64>,
    /// The host's own count of guest timer interrupts over the window (lull's LAPIC timer
    /// expiries, `vcpus[].lapic_timer_fires`) per vCPU per second: the window's counterpart
    /// of `loc_per_vcpu_s`; `null` for the kernel irqchip and QEMU.
    #[serde(default)]
    pub host_timer_interrupts_per_vcpu_s: Option<f64>,
    /// Interrupts delivered to the guest over the window (lull's `injected`, or KVM's
    /// `irq_injections` with the kernel irqchip: timer, IPIs, devices) per vCPU per second;
    /// `null` for QEMU.
    #[serde(default)]
    pub host_injected_interrupts_per_vcpu_s: Option<f64>,
    /// lull's wake-ups of halted vCPUs by cause (`timer`, `interrupt`, `control`, `other`,
    /// `global_timer`) per vCPU per second of the window; empty for the kernel irqchip and QEMU.
    #[serde(default)]
    pub halted_vcpu_wakeups_by_cause: std::collections::BTreeMap<String, f64>,
    /// A row of clones restored from one snapshot (`--clones`): what restoring them cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clones: Option<CloneRow>,
}

/// What a row of clones (`--clones`) cost: restore-to-running and memory as the host sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CloneRow {
    /// The snapshot directory they were restored from.
    pub snapshot: String,
    /// `vm.restore` (resuming, memory mapped) sent to answered, per clone, ms.
    pub restore_to_running_ms: Option<crate::spread::Spread>,
    /// Per VM as the window opened (`/proc/PID/smaps_rollup`, lull and guest together), KiB:
    /// the proportional set size ...
    pub pss_kib_per_vm: Option<f64>,
    /// ... its anonymous part (the pages a clone wrote) ...
    pub pss_anon_kib_per_vm: Option<f64>,
    /// ... its file part (its share of the snapshot's pages) ...
    pub pss_file_kib_per_vm: Option<f64>,
    /// ... resident pages no other process maps ...
    pub private_kib_per_vm: Option<f64>,
    /// ... and resident pages others map too.
    pub shared_kib_per_vm: Option<f64>,
    /// The host's `MemAvailable` before the first clone less as the window opened, per VM,
    /// KiB.
    pub mem_available_used_kib_per_vm: Option<f64>,
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
    /// Modes left out, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedMode>,
    /// The host with no VM, measured before the first row as long as a row's run (absent in
    /// reports before schema 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_baseline: Option<Reading<PowerWindow>>,
}

impl DensityReport {
    /// A report of `params` before its first row, with the modes left out and why.
    pub fn empty(params: DensityParams, skipped: Vec<SkippedMode>) -> Self {
        Self {
            schema: DENSITY_SCHEMA.into(),
            host: super::host::host_info(),
            params,
            results: Vec::new(),
            skipped,
            power_baseline: None,
        }
    }
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

/// `v` with `prec` decimals, or `-` where there is none (a table cell).
pub(crate) fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.prec$}"))
}

fn opt_u(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn us(ns: u64) -> String {
    format!("{:.0}", ns as f64 / 1000.0)
}

// The tables are fixed-width `format!` strings, not a table crate (comfy-table, tabled): the
// experiments print the header first and each row as it completes (a run takes minutes), and
// a table crate sizes its columns from all rows, so it would print nothing until the last row
// or give each row its own widths. The widths are written once per header/line pair instead.

/// Header of the density table.
pub fn density_header() -> String {
    format!(
        "{:<13}{:>4}{:>6}{:>5} {:>9}{:>9}{:>9}{:>8}{:>8}{:>8}{:>8}{:>8}{:>10}{:>8}{:>8}{:>8}{:>9}",
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
    ) + &density_power_row::header_columns()
}

/// One density row as a table line.
pub fn density_line(r: &DensityRow) -> String {
    format!(
        "{:<13}{:>4}{:>6}{:>5} {:>9.3}{:>9.1}{:>9.1}{:>8.2}{:>8.2}{:>8}{:>8}{:>8}{:>10}{:>8}{:>8}{:>8}{:>9.0}",
        r.label(),
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
    ) + &density_power_row::columns(r.power.as_ref())
}

/// Header of the `--guest linux` density table.
pub fn linux_header() -> String {
    format!(
        "{:<13}{:<8}{:>4}{:>6}{:>4}{:>6} {:>9}{:>8}{:>9}{:>9}{:>9}{:>10}{:>7}{:>9}{:>9}{:>8}",
        "mode",
        "work",
        "VMs",
        "vCPUs",
        "ok",
        "win_s",
        "cpu%/vcpu",
        "loc/v/s",
        "halt/v/s",
        "halt/loc",
        "csw/loc",
        "exits/v/s",
        "idle%",
        "p50_us",
        "p99_us",
        "boot_s"
    ) + &density_power_row::header_columns()
}

/// The clone figures of a `--clones` row, on one line.
pub fn clone_line(c: &CloneRow) -> String {
    let mib = |kib: Option<f64>| kib.map_or("-".to_string(), |k| format!("{:.2}", k / 1024.0));
    let restore = c.restore_to_running_ms.map_or("-".to_string(), |s| {
        format!("p50 {:.1} ms, max {:.1} ms", s.p50, s.max)
    });
    format!(
        "clones: restore-to-running {restore}; per VM: PSS {} MiB (anon {}, file {}), private {} MiB, shared {} MiB, MemAvailable used {} MiB",
        mib(c.pss_kib_per_vm),
        mib(c.pss_anon_kib_per_vm),
        mib(c.pss_file_kib_per_vm),
        mib(c.private_kib_per_vm),
        mib(c.shared_kib_per_vm),
        mib(c.mem_available_used_kib_per_vm),
    )
}

/// One `--guest linux` row as a table line.
pub fn linux_line(r: &DensityRow) -> String {
    let Some(l) = &r.linux else {
        return density_line(r);
    };
    let late = |ns: u64| (r.lateness.n > 0).then(|| ns as f64 / 1000.0);
    format!(
        "{:<13}{:<8}{:>4}{:>6}{:>4}{:>6.1} {:>9.3}{:>8.2}{:>9}{:>9}{:>9.2}{:>10}{:>7.1}{:>9}{:>9}{:>8.0}",
        r.label(),
        l.workload,
        r.vms,
        r.vcpus,
        r.vms_ok,
        r.window_s,
        r.host_cpu_percent_per_vcpu,
        l.loc_per_vcpu_s,
        opt(l.halted_vcpu_wakeups_per_vcpu_s, 2),
        opt(r.halted_vcpu_wakeups_per_timer_event, 3),
        r.host_wakeups_per_timer_event,
        opt(r.vm_exits_per_vcpu_s, 1),
        l.guest_idle_pct,
        opt(late(r.lateness.p50_ns), 0),
        opt(late(r.lateness.p99_ns), 0),
        l.boot_s.1
    ) + &density_power_row::columns(r.power.as_ref())
}

/// The header and lines of a density report's table (the Linux one if it has Linux rows).
pub fn density_table(report: &DensityReport) -> Vec<String> {
    let linux = report.results.iter().any(|r| r.linux.is_some());
    let mut lines = vec![if linux {
        linux_header()
    } else {
        density_header()
    }];
    for r in &report.results {
        lines.push(if linux {
            linux_line(r)
        } else {
            density_line(r)
        });
    }
    lines
}

/// A row's host wake-ups per vCPU-second above the no-VM baseline (its power figures: the
/// host CPUs' idle exits, or the LOC + RES + CAL proxy) and what they count, if read.
fn host_wakeups(r: &DensityRow) -> (Option<f64>, Option<&str>) {
    let power = r.power.as_ref();
    (
        power.and_then(|p| p.host_wakeups_per_vcpu_s.value),
        power.and_then(|p| p.host_wakeups_source.as_deref()),
    )
}

/// `pull / kernel` per workload and VM count: host CPU per vCPU, wake-ups of halted vCPUs
/// per guest timer event (Linux: per local timer interrupt), wake-ups of lull's threads
/// (voluntary context switches) per guest timer event, and host wake-ups per vCPU-second
/// above the baseline (the power figures' `hwk/v/s`), where both rows have them.
pub fn pull_kernel_ratios(report: &DensityReport) -> Vec<String> {
    let find = |mode: &str, like: &DensityRow| {
        report.results.iter().find(|r| {
            r.mode == mode
                && r.vms == like.vms
                && r.linux.as_ref().map(|l| &l.workload) == like.linux.as_ref().map(|l| &l.workload)
        })
    };
    // A row without a window measured nothing on the host.
    let host = |r: &DensityRow, v: f64| (r.window_s > 0.0).then_some(v);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".to_string(),
    };
    report
        .results
        .iter()
        .filter(|r| r.mode == "pull")
        .filter_map(|pull| {
            let kernel = find("kernel", pull)?;
            let workload = pull.linux.as_ref().map_or("", |l| l.workload.as_str());
            let (pull_wakeups, counted) = host_wakeups(pull);
            Some(format!(
                "{:<13} / kernel {workload:<7} N={:<3} host CPU per vCPU {}, halted-vCPU wake-ups per timer interrupt {}, VMM-thread wake-ups per timer interrupt {}, host wake-ups per vCPU-s above the baseline {}{}",
                pull.label(),
                pull.vms,
                ratio(
                    host(pull, pull.host_cpu_percent_per_vcpu),
                    host(kernel, kernel.host_cpu_percent_per_vcpu)
                ),
                ratio(
                    pull.halted_vcpu_wakeups_per_timer_event,
                    kernel.halted_vcpu_wakeups_per_timer_event
                ),
                ratio(
                    host(pull, pull.host_wakeups_per_timer_event),
                    host(kernel, kernel.host_wakeups_per_timer_event)
                ),
                ratio(pull_wakeups, host_wakeups(kernel).0),
                counted
                    .map(|source| format!(" ({source})"))
                    .unwrap_or_default(),
            ))
        })
        .collect()
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
    write_output(path, text.as_bytes())
}

/// Writes `bytes` to the output `path`, replacing it, opened as every file lull writes is
/// (`vmm::host::files::open_output`: no link followed, a regular file or a character device).
pub fn write_output(path: &std::path::Path, bytes: &[u8]) -> Result<(), super::BenchError> {
    use std::io::Write;
    vmm::host::files::open_output(path, vmm::host::files::OutputMode::Replace)
        .and_then(|mut file| file.write_all(bytes))
        .map_err(|e| super::BenchError::Io(path.to_path_buf(), e))
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
            pss_kib_per_vm: None,
            threads_per_vm: None,
            failures: Vec::new(),
            linux: None,
            power: None,
            timer_slack: None,
            multi_expiry_wakeups: None,
            coalesced_expiries: None,
            lateness_past_slack: None,
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
                linux: None,
                power_meter: None,
                timer_slack: Vec::new(),
            },
            results,
            skipped: Vec::new(),
            power_baseline: None,
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn pull_is_compared_with_kernel_of_the_same_count() {
        let mut kernel = density_row("kernel", 4, 0.5);
        kernel.halted_vcpu_wakeups_per_timer_event = Some(0.5);
        let mut pull = density_row("pull", 4, 0.75);
        pull.halted_vcpu_wakeups_per_timer_event = Some(0.6);
        let mut lost = density_row("pull", 8, 0.75);
        lost.window_s = 0.0;
        let kernel8 = density_row("kernel", 8, 0.5);
        let lines = pull_kernel_ratios(&density_report(vec![kernel, pull, kernel8, lost]));
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("N=4"), "{}", lines[0]);
        // CPU 0.75 / 0.5; halted wake-ups 0.6 / 0.5; host wake-ups per event 0.75 / 0.5.
        assert!(
            lines[0].ends_with(
                "host CPU per vCPU 1.50, halted-vCPU wake-ups per timer interrupt 1.20, VMM-thread wake-ups per timer interrupt 1.50, host wake-ups per vCPU-s above the baseline -"
            ),
            "{}",
            lines[0]
        );
        // No window: nothing to compare.
        assert!(
            lines[1].contains("N=8   host CPU per vCPU -,"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn a_report_reads_back_as_written() {
        let report = density_report(vec![density_row("pull", 4, 0.5)]);
        let json = serde_json::to_string(&report).unwrap();
        let back: DensityReport = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        assert!(density_line(&back.results[0]).starts_with("pull            4     8    4"));
    }
}
