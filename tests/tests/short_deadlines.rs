//! Short TSC deadlines re-armed from the guest's timer interrupt handler (`idle-sim
//! pattern=rearm-halt|rearm-busy`), in every irqchip mode and timer model: every interrupt is
//! delivered exactly once and none before its deadline. lull's metrics must agree with the
//! guest's own count. Never a timing threshold: a lost interrupt shows as a guest that never
//! finishes (halted, or writing to the serial port until the deadline kills it).

use std::time::Duration;

use lull_schema::RunReport;
use lull_tests::{kit_file, kvm_trial, run_lull, take_metrics, temp_path, Arguments, Failed};

const DEADLINE: Duration = Duration::from_secs(120);

const MODES: [(&str, &[&str]); 4] = [
    ("kernel", &["--irqchip", "kernel"]),
    ("pull", &["--irqchip", "user", "--timer-model", "pull"]),
    ("push", &["--irqchip", "user", "--timer-model", "push"]),
    (
        "central",
        &["--irqchip", "user", "--timer-model", "central"],
    ),
];

/// `idle-sim: cpu 0: events E ... early X` -> (E, X).
fn events_and_early(stdout: &str) -> Option<(u64, u64)> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("idle-sim: cpu 0: "))?;
    let after = |key: &str| -> Option<u64> {
        let mut words = line.split_whitespace();
        words.find(|w| *w == key)?;
        words.next()?.parse().ok()
    };
    Some((after("events")?, after("early")?))
}

/// One run of `pattern` with `tail` in `mode`: the guest's counts and lull's metrics.
fn run(mode: &[&str], pattern: &str, tail: u32) -> Result<(u64, u64, RunReport), Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?.display().to_string();
    let metrics = temp_path(&format!("short-{pattern}-{tail}-{}.json", mode.join("-")));
    let metrics_arg = metrics.display().to_string();
    let cmdline = format!("cpus=1 duration_ms=500 pattern={pattern} tail={tail} early_ns=0");
    let mut args = vec![
        "run",
        "--kernel",
        &kernel,
        "--cpus",
        "1",
        "--metrics",
        &metrics_arg,
        "--cmdline",
        &cmdline,
    ];
    args.extend_from_slice(mode);
    let r = run_lull(&args, DEADLINE)?;
    r.expect_stdout(&format!(", {pattern}, "))?;
    r.expect_stdout("idle-sim: PASS")?;
    r.expect_code(1)?;
    let (events, early) = events_and_early(&r.stdout)
        .ok_or_else(|| format!("no `cpu 0: events` line:\n{}", r.stdout))?;
    Ok((events, early, take_metrics(&metrics)?))
}

fn every_interrupt_once_and_none_early(pattern: &'static str) -> Result<(), Failed> {
    for (name, mode) in MODES {
        for tail in [1, 0] {
            let (events, early, m) = run(mode, pattern, tail)?;
            let what = format!("{pattern} tail={tail} {name}");
            if events == 0 || early != 0 {
                return Err(format!("{what}: {events} events, {early} early").into());
            }
            if name == "kernel" {
                continue;
            }
            // The guest's only interrupts are its timer's: lull injected and expired exactly
            // what the guest counted.
            let v = m.vcpus.first().ok_or("no vCPU in the metrics")?;
            if v.injected != events || v.lapic_timer_fires != events {
                return Err(format!(
                    "{what}: the guest took {events} interrupts, lull injected {} and expired {}",
                    v.injected, v.lapic_timer_fires
                )
                .into());
            }
            if v.ticks_deferred_missed + v.ticks_deferred_late > v.ticks_deferred {
                return Err(format!(
                    "{what}: more deferred ticks fired (missed or late) than deferred: {v:?}"
                )
                .into());
            }
        }
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        kvm_trial("rearm_halt_every_interrupt_once_and_none_early", || {
            every_interrupt_once_and_none_early("rearm-halt")
        }),
        kvm_trial("rearm_busy_every_interrupt_once_and_none_early", || {
            every_interrupt_once_and_none_early("rearm-busy")
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}
