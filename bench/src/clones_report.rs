//! `lull bench clones`' results: the JSON document (`lull-bench-clones/1`, documented in
//! `docs/bench/README.md`) and the tables on stdout.

use serde::{Deserialize, Serialize};

use super::host::HostInfo;
use super::spread::Spread;

/// Schema name of the clones JSON.
pub const CLONES_SCHEMA: &str = "lull-bench-clones/1";

/// How long one restore took to running, per path, of one snapshot and memory mode.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RestoreRow {
    /// The snapshot's mode: `kernel`, `pull`, ... with `+slack=S` where the VM had a slack.
    pub mode: String,
    /// `map` or `copy`.
    pub memory: String,
    /// `vm.restore` with `"resume": true` on a lull already serving its socket: request sent
    /// to answer received (the VM running), ms.
    pub api_ms: Option<Spread>,
    /// `lull run --restore DIR --resume`: process spawned to its "VM resumed" log line, ms.
    pub cli_ms: Option<Spread>,
    /// What went wrong, one line each.
    pub failures: Vec<String>,
}

/// N clones of one snapshot running at once, measured after they settled.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FleetRow {
    /// The snapshot's mode, as in [`RestoreRow::mode`].
    pub mode: String,
    /// `map` or `copy`.
    pub memory: String,
    /// Clones started.
    pub clones: u32,
    /// Clones still running at the end of the window (a clone that exited failed).
    pub running: u32,
    /// Each clone's spawn to its "VM resumed" log line, ms, the fleet started one after the
    /// other.
    pub restore_to_running_ms: Option<Spread>,
    /// Per clone (lull and its guest together: `/proc/PID/smaps_rollup`), KiB, mean over the
    /// running clones: proportional set size.
    pub pss_kib: Option<f64>,
    /// ... of it anonymous (the pages the guest and lull wrote).
    pub pss_anon_kib: Option<f64>,
    /// ... of it file-backed (the snapshot's pages and lull's binary, shared).
    pub pss_file_kib: Option<f64>,
    /// Resident pages mapped by this clone alone, KiB (Private_Clean + Private_Dirty).
    pub private_kib: Option<f64>,
    /// Resident pages it shares with other processes, KiB (Shared_Clean + Shared_Dirty).
    pub shared_kib: Option<f64>,
    /// Resident set, KiB.
    pub rss_kib: Option<f64>,
    /// The host's MemAvailable before the fleet minus after it settled, per clone, KiB (other
    /// work on the host moves it too).
    pub mem_available_used_kib: Option<f64>,
    /// CPU time of the clones' lull processes over the window, percent of one host CPU, per
    /// clone.
    pub cpu_pct_per_clone: Option<f64>,
    /// The host's CPUs busy over the window, percent of all of them (100 = every CPU busy).
    pub host_busy_pct: Option<f64>,
    /// The host's load average (1 min) at the end of the window.
    pub load_1m: Option<f64>,
    /// What went wrong, one line each.
    pub failures: Vec<String>,
}

/// The run's parameters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClonesParams {
    /// vCPUs of the VM.
    pub cpus: u32,
    /// Its memory.
    pub memory: String,
    /// The kernel command line the snapshotted VM booted with.
    pub cmdline: String,
    /// How long the fleet ran before the window, s.
    pub settle_s: f64,
    /// The window's length, s.
    pub window_s: f64,
    /// Restores per path and memory mode.
    pub restores: u32,
    /// The command line of this run.
    pub command: String,
}

/// The whole document.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClonesReport {
    /// Always [`CLONES_SCHEMA`].
    pub schema: String,
    /// The host.
    pub host: HostInfo,
    /// The parameters.
    pub params: ClonesParams,
    /// Restore-to-running, per snapshot mode and memory mode.
    pub restores: Vec<RestoreRow>,
    /// The fleets.
    pub fleets: Vec<FleetRow>,
}

fn spread_ms(s: Option<&Spread>) -> String {
    s.map_or_else(
        || "-".to_string(),
        |s| format!("{:.1} / {:.1} (n={})", s.p50, s.max, s.n),
    )
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

/// The tables printed on stdout.
pub fn clones_table(r: &ClonesReport) -> String {
    let mut out = String::from("restore to running, ms (p50 / max)\n");
    out.push_str(&format!(
        "{:<18} {:<6} {:>24} {:>24}\n",
        "mode", "memory", "vm.restore (API)", "lull run --restore"
    ));
    for row in &r.restores {
        out.push_str(&format!(
            "{:<18} {:<6} {:>24} {:>24}\n",
            row.mode,
            row.memory,
            spread_ms(row.api_ms.as_ref()),
            spread_ms(row.cli_ms.as_ref())
        ));
    }
    out.push_str("\nclones running at once, per clone (KiB, % of a host CPU)\n");
    out.push_str(&format!(
        "{:<18} {:<6} {:>6} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>6}\n",
        "mode",
        "memory",
        "clones",
        "running",
        "pss",
        "anon",
        "file",
        "private",
        "shared",
        "avail",
        "restore50",
        "cpu%",
        "busy%"
    ));
    for f in &r.fleets {
        out.push_str(&format!(
            "{:<18} {:<6} {:>6} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>6}\n",
            f.mode,
            f.memory,
            f.clones,
            f.running,
            num(f.pss_kib, 0),
            num(f.pss_anon_kib, 0),
            num(f.pss_file_kib, 0),
            num(f.private_kib, 0),
            num(f.shared_kib, 0),
            num(f.mem_available_used_kib, 0),
            num(f.restore_to_running_ms.map(|s| s.p50), 1),
            num(f.cpu_pct_per_clone, 2),
            num(f.host_busy_pct, 0),
        ));
    }
    for (what, failures) in r
        .restores
        .iter()
        .map(|x| (format!("{} {}", x.mode, x.memory), &x.failures))
        .chain(r.fleets.iter().map(|x| {
            (
                format!("{} {} x{}", x.mode, x.memory, x.clones),
                &x.failures,
            )
        }))
    {
        for f in failures {
            out.push_str(&format!("  {what}: {f}\n"));
        }
    }
    out
}
