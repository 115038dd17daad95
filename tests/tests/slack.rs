//! `--timer-slack`: a VM whose halted vCPUs wake anywhere in their timers' ranges still gets
//! every timer and none early, in the timer models whose halted vCPUs wait on a wake-up the
//! model arms (`pull`, with the hierarchy's global timers, and `push`; `central` wakes its
//! vCPUs from its own timer thread, whose hard timerfd the slack does not change). Invariants
//! only (counts against counts of the same run), never a speed.

use std::time::Duration;

use lull_schema::RunReport;
use lull_tests::{
    kit_file, kvm_trial, run_bench, run_lull, take_metrics, temp_path, Arguments, Failed,
};

const DEADLINE: Duration = Duration::from_secs(120);

/// `idle-sim` with `--timer-slack SLACK` in `model` (2 vCPUs, a global-timer load that the
/// hierarchy expires in `pull`): its console and lull's metrics.
fn idle_sim(model: &str, slack: &str) -> Result<(String, RunReport), Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?.display().to_string();
    let metrics = temp_path(&format!("slack-{model}-{slack}.json"));
    let metrics_arg = metrics.display().to_string();
    let args = [
        "run",
        "--kernel",
        &kernel,
        "--irqchip",
        "user",
        "--cpus",
        "2",
        "--timer-model",
        model,
        "--timer-slack",
        slack,
        "--global-timers",
        "4,period=1",
        "--metrics",
        &metrics_arg,
        "--cmdline",
        "duration_ms=1500 slack_ns=1000000",
    ];
    let r = run_lull(&args, DEADLINE)?;
    r.expect_stdout("idle-sim: PASS")?;
    r.expect_code(1)?;
    Ok((r.stdout.clone(), take_metrics(&metrics)?))
}

/// `(events, early)` of each CPU's `idle-sim: cpu N: events E ... early X` line.
fn per_cpu(stdout: &str) -> Vec<(u64, u64)> {
    let after = |line: &str, key: &str| -> Option<u64> {
        let mut words = line.split_whitespace();
        words.find(|w| *w == key)?;
        words.next()?.parse().ok()
    };
    stdout
        .lines()
        .filter(|l| l.starts_with("idle-sim: cpu "))
        .filter_map(|l| Some((after(l, "events")?, after(l, "early")?)))
        .collect()
}

