//! `lull bench snapshot`'s results: the JSON document (`lull-bench-snapshot/1`, documented in
//! `docs/bench/README.md`) and the table on stdout.

use serde::{Deserialize, Serialize};

use super::host::HostInfo;
use super::report::opt;
use super::spread::Spread;

/// Schema name of the snapshot JSON.
pub const SNAPSHOT_SCHEMA: &str = "lull-bench-snapshot/1";

/// A figure of a row that has no value, and why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Missing {
    /// The row's field name.
    pub figure: String,
    /// Why it has no value.
    pub reason: String,
}

/// One irqchip mode's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SnapshotRow {
    /// `kernel`, `pull`, `push` or `central`.
    pub mode: String,
    /// `vm.pause`: request sent to reply received, ms, over the cycles.
    pub pause_ms: Option<Spread>,
    /// lull's own pause figure: request to every vCPU stopped, us (its log).
    pub lull_pause_us: Option<Spread>,
    /// `vm.resume`: request sent to reply received, ms.
    pub resume_ms: Option<Spread>,
    /// `vm.snapshot`: request sent to reply received, ms.
    pub snapshot_ms: Option<f64>,
    /// lull's own snapshot figure, ms (its log).
    pub lull_snapshot_ms: Option<f64>,
    /// The snapshot directory's apparent size (file lengths), bytes.
    pub snapshot_apparent_bytes: Option<u64>,
    /// The snapshot directory's allocated size (blocks on disk, as `du`), bytes.
    pub snapshot_allocated_bytes: Option<u64>,
    /// Through the API: spawn of `lull run --api-socket` to the reply to `vm.resume` after
    /// `vm.restore` (the vCPUs run again), ms, per restore.
    pub restore_api_ms: Option<Spread>,
    /// The `vm.restore` request alone (sent to reply), ms.
    pub restore_call_ms: Option<Spread>,
    /// From the command line: spawn of `lull run --restore DIR --resume` to the time stamp of
    /// its "VM resumed" log line, ms, per restore.
    pub restore_cli_ms: Option<Spread>,
    /// The guest of the first lull (paused, snapshotted, resumed) passed.
    pub guest_passed: bool,
    /// Restored guests that ran to their end and passed.
    pub restores_passed: u32,
    /// Restores attempted (API and command line each count).
    pub restores_run: u32,
    /// Figures without a value, each with its reason.
    pub missing: Vec<Missing>,
    /// What went wrong (a failed guest, an API error).
    pub failures: Vec<String>,
}

impl SnapshotRow {
    /// Notes that `figure` has no value because of `reason`.
    pub fn miss(&mut self, figure: &str, reason: impl Into<String>) {
        self.missing.push(Missing {
            figure: figure.into(),
            reason: reason.into(),
        });
    }

    /// Whether everything that ran passed.
    pub fn ok(&self) -> bool {
        self.failures.is_empty() && self.guest_passed && self.restores_passed == self.restores_run
    }
}

/// The run's parameters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotParams {
    /// vCPUs of the VM.
    pub cpus: u32,
    /// Guest RAM, MiB.
    pub memory_mib: u64,
    /// The guest ELF.
    pub guest: String,
    /// Its command line.
    pub guest_cmdline: String,
    /// Pause/resume cycles per mode.
    pub reps: u32,
    /// Restores per mode and path (API, command line).
    pub restores: u32,
    /// The modes asked for.
    pub modes: Vec<String>,
}

/// The snapshot JSON document.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotReport {
    /// Always [`SNAPSHOT_SCHEMA`].
    pub schema: String,
    /// The host.
    pub host: HostInfo,
    /// The run's parameters.
    pub params: SnapshotParams,
    /// One row per mode, in run order.
    pub results: Vec<SnapshotRow>,
}

/// `p50/p99/max` with `prec` decimals, or `-`.
fn spread(s: Option<Spread>, prec: usize) -> String {
    s.map_or_else(
        || "-".into(),
        |s| format!("{:.prec$}/{:.prec$}/{:.prec$}", s.p50, s.p99, s.max),
    )
}

/// Bytes as MiB with one decimal, or `-`.
fn mib(b: Option<u64>) -> String {
    opt(b.map(|b| b as f64 / f64::from(1u32 << 20)), 1)
}

/// The table: one line per mode, then one line per missing figure and per failure.
pub fn snapshot_table(report: &SnapshotReport) -> Vec<String> {
    let mut lines = vec![
        format!(
            "{:<8} {:>20} {:>16} {:>20} {:>9} {:>9} {:>15} {:>17} {:>17} {:>9}",
            "mode",
            "pause ms p50/99/max",
            "lull pause us",
            "resume ms p50/99/max",
            "snap ms",
            "lull ms",
            "size MiB al/ap",
            "restore api ms",
            "restore cli ms",
            "guest"
        ),
        format!(
            "{:-<8} {:-<20} {:-<16} {:-<20} {:-<9} {:-<9} {:-<15} {:-<17} {:-<17} {:-<9}",
            "", "", "", "", "", "", "", "", "", ""
        ),
    ];
    for r in &report.results {
        let p50_max = |s: Option<Spread>| {
            s.map_or_else(|| "-".into(), |s| format!("{:.1}/{:.1}", s.p50, s.max))
        };
        lines.push(format!(
            "{:<8} {:>20} {:>16} {:>20} {:>9} {:>9} {:>15} {:>17} {:>17} {:>9}",
            r.mode,
            spread(r.pause_ms, 2),
            spread(r.lull_pause_us, 0),
            spread(r.resume_ms, 2),
            opt(r.snapshot_ms, 1),
            opt(r.lull_snapshot_ms, 0),
            format!(
                "{}/{}",
                mib(r.snapshot_allocated_bytes),
                mib(r.snapshot_apparent_bytes)
            ),
            p50_max(r.restore_api_ms),
            p50_max(r.restore_cli_ms),
            format!(
                "{}+{}/{}",
                if r.guest_passed { "ok" } else { "FAIL" },
                r.restores_passed,
                r.restores_run
            ),
        ));
    }
    for r in &report.results {
        for m in &r.missing {
            lines.push(format!("{} missing {}: {}", r.mode, m.figure, m.reason));
        }
        for f in &r.failures {
            lines.push(format!("{} failed: {f}", r.mode));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_missing_figure_and_failure() {
        let mut row = SnapshotRow {
            mode: "pull".into(),
            pause_ms: Spread::of(vec![0.5, 1.5]),
            guest_passed: true,
            restores_run: 2,
            ..Default::default()
        };
        row.miss("restore_api_ms", "no restore succeeded: see failures");
        row.failures.push("restore 1: guest did not pass".into());
        assert!(!row.ok());
        let report = SnapshotReport {
            schema: SNAPSHOT_SCHEMA.into(),
            host: super::super::host::host_info(),
            params: SnapshotParams {
                cpus: 2,
                memory_mib: 256,
                guest: "pause-timers".into(),
                guest_cmdline: String::new(),
                reps: 2,
                restores: 1,
                modes: vec!["pull".into()],
            },
            results: vec![row],
        };
        let table = snapshot_table(&report).join("\n");
        assert!(table.contains("0.50/1.50/1.50"), "{table}");
        assert!(table.contains("ok+0/2"), "{table}");
        assert!(
            table.contains("pull missing restore_api_ms: no restore succeeded: see failures"),
            "{table}"
        );
        assert!(table.contains("pull failed: restore 1"), "{table}");
    }
}
