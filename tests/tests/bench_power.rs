//! Integration tests of `lull bench density`'s power readings and of `--max-vms` (issue 28):
//! the JSON carries a no-VM baseline, every power figure is a value or `null` with its reason,
//! and a search reports every step with verdicts that agree with the step's own figures. No
//! test asserts a timing or a load-dependent figure (the host is shared and may never idle).

use std::time::Duration;

use lull_tests::{kit_file, kvm_trial, run_bench, Arguments, Failed};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(300);

/// Runs `lull bench density ARGS` on 1-vCPU VMs of idle-sim for 2 s per run, modes kernel
/// and pull; returns the JSON report and stdout.
fn density(name: &str, args: &[&str]) -> Result<(Value, String), Failed> {
    kit_file("guests/idle-sim.elf")?;
    let mut all = vec!["--cpus", "1", "--duration", "2s", "--modes", "kernel,pull"];
    all.extend_from_slice(args);
    let (v, r) = run_bench(&format!("bench-power-{name}"), "density", &all, DEADLINE)?;
    Ok((v, r.stdout))
}

/// A reading is a value or a reason, never both nor neither.
fn reading<'a>(v: &'a Value, what: &str) -> Result<Option<&'a Value>, Failed> {
    match (&v["value"], &v["reason"]) {
        (Value::Null, Value::String(_)) => Ok(None),
        (value, Value::Null) if !value.is_null() => Ok(Some(value)),
        _ => Err(format!("{what} is not a value or a reason: {v}").into()),
    }
}

/// A density row's power figures `p` (`cpuidle`: this host's CPUs have idle states; `rapl`:
/// it has RAPL): every figure a value or a reason, the idle figures as the host allows, no
/// energy without RAPL, no meter reading unasked. Returns the window's idle exits per second.
fn row_power(p: &Value, cpuidle: bool, rapl: bool) -> Result<f64, Failed> {
    let w =
        reading(&p["window"], "power.window")?.ok_or_else(|| format!("no power window: {p}"))?;
    if w["seconds"].as_f64().unwrap_or(0.0) <= 0.0 {
        return Err(format!("an empty power window: {w}").into());
    }
    let exits = if cpuidle {
        idle_exits_measured(p, w)?
    } else {
        idle_figures_say_why(p, w)?;
        0.0
    };
    for f in [
        "watts_per_vm",
        "watts_per_vcpu",
        "joules_per_vm",
        "joules_per_vcpu",
        "meter_watts_per_vm",
        "idle_exits_per_vcpu_s",
        "host_wakeups_per_vcpu_s",
        "residency",
        "host_wakeups_per_timer_event",
        "local_timer_irqs_per_s",
        "resched_irqs_per_s",
        "vmm_context_switches_per_s",
    ] {
        reading(&p[f], f)?;
    }
    // Without RAPL, energy is null with the reader's reason; without a meter, so is it.
    let energy = reading(&p["watts_per_vm"], "watts_per_vm")?;
    if !rapl
        && (energy.is_some()
            || !p["watts_per_vm"]["reason"]
                .as_str()
                .unwrap_or("")
                .contains("RAPL"))
    {
        return Err(format!("energy should be null with a reason here: {p}").into());
    }
    if reading(&p["meter_watts_per_vm"], "meter")?.is_some() {
        return Err(format!("a meter reading without --power-meter: {p}").into());
    }
    Ok(exits)
}

/// With cpuidle states: the window `w`'s idle exits and states are read (the exits may be 0
/// in one window of a busy host; the caller wants them above 0 in one of the windows), and the
/// host's wake-ups are counted as idle exits. Returns the exits per second.
fn idle_exits_measured(p: &Value, w: &Value) -> Result<f64, Failed> {
    let exits = reading(&w["idle_exits_per_s"], "idle_exits_per_s")?
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("no host idle exits: {w}"))?;
    let states = w["idle"]["value"]["states"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if exits < 0.0 || states.is_empty() {
        return Err(format!("idle states not measured: {w}").into());
    }
    reading(&p["idle_exits_per_vcpu_s"], "idle exits")?
        .ok_or_else(|| format!("idle exits above the baseline missing: {p}"))?;
    if p["host_wakeups_source"] != "cpuidle idle exits" {
        return Err(format!("host wake-ups not counted as idle exits: {p}").into());
    }
    Ok(exits)
}