/// The count of one of the guest's histograms (`idle-sim: NAME_ns n=N ...`).
fn histogram_n(stdout: &str, name: &str) -> Option<u64> {
    let prefix = format!("idle-sim: {name}_ns n=");
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn every_timer_on_time_or_late(model: &str) -> Result<(), Failed> {
    let slack = "1ms";
    let (stdout, m) = idle_sim(model, slack)?;
    let show = || format!("{stdout}\n{m:?}");
    if m.timer_slack.as_deref() != Some(slack) {
        return Err(format!(
            "{model}: the report's timer_slack is not {slack}: {}",
            show()
        )
        .into());
    }
    let cpus = per_cpu(&stdout);
    if cpus.len() != 2 || m.vcpus.len() != 2 {
        return Err(format!("{model}: want 2 CPUs' counts and 2 vCPUs: {}", show()).into());
    }
    // Nothing early: the guest saw no interrupt before its deadline (idle-sim's tolerance);
    // every event's lateness was measured, and split at the slack (told with `slack_ns`).
    let early: u64 = cpus.iter().map(|c| c.1).sum();
    let events: u64 = cpus.iter().map(|c| c.0).sum();
    let (late_n, past_n) = (
        histogram_n(&stdout, "lateness"),
        histogram_n(&stdout, "past_slack"),
    );
    if early != 0 || late_n != Some(events) || past_n != Some(events) {
        return Err(format!("{model}: {early} early, {events} events: {}", show()).into());
    }
    for (v, &(handled, _)) in m.vcpus.iter().zip(&cpus) {
        let recorded: u64 = v.lateness_us_log2.iter().sum();
        let split: u64 = v.late_past_range_us_log2.iter().sum();
        // Every timer delivered: the guest finished (a lost timer leaves it halted forever)
        // having handled each event from a fire of lull's.
        if handled == 0 || v.lapic_timer_fires < handled {
            return Err(format!(
                "{model} vCPU {}: the guest handled {handled} events, lull fired {}: {}",
                v.vcpu,
                v.lapic_timer_fires,
                show()
            )
            .into());
        }
        // A halted vCPU goes back to the guest only with an interrupt to inject: one woken
        // early in its range (before the deadline) waits there rather than let the guest
        // halt again, so every HLT but the guest's last is followed by an injection. Exact
        // counts of one run, whatever the host's load.
        if v.hlt > v.injected + 1 {
            return Err(format!(
                "{model} vCPU {}: {} HLT exits but {} interrupts injected: the vCPU re-entered \
                 the guest with nothing to take, which halted again: {}",
                v.vcpu,
                v.hlt,
                v.injected,
                show()
            )
            .into());
        }
        // A wake-up that served k > 1 expiries counts k - 1 coalesced: at least one each.
        let (multi, coalesced) = (
            v.wake_multi_expiry.unwrap_or(0),
            v.wake_coalesced.unwrap_or(0),
        );
        if v.wake_coalesced.is_none() || coalesced < multi || (multi == 0) != (coalesced == 0) {
            return Err(format!(
                "{model} vCPU {}: {multi} wake-ups served more than one expiry, {coalesced} \
                 coalesced: {}",
                v.vcpu,
                show()
            )
            .into());
        }
        // Each delivery's lateness was also split at the end of its range.
        if split != recorded {
            return Err(format!(
                "{model} vCPU {}: {recorded} lateness records, {split} split at the range",
                v.vcpu
            )
            .into());
        }
    }
    Ok(())
}

fn pull_with_slack_delivers_every_timer_none_early() -> Result<(), Failed> {
    every_timer_on_time_or_late("pull")
}

fn push_with_slack_delivers_every_timer_none_early() -> Result<(), Failed> {
    every_timer_on_time_or_late("push")
}

/// `lull bench density --timer-slack off,1ms`: one `pull` row per slack beside one `kernel`
/// row, every VM passed with no early interrupt, and each `pull` row read its VMs' metrics
/// (found under the slack's own file names).
fn density_runs_each_slack_as_a_row() -> Result<(), Failed> {
    kit_file("guests/idle-sim.elf")?;
    let args = [
        "--vms",
        "1",
        "--cpus",
        "2",
        "--duration",
        "2s",
        "--modes",
        "kernel,pull",
        "--timer-slack",
        "off,1ms",
        "--power-baseline",
        "off",
    ];
    let (v, r) = run_bench("slack-density", "density", &args, DEADLINE)?;
    r.expect_stdout("pull@1ms")?;
    let rows = v["results"].as_array().cloned().unwrap_or_default();
    let labels: Vec<(String, Option<String>)> = rows
        .iter()
        .map(|r| {
            let mode = r["mode"].as_str().unwrap_or("").to_string();
            (mode, r["timer_slack"].as_str().map(str::to_string))
        })
        .collect();
    let want = [
        ("kernel".to_string(), None),
        ("pull".to_string(), Some("off".to_string())),
        ("pull".to_string(), Some("1ms".to_string())),
    ];
    if labels != want || v["params"]["timer_slack"] != serde_json::json!(["off", "1ms"]) {
        return Err(format!("rows {labels:?}, want {want:?}: {v}").into());
    }
    for row in &rows {
        let pull = row["mode"] == "pull";
        // With a slack every event's lateness is also reported past it, and never more.
        let split = match row["timer_slack"].as_str() {
            Some("1ms") => {
                let past = &row["lateness_past_slack"];
                past["n"] == row["lateness"]["n"]
                    && past["p99_ns"].as_u64() <= row["lateness"]["p99_ns"].as_u64()
                    && past["p99_ns"].is_u64()
            }
            _ => row.get("lateness_past_slack").is_none(),
        };
        if row["vms_ok"] != 1
            || row["early_interrupts"] != 0
            || (pull && !row["multi_expiry_wakeups"].is_u64())
            || (pull && !row["coalesced_expiries"].is_u64())
            || !split
        {
            return Err(format!("row {row}").into());
        }
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        kvm_trial(
            "pull_with_slack_delivers_every_timer_none_early",
            pull_with_slack_delivers_every_timer_none_early,
        ),
        kvm_trial(
            "push_with_slack_delivers_every_timer_none_early",
            push_with_slack_delivers_every_timer_none_early,
        ),
        kvm_trial(
            "density_runs_each_slack_as_a_row",
            density_runs_each_slack_as_a_row,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
