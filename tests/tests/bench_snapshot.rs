//! Integration test of `lull bench snapshot`, run briefly: the JSON carries every documented
//! figure, each with a value or named in `missing` with a reason; the guests passed; the
//! snapshot has a size; in every mode each restore ran and its guest passed (a restore lull
//! refuses fails the bench). No test asserts a timing.

use std::time::Duration;

use lull_tests::{kit_file, kvm_trial, run_bench, Arguments, Failed};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(600);

/// Figures that are a spread (`n`, `p50`, `p99`, `max`) or `null`.
const SPREADS: [&str; 6] = [
    "pause_ms",
    "lull_pause_us",
    "resume_ms",
    "restore_api_ms",
    "restore_call_ms",
    "restore_cli_ms",
];
/// Figures that are one number or `null`.
const NUMBERS: [&str; 4] = [
    "snapshot_ms",
    "lull_snapshot_ms",
    "snapshot_apparent_bytes",
    "snapshot_allocated_bytes",
];

/// Checks one row's invariants: every figure present or missing with a reason, spreads
/// ordered, the guests passed, sizes above 0, every restore ran and passed.
fn check_row(row: &Value, reps: u64, restores: u64) -> Result<(), Failed> {
    let fail = |why: &str| -> Result<(), Failed> { Err(format!("{why}: {row}").into()) };
    if row["guest_passed"] != true || !row["failures"].as_array().is_some_and(Vec::is_empty) {
        return fail("the guest failed");
    }
    let missing = row["missing"].as_array().ok_or("no missing list")?;
    let reason_for = |figure: &str| {
        missing
            .iter()
            .find(|m| m["figure"] == figure)
            .and_then(|m| m["reason"].as_str())
            .filter(|r| !r.is_empty())
    };
    for figure in SPREADS.iter().chain(&NUMBERS) {
        let v = &row[*figure];
        match (v.is_null(), reason_for(figure)) {
            (true, None) => return fail(&format!("{figure} is null without a reason")),
            (false, Some(_)) => return fail(&format!("{figure} has a value and a reason")),
            _ => {}
        }
    }
    for figure in SPREADS {
        let s = &row[figure];
        if s.is_null() {
            continue;
        }
        let (p50, p99, max) = (s["p50"].as_f64(), s["p99"].as_f64(), s["max"].as_f64());
        let ordered =
            matches!((p50, p99, max), (Some(a), Some(b), Some(c)) if 0.0 <= a && a <= b && b <= c);
        if !ordered || s["n"].as_u64().unwrap_or(0) == 0 {
            return fail(&format!("{figure} is not an ordered spread"));
        }
    }
    // One sample per cycle (lull logs one more pause: the one before the snapshot).
    if row["pause_ms"]["n"] != reps || row["resume_ms"]["n"] != reps {
        return fail("not one pause and one resume figure per cycle");
    }
    if row["lull_pause_us"]["n"] != reps + 1 {
        return fail("lull's log has not one pause line per pause");
    }
    for size in ["snapshot_apparent_bytes", "snapshot_allocated_bytes"] {
        if row[size].as_u64().unwrap_or(0) == 0 {
            return fail(&format!("{size} is not above 0"));
        }
    }
    // 64 MiB of guest memory: the apparent size holds it all.
    if row["snapshot_apparent_bytes"].as_u64().unwrap_or(0) < 64 << 20 {
        return fail("the snapshot is smaller than the guest's memory");
    }
    // Every mode restores (API and CLI): every restore ran and passed, one figure each. A
    // refused restore is a failure of the bench, never a figure left out.
    let (run, passed) = (&row["restores_run"], &row["restores_passed"]);
    if *run != 2 * restores || passed != run {
        return fail("not every restore of the snapshot ran and passed");
    }
    if row["restore_api_ms"]["n"] != restores || row["restore_cli_ms"]["n"] != restores {
        return fail("not one figure per restore");
    }
    Ok(())
}

fn snapshot_bench_reports_every_figure_or_why_not() -> Result<(), Failed> {
    kit_file("guests/pause-timers.elf")?;
    let (reps, restores) = (5u64, 1u64);
    let (reps_arg, restores_arg) = (reps.to_string(), restores.to_string());
    let args = [
        "--reps",
        &reps_arg,
        "--restores",
        &restores_arg,
        "--count",
        "100",
        "--memory",
        "64M",
        "--modes",
        "kernel,pull",
    ];
    let (v, r) = run_bench("snapshot", "snapshot", &args, DEADLINE)?;
    r.expect_stdout("restore cli ms")?;
    let results = v["results"].as_array().ok_or("no results")?;
    if v["schema"] != "lull-bench-snapshot/1"
        || results.len() != 2
        || results[0]["mode"] != "kernel"
        || results[1]["mode"] != "pull"
        || v["params"]["memory_mib"] != 64
    {
        return Err(format!("unexpected snapshot report: {v}").into());
    }
    for row in results {
        check_row(row, reps, restores)?;
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![kvm_trial(
        "snapshot_bench_reports_every_figure_or_why_not",
        snapshot_bench_reports_every_figure_or_why_not,
    )];
    libtest_mimic::run(&args, trials).exit();
}
