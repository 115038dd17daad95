//! Integration tests of the idle manager (`--irqchip user`): each knob does what it claims,
//! shown by the guest's own output and lull's metrics. Timing-tolerant: they check that a
//! mechanism engaged and its accounting is consistent, never a speed.

use std::time::Duration;

use lull_tests::{kit_file, kvm_trial, run_lull, take_metrics, temp_path, Arguments, Failed};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(120);

fn run_with_metrics(guest: &str, args: &[&str], expect: &str) -> Result<Value, Failed> {
    let kernel = kit_file(&format!("guests/{guest}.elf"))?
        .display()
        .to_string();
    let metrics = temp_path(&format!(
        "idle-{guest}-{}.json",
        args.join("_").replace(['/', ','], "-")
    ));
    let metrics_arg = metrics.display().to_string();
    let mut all = vec![
        "run",
        "--kernel",
        &kernel,
        "--irqchip",
        "user",
        "--metrics",
        &metrics_arg,
    ];
    all.extend_from_slice(args);
    let r = run_lull(&all, DEADLINE)?;
    r.expect_stdout(expect)?;
    r.expect_code(1)?;
    take_metrics(&metrics)
}

fn sum(v: &Value, field: &str) -> u64 {
    v["vcpus"].as_array().map_or(0, |a| {
        a.iter().map(|c| c[field].as_u64().unwrap_or(0)).sum()
    })
}

fn idle_injection_holds_every_vcpu() -> Result<(), Failed> {
    let m = run_with_metrics(
        "spin",
        &[
            "--cpus",
            "2",
            "--cmdline",
            "ms=600",
            "--idle-inject",
            "percent=25,period=20",
        ],
        "spin: PASS",
    )?;
    let run_ns = m["run_time_ms"].as_u64().unwrap_or(0) * 1_000_000;
    for v in m["vcpus"].as_array().into_iter().flatten() {
        let injected = v["injected_idle_ns"].as_u64().unwrap_or(0);
        // Held at least once, never longer than the run.
        if injected == 0 || injected > run_ns {
            return Err(format!("vCPU held {injected} ns of a {run_ns} ns run: {m}").into());
        }
    }
    let together = m["idle_inject"]["all_idle_together_ns"]
        .as_u64()
        .unwrap_or(0);
    if together == 0 || together > run_ns {
        return Err(format!("all-idle-together {together} ns out of range: {m}").into());
    }
    Ok(())
}

fn cpu_quota_throttles_a_busy_vm() -> Result<(), Failed> {
    let m = run_with_metrics(
        "spin",
        &[
            "--cmdline",
            "ms=600",
            "--cpu-quota",
            "quota=5,period=20,phase=random",
        ],
        "spin: PASS",
    )?;
    let q = &m["cpu_quota"];
    let periods = q["throttled_periods"].as_u64().unwrap_or(0);
    let intervals = q["intervals"].as_array().map_or(0, Vec::len) as u64;
    if periods == 0 || periods != intervals || sum(&m, "throttled_ns") == 0 {
        return Err(format!("expected throttling: {m}").into());
    }
    Ok(())
}

fn fixed_halt_polling_polls_and_counts() -> Result<(), Failed> {
    let m = run_with_metrics(
        "smp-ipi",
        &[
            "--cpus",
            "2",
            "--cmdline",
            "count=5",
            "--halt-poll",
            "200us",
        ],
        "smp-ipi: PASS",
    )?;
    let (polls, won, lost) = (
        sum(&m, "polls"),
        sum(&m, "polls_won"),
        sum(&m, "polls_lost"),
    );
    if polls == 0 || won + lost != polls || m["halt_poll"] != "200us" {
        return Err(format!("halt-poll accounting: {m}").into());
    }
    Ok(())
}

fn halt_polling_off_never_polls() -> Result<(), Failed> {
    let m = run_with_metrics(
        "lapic-timer",
        &["--cmdline", "count=3", "--halt-poll", "off"],
        "lapic-timer: PASS",
    )?;
    if sum(&m, "polls") != 0 || sum(&m, "blocks") == 0 {
        return Err(format!("--halt-poll off must block without polling: {m}").into());
    }
    Ok(())
}

fn global_timer_load_fires_and_rearms() -> Result<(), Failed> {
    for model in ["pull", "push", "central"] {
        let m = run_with_metrics(
            "smp-timer",
            &[
                "--cpus",
                "2",
                "--cmdline",
                "count=20",
                "--timer-model",
                model,
                "--global-timers",
                "4,period=1",
            ],
            "smp-timer: PASS",
        )?;
        let fires = sum(&m, "global_timer_fires")
            + m["global_timers"]["timer_thread_fires"]
                .as_u64()
                .unwrap_or(0);
        if fires < 8 {
            return Err(format!("{model}: expected global timers to fire and re-arm: {m}").into());
        }
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        kvm_trial(
            "idle_injection_holds_every_vcpu",
            idle_injection_holds_every_vcpu,
        ),
        kvm_trial(
            "cpu_quota_throttles_a_busy_vm",
            cpu_quota_throttles_a_busy_vm,
        ),
        kvm_trial(
            "fixed_halt_polling_polls_and_counts",
            fixed_halt_polling_polls_and_counts,
        ),
        kvm_trial("halt_polling_off_never_polls", halt_polling_off_never_polls),
        kvm_trial(
            "global_timer_load_fires_and_rearms",
            global_timer_load_fires_and_rearms,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
