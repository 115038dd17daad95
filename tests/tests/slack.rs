//! `--timer-slack`: a VM whose halted vCPUs wake anywhere in their timers' ranges spares host
//! wake-ups and still gets every timer, none early, in the timer models whose halted vCPUs
//! wait on a wake-up the model arms (`pull`, with the hierarchy's global timers, and `push`;
//! `central` wakes its vCPUs from its own timer thread, whose hard timerfd the slack does not
//! change). The same guest runs with `--timer-slack off` and with a slack: with it, the
//! vCPUs block fewer times per timer fire by lull's count and by the kernel's (their threads'
//! voluntary context switches), by more than run-to-run spread could give a flag that changed
//! nothing; most timers come within the slack. Invariants only (counts against counts of the
//! same runs), never a speed.

use std::time::Duration;

use lull_schema::RunReport;
use lull_tests::{
    kit_file, kvm_trial, run_bench, run_lull, take_metrics, temp_path, Arguments, Failed,
};

const DEADLINE: Duration = Duration::from_secs(120);

/// The slack of the runs with one: the most lull takes, so that the wake-ups it spares (four
/// global timers a vCPU, every 0.5-1.5 ms, many within 10 ms of each other) stand far above
/// what a loaded host's late wake-ups coalesce without it.
const SLACK: &str = "10ms";
const SLACK_NS: u64 = 10_000_000;

/// `idle-sim` with `--timer-slack SLACK` in `model` (2 vCPUs, a global-timer load that the
/// hierarchy expires in `pull`), told the slack (`slack_ns`): its console and lull's metrics.
fn idle_sim(model: &str, slack: &str, slack_ns: u64) -> Result<(String, RunReport), Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?.display().to_string();
    let metrics = temp_path(&format!("slack-{model}-{slack}.json"));
    let metrics_arg = metrics.display().to_string();
    let cmdline = format!("duration_ms=1500 slack_ns={slack_ns}");
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
        &cmdline,
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

/// A figure of one of the guest's summaries (`idle-sim: NAME_ns n=N min A p50 B ...`): `n`'s
/// value, or the number after the word `key`.
fn summary(stdout: &str, name: &str, key: &str) -> Option<u64> {
    let prefix = format!("idle-sim: {name}_ns ");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))?;
    if key == "n" {
        return line
            .strip_prefix("n=")?
            .split_whitespace()
            .next()?
            .parse()
            .ok();
    }
    let mut words = line.split_whitespace();
    words.find(|w| *w == key)?;
    words.next()?.parse().ok()
}

/// One run's guarantees, slack or not: every timer delivered and none early.
fn every_timer_none_early(run: &str, stdout: &str, m: &RunReport) -> Result<(), Failed> {
    let show = || format!("{stdout}\n{m:?}");
    let cpus = per_cpu(stdout);
    if cpus.len() != 2 || m.vcpus.len() != 2 {
        return Err(format!("{run}: want 2 CPUs' counts and 2 vCPUs: {}", show()).into());
    }
    // Nothing early: the guest saw no interrupt before its deadline (idle-sim's tolerance),
    // and it measured the lateness of every event it handled.
    let early: u64 = cpus.iter().map(|c| c.1).sum();
    let events: u64 = cpus.iter().map(|c| c.0).sum();
    if early != 0 || summary(stdout, "lateness", "n") != Some(events) {
        return Err(format!("{run}: {early} early, {events} events: {}", show()).into());
    }
    for (v, &(handled, _)) in m.vcpus.iter().zip(&cpus) {
        // Every timer delivered: the guest finished (a lost timer leaves it halted forever)
        // having handled each event from a fire of lull's.
        if handled == 0 || v.lapic_timer_fires < handled {
            return Err(format!(
                "{run} vCPU {}: the guest handled {handled} events, lull fired {}: {}",
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
                "{run} vCPU {}: {} HLT exits but {} interrupts injected: the vCPU re-entered \
                 the guest with nothing to take, which halted again: {}",
                v.vcpu,
                v.hlt,
                v.injected,
                show()
            )
            .into());
        }
    }
    Ok(())
}