/// Without cpuidle states: the host's wake-ups fall back to its LOC + RES + CAL interrupts,
/// named so, and every idle figure is null with the reason.
fn idle_figures_say_why(p: &Value, w: &Value) -> Result<(), Failed> {
    reading(&p["host_wakeups_per_vcpu_s"], "host_wakeups_per_vcpu_s")?
        .ok_or_else(|| format!("no host wake-up proxy without cpuidle: {p}"))?;
    let source = p["host_wakeups_source"].as_str().unwrap_or("");
    if !source.contains("LOC+RES+CAL") {
        return Err(format!("the wake-up proxy is not named: {p}").into());
    }
    for (figure, what) in [
        (&w["idle_exits_per_s"], "idle_exits_per_s"),
        (&w["idle"], "idle"),
        (&p["idle_exits_per_vcpu_s"], "idle_exits_per_vcpu_s"),
    ] {
        let why = figure["reason"].as_str().unwrap_or("");
        if reading(figure, what)?.is_some() || !why.contains("cpuidle") {
            return Err(format!(
                "{what}: this host has no cpuidle states, want null and the reason: {p}"
            )
            .into());
        }
    }
    Ok(())
}

fn density_reports_power_against_a_baseline() -> Result<(), Failed> {
    let (v, stdout) = density("density", &["--vms", "1"])?;
    if v["schema"] != "lull-bench-density/2" {
        return Err(format!("schema {}", v["schema"]).into());
    }
    let base = reading(&v["power_baseline"], "power_baseline")?
        .ok_or_else(|| format!("no baseline window: {}", v["power_baseline"]))?;
    if base["seconds"].as_f64().unwrap_or(0.0) <= 0.0 {
        return Err(format!("an empty baseline: {base}").into());
    }
    let rows = v["results"].as_array().cloned().unwrap_or_default();
    if rows.len() != 2 {
        return Err(format!("expected 2 rows, got {}", rows.len()).into());
    }
    let rapl = std::path::Path::new("/sys/class/powercap").exists();
    // Where this host's CPUs have cpuidle states, some window (the baseline's, a row's) saw
    // them left: a busy host may stay busy for one window, not for three. Where they have
    // none (`cpuidle driver none`), every idle figure is null with the reason.
    let cpuidle = std::path::Path::new("/sys/devices/system/cpu/cpu0/cpuidle/state0").is_dir();
    let mut most_exits = base["idle_exits_per_s"]["value"].as_f64().unwrap_or(0.0);
    for row in &rows {
        most_exits = most_exits.max(row_power(&row["power"], cpuidle, rapl)?);
    }
    if cpuidle && most_exits <= 0.0 {
        return Err(format!("no host idle exit in the baseline nor in any row: {v}").into());
    }
    if !stdout.contains("idlx/v/s") || !stdout.contains("power baseline (no VM") {
        return Err(format!("no power columns or baseline line in the table:\n{stdout}").into());
    }
    Ok(())
}

