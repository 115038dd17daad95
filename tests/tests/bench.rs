//! Integration tests of `lull bench` and its guests (`idle-sim`, `wake-ipi`, `lapic-timer`,
//! `spin`, `hello`, the kit's Linux): they run, every VM passes, and the JSON carries the
//! documented fields. No test asserts a timing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lull_tests::{
    kit_dir, kit_file, kvm_trial, read_json, read_report, run_lull, Arguments, Failed, RunResult,
    Trial,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(300);

fn temp_dir(name: &str) -> Result<PathBuf, Failed> {
    let dir = std::env::temp_dir().join(format!("lull-bench-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

fn arg(p: &std::path::Path) -> String {
    p.display().to_string()
}

fn idle_sim_reports_its_statistics() -> Result<(), Failed> {
    let kernel = arg(&kit_file("guests/idle-sim.elf")?);
    for irqchip in ["kernel", "user"] {
        let r = run_lull(
            &[
                "run",
                "--kernel",
                &kernel,
                "--cpus",
                "2",
                "--irqchip",
                irqchip,
                "--cmdline",
                "duration_ms=1000 mix=50:1,50:2-20 ipi_pct=50",
            ],
            DEADLINE,
        )?;
        r.expect_code(1)?;
        for line in [
            "idle-sim: cpu 0: events ",
            "idle-sim: cpu 1: events ",
            "idle-sim: lateness_ns n=",
            "idle-sim: hist lateness ",
            "idle-sim: ipi_ns n=",
            "idle-sim: PASS",
        ] {
            r.expect_stdout(line)?;
        }
    }
    Ok(())
}

fn density_writes_the_documented_json_and_plot() -> Result<(), Failed> {
    kit_file("guests/idle-sim.elf")?;
    let dir = temp_dir("density")?;
    let json = dir.join("density.json");
    let svg = dir.join("density.svg");
    let r = run_lull(
        &[
            "bench",
            "density",
            "--vms",
            "1,2",
            "--cpus",
            "2",
            "--duration",
            "3s",
            "--modes",
            "kernel,pull",
            "--kit",
            &arg(&kit_dir()),
            "--json",
            &arg(&json),
            "--plot",
            &arg(&svg),
            "--work-dir",
            &arg(&dir),
        ],
        DEADLINE,
    )?;
    r.expect_code(0)?;
    r.expect_stdout("wake/ev")?;
    let v = read_json(&json)?;
    if v["schema"] != "lull-bench-density/2" || v["params"]["cpus_per_vm"] != 2 {
        return Err(format!("unexpected header: {v}").into());
    }
    check_density_rows(&v)?;
    let plot = std::fs::read_to_string(&svg).map_err(|e| e.to_string())?;
    if !plot.starts_with("<svg") || !plot.contains("pull") {
        return Err("the plot is not an SVG with the modes".into());
    }
    replot_matches(&dir, &json, &r, plot)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The density JSON's rows: 2 modes x 2 counts, each with every documented field, every VM
/// passed with timer events, RSS sampled.
fn check_density_rows(v: &Value) -> Result<(), Failed> {
    let rows = v["results"].as_array().cloned().unwrap_or_default();
    if rows.len() != 4 {
        return Err(format!("expected 4 rows (2 modes x 2 counts), got {}", rows.len()).into());
    }
    for row in &rows {
        for field in [
            "mode",
            "vms",
            "vcpus",
            "vms_ok",
            "window_s",
            "host_cpu_percent_per_vcpu",
            "host_cpu_percent_total",
            "host_wakeups_per_vcpu_s",
            "host_ctxt_switches_per_vcpu_s",
            "guest_timer_events_per_vcpu_s",
            "host_wakeups_per_timer_event",
            "halted_vcpu_wakeups_per_timer_event",
            "global_timer_wakeups",
            "global_timer_fires",
            "vm_exits_per_vcpu_s",
            "lateness",
            "ipi_latency",
            "early_interrupts",
            "rss_kib_per_vm",
            "guest_ram_rss_kib_per_vm",
            "vmm_rss_kib_per_vm",
            "failures",
        ] {
            if row.get(field).is_none() {
                return Err(format!("row lacks {field}: {row}").into());
            }
        }
        if row["vms_ok"] != row["vms"] || row["lateness"]["n"].as_u64().unwrap_or(0) == 0 {
            return Err(format!("a VM failed or reported no timer events: {row}").into());
        }
        if row["rss_kib_per_vm"].as_f64().unwrap_or(0.0) <= 0.0 {
            return Err(format!("no RSS sampled: {row}").into());
        }
    }
    Ok(())
}

/// The JSON reads back: `--from-json` prints the same table as run `r` and draws the same
/// `plot`, without running anything.
fn replot_matches(dir: &Path, json: &Path, r: &RunResult, plot: String) -> Result<(), Failed> {
    let again = dir.join("again.svg");
    let r2 = run_lull(
        &[
            "bench",
            "density",
            "--from-json",
            &arg(json),
            "--plot",
            &arg(&again),
        ],
        Duration::from_secs(30),
    )?;
    r2.expect_code(0)?;
    let table = |out: &str| {
        out.lines()
            .filter(|l| !l.starts_with("density:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if table(&r2.stdout) != table(&r.stdout) || std::fs::read_to_string(&again).ok() != Some(plot) {
        return Err(r2.failure("--from-json did not reproduce the table and the plot"));
    }
    Ok(())
}

/// Runs `lull bench EXPERIMENT ARGS` (see [`lull_tests::run_bench`]).
fn run_bench(experiment: &str, args: &[&str]) -> Result<(Value, RunResult), Failed> {
    lull_tests::run_bench(
        &format!("bench-{experiment}-run"),
        experiment,
        args,
        DEADLINE,
    )
}

/// The array `key` of a report (empty if it has none).
fn rows(v: &Value, key: &str) -> Vec<Value> {
    v[key].as_array().cloned().unwrap_or_default()
}

fn wakeup_measures_each_mode() -> Result<(), Failed> {
    kit_file("guests/wake-ipi.elf")?;
    let args = [
        "--count",
        "10",
        "--modes",
        "kernel,user-off",
        "--delays",
        "1,50",
    ];
    let (v, _) = run_bench("wakeup", &args)?;
    let results = rows(&v, "results");
    if v["schema"] != "lull-bench-wakeup/1" || results.len() != 4 {
        return Err(format!("unexpected wake-up report: {v}").into());
    }
    for row in &results {
        if row["latency"]["n"] != 10 || !row["failure"].is_null() {
            return Err(format!("a wake-up run failed: {row}").into());
        }
    }
    Ok(())
}

fn density_counts_central_timer_thread_fires() -> Result<(), Failed> {
    kit_file("guests/idle-sim.elf")?;
    let args = [
        "--vms",
        "1",
        "--duration",
        "2s",
        "--modes",
        "central,pull",
        "--global-timers",
        "4,period=1",
    ];
    let (v, _) = run_bench("density", &args)?;
    let results = rows(&v, "results");
    if results.len() != 2 {
        return Err(format!("expected 2 rows, got {v}").into());
    }
    // Global timers fire in every model: on the vCPUs (pull) or on central's timer thread.
    for row in &results {
        if row["global_timer_fires"].as_u64().unwrap_or(0) == 0 {
            return Err(format!("{} counted no global timer fires: {row}", row["mode"]).into());
        }
    }
    Ok(())
}

/// `global-timers`: both cases and every model in one run. The load fires in every model (on
/// the vCPUs, or on central's timer thread), and pull, with vCPU 0 spinning, wakes no blocked
/// vCPU for a global timer: the running vCPU expires them all.
fn global_timers_runs_every_case_and_model() -> Result<(), Failed> {
    kit_file("guests/idle-sim.elf")?;
    let args = ["--duration", "2s", "--global-timers", "4,period=1"];
    let (v, r) = run_bench("global-timers", &args)?;
    let results = rows(&v, "results");
    if v["schema"] != "lull-bench-global-timers/1" || results.len() != 6 {
        return Err(format!("expected 6 rows of lull-bench-global-timers/1: {v}").into());
    }
    for row in &results {
        if row["passed"] != true || row["global_fires"].as_u64().unwrap_or(0) == 0 {
            return Err(format!("a run failed or fired no global timer: {row}").into());
        }
    }
    // While a vCPU runs, pull expires the global load on it and wakes no halted vCPU for it;
    // push wakes the arming vCPU for each of its own timers that falls in a halt, running
    // vCPU or not. Only before the busy vCPU starts spinning and after it stops (the guest's
    // start and its final report, longer on a loaded host) do both vCPUs halt, and a global
    // expiry then must wake one. So, counted in the same run: pull with a vCPU running wakes
    // halted vCPUs for fewer of its expiries than pull with none running, and for no more of
    // them than push does. (The rate itself, 3 of 9,602 on a loaded host, is a benchmark
    // figure: docs/PERFORMANCE.md.)
    let per_expiry = |case: &str, model: &str| -> Result<f64, Failed> {
        results
            .iter()
            .find(|row| row["case"] == case && row["model"] == model)
            .and_then(|row| row["global_timer_wakeups_per_expiry"].as_f64())
            .ok_or_else(|| format!("no {case} {model} row with wake-ups per expiry: {v}").into())
    };
    let (pull, push) = (
        per_expiry("one-busy", "pull")?,
        per_expiry("one-busy", "push")?,
    );
    let pull_all_idle = per_expiry("all-idle", "pull")?;
    if pull > push || pull >= pull_all_idle {
        return Err(format!(
            "one-busy: pull woke halted vCPUs for {pull:.4} of its global expiries (push \
             {push:.4}, pull with every vCPU idle {pull_all_idle:.4}): the running vCPU \
             should expire them"
        )
        .into());
    }
    r.expect_stdout("one-busy: global fires per second differ by")?;
    Ok(())
}

/// `density --guest linux`: one VM of the kit's Linux running its idle workload under the
/// pull model; the row comes from a window inside the workload, so lull's exit rate in it is
/// far below that of the whole run, whose boot emulates the entire kernel's start-up (about
/// 600 exits per vCPU-second here against tens when idle).
fn density_linux_measures_inside_the_workload() -> Result<(), Failed> {
    kit_file("linux/vmlinux")?;
    let dir = temp_dir("density-linux")?;
    let json = dir.join("report.json");
    let (kit, json_arg, dir_arg) = (arg(&kit_dir()), arg(&json), arg(&dir));
    let args = [
        "bench",
        "density",
        "--guest",
        "linux",
        "--vms",
        "1",
        "--duration",
        "3s",
        "--modes",
        "pull",
        "--workload",
        "idle",
        "--kit",
        &kit,
        "--json",
        &json_arg,
        "--work-dir",
        &dir_arg,
    ];
    let r = run_lull(&args, Duration::from_secs(600))?;
    r.expect_code(0)?;
    r.expect_stdout("halt/loc")?;
    let v = read_json(&json)?;
    let results = rows(&v, "results");
    let [row] = results.as_slice() else {
        return Err(format!("expected one row: {v}").into());
    };
    let linux = &row["linux"];
    if row["vms_ok"] != 1 || linux["workload"] != "idle" || v["params"]["linux"].is_null() {
        return Err(format!("unexpected row: {row}").into());
    }
    let window = row["window_s"].as_f64().unwrap_or(0.0);
    let workload = linux["workload_s"].as_f64().unwrap_or(0.0);
    if !(window > 0.0 && window < workload) || linux["window_note"] != Value::Null {
        return Err(format!("the window is not inside the workload: {row}").into());
    }
    if row["guest_timer_events_per_vcpu_s"].as_f64().unwrap_or(0.0) <= 0.0
        || row["halted_vcpu_wakeups_per_timer_event"].is_null()
    {
        return Err(format!("no guest or halted-vCPU counts: {row}").into());
    }
    let whole = read_report(&dir.join("pull-idle-n1-vm0.json"))?;
    let vcpu_s = whole.run_time_ms as f64 / 1000.0 * 2.0;
    let exits = whole.kvm.as_ref().and_then(|k| k.get("exits").copied());
    let whole_rate = exits.unwrap_or(0) as f64 / vcpu_s;
    let window_rate = row["vm_exits_per_vcpu_s"].as_f64().unwrap_or(f64::MAX);
    // The boot emulates the whole kernel's start-up at far more exits per second than the
    // idle workload makes (a loaded host slows both), so a window inside the workload has a
    // lower rate than the run it is part of; one that counted the boot would not.
    if window_rate >= whole_rate {
        return Err(format!(
            "the window's {window_rate:.1} exits/vCPU/s are not below the run's \
             {whole_rate:.1}: the boot was counted? {row}"
        )
        .into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn timer_modes_measures_every_model() -> Result<(), Failed> {
    kit_file("guests/lapic-timer.elf")?;
    let (v, r) = run_bench("timer-modes", &["--count", "40", "--reps", "1"])?;
    r.expect_stdout("lull_ex/ev")?;
    let results = rows(&v, "results");
    let modes: Vec<&str> = results.iter().filter_map(|r| r["mode"].as_str()).collect();
    if v["schema"] != "lull-bench-timer-modes/1" || modes != ["kernel", "pull", "push", "central"] {
        return Err(format!("unexpected timer-modes report: {v}").into());
    }
    for row in &results {
        if row["reps_ok"] != 1 || row["cpu_us_per_event"].as_f64().is_none() {
            return Err(format!("a timer-modes run failed: {row}").into());
        }
        // In the user irqchip every timer event exits to lull at least for its HLT.
        let lull_exits = row["lull_exits_per_event"].as_f64().unwrap_or(0.0);
        if row["mode"] != "kernel" && lull_exits < 1.0 {
            return Err(format!("a user-irqchip event without an exit to lull: {row}").into());
        }
    }
    Ok(())
}

fn latency_measures_both_patterns_against_kernel() -> Result<(), Failed> {
    kit_file("guests/idle-sim.elf")?;
    let args = [
        "--duration",
        "1s",
        "--reps",
        "1",
        "--modes",
        "kernel,pull",
        "--pv",
        "none,eoi",
    ];
    let (v, r) = run_bench("latency", &args)?;
    r.expect_stdout("p50/kern")?;
    let results = rows(&v, "results");
    if v["schema"] != "lull-bench-latency/1" || results.len() != 8 {
        return Err(format!("unexpected latency report: {v}").into());
    }
    for row in &results {
        // Every run passed (a lost interrupt leaves a halted guest to time out), none early.
        if row["reps_ok"] != 1 || row["early"] != 0 || !rows(row, "failures").is_empty() {
            return Err(format!("a latency run failed: {row}").into());
        }
        if row["events"].as_f64().unwrap_or(0.0) < 1.0 || row["p50_vs_kernel"].is_null() {
            return Err(format!("a latency row without figures: {row}").into());
        }
        // Both irqchips offer PV EOI: a row that asked for it used it.
        if row["pv_eoi_used"] != (row["pv"] == "eoi") {
            return Err(format!("PV EOI not used as asked: {row}").into());
        }
    }
    Ok(())
}

fn idle_manager_measures_injection_and_quota() -> Result<(), Failed> {
    kit_file("guests/spin.elf")?;
    let args = ["--duration", "1s", "--percents", "25", "--vms", "2"];
    let (v, _) = run_bench("idle-manager", &args)?;
    let (injection, quota) = (rows(&v, "injection"), rows(&v, "quota"));
    if v["schema"] != "lull-bench-idle-manager/2" || injection.len() != 1 || quota.len() != 2 {
        return Err(format!("unexpected idle-manager report: {v}").into());
    }
    if v["power_baseline"]["value"]["seconds"]
        .as_f64()
        .unwrap_or(0.0)
        <= 0.0
    {
        return Err(format!("no power baseline: {}", v["power_baseline"]).into());
    }
    // Every run has its power: throughput per CPU-second always (lull reports its threads'
    // CPU time), per watt where RAPL is readable, else null with the reader's reason.
    let rapl = std::path::Path::new("/sys/class/powercap").exists();
    let runs = std::iter::once(&v["base_power"])
        .chain(injection.iter().map(|r| &r["power"]))
        .chain(quota.iter().map(|r| &r["power"]));
    for p in runs {
        if p["iterations_per_cpu_second"]["value"]
            .as_f64()
            .unwrap_or(0.0)
            <= 0.0
        {
            return Err(format!("no throughput per CPU-second: {p}").into());
        }
        let per_watt = &p["iterations_per_joule"];
        let explained = per_watt["value"].is_null()
            && per_watt["reason"]
                .as_str()
                .is_some_and(|r| r.contains("RAPL"));
        if !rapl && !explained {
            return Err(format!("per watt should be null with its reason here: {p}").into());
        }
        if rapl && per_watt["value"].is_null() && per_watt["reason"].is_null() {
            return Err(format!("per watt neither measured nor explained: {p}").into());
        }
    }
    if injection[0]["achieved_percent"].as_f64().unwrap_or(0.0) <= 0.0 {
        return Err(format!("no idle was injected: {}", injection[0]).into());
    }
    for row in &quota {
        let throttled = rows(row, "throttled_periods");
        if throttled.len() != 2 || throttled.iter().any(|t| t.as_u64().unwrap_or(0) == 0) {
            return Err(
                format!("a spinning VM under a 50% quota was never throttled: {row}").into(),
            );
        }
    }
    Ok(())
}

fn boot_times_hello_and_reads_lull_memory() -> Result<(), Failed> {
    kit_file("guests/hello.elf")?;
    kit_file("linux/vmlinux")?;
    let args = [
        "--reps",
        "2",
        "--linux-reps",
        "0",
        "--qemu",
        "/nonexistent/qemu",
    ];
    let (v, _) = run_bench("boot", &args)?;
    if v["schema"] != "lull-bench-boot/1" || v["qemu"] != false {
        return Err(format!("unexpected boot report: {v}").into());
    }
    let results = rows(&v, "results");
    let hello = results.iter().find(|r| r["name"] == "hello lull");
    if hello.map(|h| rows(h, "runs_s").len()) != Some(2) {
        return Err(format!("expected two hello runs: {v}").into());
    }
    if v["rss"]["lull_kib"].as_u64().unwrap_or(0) == 0 {
        return Err(format!("lull's memory was not read: {v}").into());
    }
    Ok(())
}

/// `lull bench clones` on the kit's Linux: one boot, a restore by each path and memory mode,
/// and fleets of two clones, mapped and copied, all still running at the end of the window;
/// the mapped clones hold less than half the copied ones' memory of their own.
fn clones_restores_a_fleet_that_shares_its_snapshot() -> Result<(), Failed> {
    kit_file("linux/vmlinux")?;
    // The kit's Linux boots in 30-400 s here.
    let (v, r) = lull_tests::run_bench(
        "bench-clones-run",
        "clones",
        &[
            "--modes",
            "pull",
            "--clones",
            "2",
            "--restores",
            "1",
            "--settle",
            "2s",
            "--window",
            "1s",
            "--fleet-memory",
            "map,copy",
        ],
        Duration::from_secs(900),
    )?;
    if v["schema"] != "lull-bench-clones/1" || !r.stdout.contains("restore to running") {
        return Err(format!("not a clones report:\n{}", r.stdout).into());
    }
    let restores = v["restores"].as_array().cloned().unwrap_or_default();
    let memories: Vec<&str> = restores
        .iter()
        .filter_map(|r| r["memory"].as_str())
        .collect();
    if memories != ["map", "copy"] {
        return Err(format!("restore rows: {memories:?}").into());
    }
    for row in &restores {
        for path in ["api_ms", "cli_ms"] {
            if row[path]["n"] != 1 || row["failures"].as_array().is_none_or(|f| !f.is_empty()) {
                return Err(format!("a restore by {path} did not run: {row}").into());
            }
        }
    }
    let (mapped, copied) = (&v["fleets"][0], &v["fleets"][1]);
    for fleet in [mapped, copied] {
        if fleet["clones"] != 2 || fleet["running"] != 2 {
            return Err(format!("the fleet's clones did not all run: {fleet}").into());
        }
    }
    let kib = |fleet: &Value, f: &str| fleet[f].as_f64().unwrap_or(0.0);
    if mapped["memory"] != "map" || kib(mapped, "pss_kib") <= 0.0 {
        return Err(format!("no mapped fleet first: {mapped}").into());
    }
    // The mapped clones' own (anonymous) memory is what they wrote; the copied ones hold the
    // snapshot's data besides.
    if kib(mapped, "pss_anon_kib") * 2.0 >= kib(copied, "pss_anon_kib") {
        return Err(format!("mapping saved no memory: {mapped} against {copied}").into());
    }
    Ok(())
}

/// `--clones`: one boot of the kit's Linux, two clones restored from its snapshot; each clone's
/// workload starts its window again after its own restore (the fleet waits for its
/// "restored count=1": without the restore-count port, or a workload that does not read it,
/// no clone is ever seen to start), passes, and the row gives restore-to-running per clone and
/// memory as the host sees it.
fn density_linux_clones_measure_each_clone_after_its_restore() -> Result<(), Failed> {
    kit_file("linux/vmlinux")?;
    let (v, r) = lull_tests::run_bench(
        "bench-density-clones",
        "density",
        &[
            "--guest",
            "linux",
            "--clones",
            "--modes",
            "pull",
            "--workload",
            "timers",
            "--vms",
            "2",
            "--duration",
            "3s",
        ],
        Duration::from_secs(900),
    )?;
    let row = &v["results"][0];
    if row["vms"] != 2
        || row["vms_ok"] != 2
        || row["failures"].as_array().is_none_or(|f| !f.is_empty())
    {
        return Err(format!("not every clone passed: {row}\n{}", r.stdout).into());
    }
    let clones = &row["linux"]["clones"];
    if clones["restore_to_running_ms"]["n"] != 2 {
        return Err(format!("no restore-to-running for each clone: {clones}").into());
    }
    let kib = |f: &str| clones[f].as_f64().unwrap_or(0.0);
    // Mapped clones share the snapshot's pages: each one's PSS is below what it has resident.
    if kib("pss_kib_per_vm") <= 0.0 || kib("shared_kib_per_vm") <= 0.0 {
        return Err(format!("no memory figures, or nothing shared: {clones}").into());
    }
    if row["lateness"]["n"].as_u64().unwrap_or(0) == 0
        || row["window_s"].as_f64().unwrap_or(0.0) <= 0.0
    {
        return Err(format!("no lateness or no window: {row}").into());
    }
    if !r.stdout.contains("clones: restore-to-running") {
        return Err(format!("the table has no clone line:\n{}", r.stdout).into());
    }
    Ok(())
}

fn bench_help_names_the_experiments() -> Result<(), Failed> {
    let r = run_lull(&["bench", "--help"], Duration::from_secs(30))?;
    r.expect_code(0)?;
    r.expect_stdout("density")?;
    for experiment in [
        "wakeup",
        "timer-modes",
        "idle-manager",
        "boot",
        "global-timers",
        "latency",
        "snapshot",
        "clones",
    ] {
        r.expect_stdout(experiment)?;
    }
    let r = run_lull(&["bench", "density", "--help"], Duration::from_secs(30))?;
    r.expect_code(0)?;
    for flag in [
        "--vms",
        "--modes",
        "--duration",
        "--global-timers",
        "--json",
        "--plot",
        "--workload",
        "--boot-spread",
        "--clones",
    ] {
        r.expect_stdout(flag)?;
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test(
            "bench_help_names_the_experiments",
            bench_help_names_the_experiments,
        ),
        kvm_trial(
            "idle_sim_reports_its_statistics",
            idle_sim_reports_its_statistics,
        ),
        kvm_trial(
            "density_writes_the_documented_json_and_plot",
            density_writes_the_documented_json_and_plot,
        ),
        kvm_trial("wakeup_measures_each_mode", wakeup_measures_each_mode),
        kvm_trial(
            "density_counts_central_timer_thread_fires",
            density_counts_central_timer_thread_fires,
        ),
        kvm_trial(
            "global_timers_runs_every_case_and_model",
            global_timers_runs_every_case_and_model,
        ),
        kvm_trial(
            "density_linux_measures_inside_the_workload",
            density_linux_measures_inside_the_workload,
        ),
        kvm_trial(
            "density_linux_clones_measure_each_clone_after_its_restore",
            density_linux_clones_measure_each_clone_after_its_restore,
        ),
        kvm_trial(
            "clones_restores_a_fleet_that_shares_its_snapshot",
            clones_restores_a_fleet_that_shares_its_snapshot,
        ),
        kvm_trial(
            "timer_modes_measures_every_model",
            timer_modes_measures_every_model,
        ),
        kvm_trial(
            "latency_measures_both_patterns_against_kernel",
            latency_measures_both_patterns_against_kernel,
        ),
        kvm_trial(
            "idle_manager_measures_injection_and_quota",
            idle_manager_measures_injection_and_quota,
        ),
        kvm_trial(
            "boot_times_hello_and_reads_lull_memory",
            boot_times_hello_and_reads_lull_memory,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