/// Host wake-ups of a run per timer fire (the global load's and the LAPICs'): lull's count
/// of blocks, and the kernel's count of its vCPU threads' voluntary context switches.
fn wakeups_per_fire(m: &RunReport) -> (f64, f64) {
    let fires: u64 = m
        .vcpus
        .iter()
        .map(|v| v.global_timer_fires + v.lapic_timer_fires)
        .sum();
    let blocks: u64 = m.vcpus.iter().map(|v| v.blocks).sum();
    let switches: u64 = m
        .threads
        .iter()
        .filter(|t| t.name.starts_with("vcpu"))
        .map(|t| t.voluntary_ctxt_switches)
        .sum();
    let per = |x: u64| x as f64 / fires.max(1) as f64;
    (per(blocks), per(switches))
}

fn slack_spares_wakeups_and_delivers_every_timer(model: &str) -> Result<(), Failed> {
    let (off_out, off) = idle_sim(model, "off", 0)?;
    let (on_out, on) = idle_sim(model, SLACK, SLACK_NS)?;
    for (run, slack, stdout, m) in [("off", "off", &off_out, &off), (SLACK, SLACK, &on_out, &on)] {
        if m.timer_slack.as_deref() != Some(slack) {
            return Err(format!("{model}: the report's timer_slack is not {slack}: {m:?}").into());
        }
        every_timer_none_early(&format!("{model} {run}"), stdout, m)?;
    }
    // The effect: the slack's wake-ups serve several expiries each, so the vCPUs block (and
    // their threads sleep) less than half as often per timer fire as without it. Two runs of
    // one setting differ far less; a loaded host's late wake-ups coalesce some expiries
    // without slack too, far fewer than a 10 ms range does.
    let ((off_blocks, off_switches), (on_blocks, on_switches)) =
        (wakeups_per_fire(&off), wakeups_per_fire(&on));
    if on_blocks * 2.0 >= off_blocks || on_switches * 2.0 >= off_switches {
        return Err(format!(
            "{model}: per timer fire, {on_blocks:.3} blocks and {on_switches:.3} vCPU thread \
             sleeps with --timer-slack {SLACK}, {off_blocks:.3} and {off_switches:.3} with off: \
             the slack spared too few host wake-ups\n{on:?}\n{off:?}"
        )
        .into());
    }
    // Wake-ups that served more than one expiry: counted with the slack.
    let coalesced: u64 = on.vcpus.iter().filter_map(|v| v.wake_coalesced).sum();
    if coalesced == 0 {
        return Err(format!("{model}: no wake-up served two expiries: {on:?}").into());
    }
    // Late by at most the slack, but for the host's delays: most timers (the median) came
    // within their range, by the guest's own clock.
    let past = summary(&on_out, "past_slack", "p50");
    if past != Some(0) {
        return Err(format!(
            "{model}: the median timer came {past:?} ns past its {SLACK} slack:\n{on_out}"
        )
        .into());
    }
    Ok(())
}

fn pull_slack_spares_host_wakeups_delivers_every_timer_none_early() -> Result<(), Failed> {
    slack_spares_wakeups_and_delivers_every_timer("pull")
}

fn push_slack_spares_host_wakeups_delivers_every_timer_none_early() -> Result<(), Failed> {
    slack_spares_wakeups_and_delivers_every_timer("push")
}

/// `lull bench density --timer-slack off,1ms`: one `pull` row per slack beside one `kernel`
/// row, every VM passed with no early interrupt, each `pull` row read its VMs' metrics (found
/// under the slack's own file names), and the row with a slack reports lateness past it. (What
/// the slack does is shown on one VM's counts above; host-wide figures are the bench's.)
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
        // A row with a slack reports its lateness past it too; one without does not.
        let past_slack = row.get("lateness_past_slack").is_some_and(|p| !p.is_null());
        let with_slack = row["timer_slack"] == "1ms";
        if row["vms_ok"] != 1
            || row["early_interrupts"] != 0
            || (pull && !row["multi_expiry_wakeups"].is_u64())
            || (pull && !row["coalesced_expiries"].is_u64())
            || past_slack != with_slack
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
            "pull_slack_spares_host_wakeups_delivers_every_timer_none_early",
            pull_slack_spares_host_wakeups_delivers_every_timer_none_early,
        ),
        kvm_trial(
            "push_slack_spares_host_wakeups_delivers_every_timer_none_early",
            push_slack_spares_host_wakeups_delivers_every_timer_none_early,
        ),
        kvm_trial(
            "density_runs_each_slack_as_a_row",
            density_runs_each_slack_as_a_row,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