/// One step of a `--max-vms` search: its bounds, each verdict its figure against its limit
/// (the lateness limit `lateness_limit` ms, the figure the row's p99), the step met iff every
/// verdict is; whether it met.
fn check_step(s: &Value, lateness_limit: f64) -> Result<bool, Failed> {
    let verdicts = s["verdicts"].as_array().cloned().unwrap_or_default();
    let bounds: Vec<&str> = verdicts
        .iter()
        .filter_map(|x| x["bound"].as_str())
        .collect();
    if bounds != ["lateness_p99", "host_busy", "vms_ok"] {
        return Err(format!("unexpected bounds {bounds:?}").into());
    }
    for x in &verdicts {
        let met = x["figure"]
            .as_f64()
            .is_some_and(|f| f <= x["limit"].as_f64().unwrap_or(-1.0));
        if x["met"].as_bool() != Some(met) {
            return Err(format!("verdict disagrees with its figure: {x}").into());
        }
    }
    let lateness = &verdicts[0];
    if lateness["limit"]
        .as_f64()
        .is_none_or(|l| (l - lateness_limit).abs() > 1e-6)
    {
        return Err(format!("lateness bound is not {lateness_limit} ms: {lateness}").into());
    }
    let p99_ms = s["row"]["lateness"]["p99_ns"].as_f64().unwrap_or(-1.0) / 1e6;
    if s["row"]["lateness"]["n"].as_u64().unwrap_or(0) > 0
        && lateness["figure"].as_f64() != Some(p99_ms)
    {
        return Err(format!("lateness figure is not the row's p99: {s}").into());
    }
    let all = verdicts.iter().all(|x| x["met"] == true);
    if s["met"].as_bool() != Some(all) || s["row"]["vms"] != s["vms"] {
        return Err(format!("step disagrees with its verdicts or row: {s}").into());
    }
    Ok(all)
}

fn max_vms_reports_every_step_and_consistent_verdicts() -> Result<(), Failed> {
    let (v, stdout) = density(
        "max-vms",
        &["--max-vms", "4", "--slo", "lateness_p99=20ms,host_busy=90%"],
    )?;
    if v["schema"] != "lull-bench-max-vms/1" || v["cap"] != 4 {
        return Err(format!("unexpected header: {}", v["schema"]).into());
    }
    // The default relative bound: 3 x the p99 of kernel's one VM (searched first), if above
    // the 20 ms given.
    let one_vm_ms = v["lateness_reference_p99_ns"]
        .as_f64()
        .ok_or("no one-VM reference")?
        / 1e6;
    let lateness_limit = f64::max(20.0, 3.0 * one_vm_ms);
    let modes = v["modes"].as_array().cloned().unwrap_or_default();
    if modes.len() != 2 || modes[0]["mode"] != "kernel" {
        return Err(format!("expected kernel and pull, got {modes:?}").into());
    }
    for m in &modes {
        let steps = m["steps"].as_array().cloned().unwrap_or_default();
        let max = m["max_vms"].as_u64().ok_or("no max_vms")?;
        if steps.is_empty() || max > 4 || m["max_vcpus"].as_u64() != Some(max) {
            return Err(format!("bad result: {m}").into());
        }
        // Doubling starts at 1 VM; every step's verdict is its own figures against the bounds.
        if steps[0]["vms"] != 1 {
            return Err(format!("the search did not start at 1 VM: {m}").into());
        }
        let mut met_counts = Vec::new();
        for s in &steps {
            if check_step(s, lateness_limit)? {
                met_counts.push(s["vms"].as_u64().unwrap_or(0));
            }
        }
        // The search names the bound that stopped it.
        let stop = m["stopped_by"]["bound"].as_str().unwrap_or("");
        if !["cap", "memory", "threads", "slo"].contains(&stop) {
            return Err(format!("no bound named as the stop: {m}").into());
        }
        // The result is the largest count that was measured and met (0 if none).
        if met_counts.iter().copied().max().unwrap_or(0) != max {
            return Err(format!("max_vms {max} is not the largest met step {met_counts:?}").into());
        }
        if !stdout.contains(&format!(
            "{:<9}{:>8}",
            m["mode"].as_str().unwrap_or(""),
            max
        )) {
            return Err(format!("the result table lacks {}:\n{stdout}", m["mode"]).into());
        }
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        kvm_trial(
            "density_reports_power_against_a_baseline",
            density_reports_power_against_a_baseline,
        ),
        kvm_trial(
            "max_vms_reports_every_step_and_consistent_verdicts",
            max_vms_reports_every_step_and_consistent_verdicts,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
