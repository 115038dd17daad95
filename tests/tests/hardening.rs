//! Hardening tests: a hostile guest (`storm`: minimum-period LAPIC timers on every CPU, an IPI
//! flood, unclaimed ports and reserved LAPIC registers) against lull with its seccomp filters
//! on (the default). lull must clamp the timer, keep its log short, stay responsive to SIGTERM
//! and run every thread under its filter.
//!
//! Measurements are printed (`--nocapture` is not needed: libtest-mimic shows stderr of
//! failed tests only, so they also go to the failure message when a check fails).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lull_schema::RunReport;
use lull_tests::{
    kit_file, kvm_trial, lull_bin, report_from, run_lull, take_metrics, temp_path, Arguments,
    Failed,
};

const GUEST_DEADLINE: Duration = Duration::from_secs(60);
/// lull's LAPIC timer clamp (`devices::lapic::TimerLimits::default().min_period_ns`).
const MIN_PERIOD_NS: u64 = 100_000;
/// The unknown-port access whose log line ends the flood window: lull logs the 1st, 2nd, 4th,
/// ... occurrence, so this line is the proof that the guest committed at least that many.
const MISDEEDS_BEFORE_SIGTERM: u64 = 256;
/// How long lull may take to end after SIGTERM while the storm runs before it counts as hung
/// (a bound for a hang, not a timing: the time it took is printed).
const SIGTERM_DEADLINE: Duration = Duration::from_secs(20);

/// Total CPU time of lull's threads in the metrics (ns).
fn threads_cpu_ns(metrics: &RunReport) -> u64 {
    metrics.threads.iter().map(|t| t.cpu_ns).sum()
}

/// A timer-only storm: every vCPU arms a periodic LAPIC timer with initial count 1 (1 ns) and
/// halts between ticks. lull must run it at the 100 us clamp: at most 10,000 timer events per
/// second per vCPU, so the host CPU the guest can make lull burn on timers is bounded.
fn timer_storm_is_clamped() -> Result<(), Failed> {
    let kernel = kit_file("guests/storm.elf")?.display().to_string();
    let metrics = temp_path("timer-storm.json");
    let metrics_arg = metrics.display().to_string();
    let max_rate = 1_000_000_000 / MIN_PERIOD_NS * 105 / 100;
    let cmdline = format!("ms=2000 ipi=0 noise=0 max_rate={max_rate}");
    let r = run_lull(
        &[
            "run",
            "--kernel",
            &kernel,
            "--cpus",
            "2",
            "--irqchip",
            "user",
            "--cmdline",
            &cmdline,
            "--metrics",
            &metrics_arg,
        ],
        GUEST_DEADLINE,
    )?;
    r.expect_stdout("storm: PASS")?;
    r.expect_code(1)?;
    let m = take_metrics(&metrics)?;
    let run_ns = m.run_time_ms * 1_000_000;
    let vcpus = m.vcpus.clone();
    let mut fires = 0;
    for v in &vcpus {
        let f = v.lapic_timer_fires;
        // One fire per clamped period, plus the arming write's own first expiry.
        if f > run_ns / MIN_PERIOD_NS + 2 {
            return Err(format!("{f} timer fires in {run_ns} ns beat the clamp: {m:?}").into());
        }
        fires += f;
    }
    if m.lapic_timer_clamps == 0 || fires == 0 {
        return Err(format!("the storm was not clamped or never fired: {m:?}").into());
    }
    let cpu = threads_cpu_ns(&m);
    eprintln!(
        "timer storm: {} vCPUs, {fires} timer fires in {} ms ({} /s per vCPU), lull CPU {} ms \
         ({}% of one core, {} ns per fire)",
        vcpus.len(),
        run_ns / 1_000_000,
        fires * 1_000_000_000 / run_ns.max(1) / (vcpus.len() as u64).max(1),
        cpu / 1_000_000,
        cpu * 100 / run_ns.max(1),
        cpu / fires.max(1)
    );
    Ok(())
}

/// Reads `/proc/<pid>/task/*/{comm,status}`: (thread name, seccomp mode) of every thread.
fn seccomp_of_threads(pid: u32) -> Result<Vec<(String, String)>, Failed> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for task in std::fs::read_dir(&dir)
        .map_err(|e| format!("{dir}: {e}"))?
        .flatten()
    {
        let read = |f: &str| std::fs::read_to_string(task.path().join(f)).unwrap_or_default();
        let mode = read("status")
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:").map(|v| v.trim().to_string()))
            .unwrap_or_default();
        out.push((read("comm").trim().to_string(), mode));
    }
    Ok(out)
}

/// Total utime + stime of a process in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
fn process_cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // After the comm field, state is index 0, so utime (14) and stime (15) are 11 and 12.
    field(11) + field(12)
}

fn kill(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status();
}

/// Whether a line holding `needle` comes on `lines` before `GUEST_DEADLINE` after `started`.
fn line_within(lines: &mpsc::Receiver<String>, needle: &str, started: Instant) -> bool {
    while let Some(left) = GUEST_DEADLINE.checked_sub(started.elapsed()) {
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Kills lull and fails with `what` and everything its console and log said.
fn kill_and_report(
    mut child: Child,
    console: std::thread::JoinHandle<String>,
    log: std::thread::JoinHandle<String>,
    what: &str,
) -> Failed {
    let _ = child.kill();
    let _ = child.wait();
    format!(
        "{what}\n--- console:\n{}\n--- log:\n{}",
        console.join().unwrap_or_default(),
        log.join().unwrap_or_default()
    )
    .into()
}

/// Waits for `child` to exit for up to `deadline`; kills it after that (`None`).
fn wait_with_deadline(mut child: Child, deadline: Duration) -> Option<std::process::ExitStatus> {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait().ok();
        let _ = tx.send(());
        status
    });
    let in_time = rx.recv_timeout(deadline).is_ok();
    if !in_time {
        kill(pid, "-KILL");
    }
    let status = waiter.join().ok().flatten();
    if in_time {
        status
    } else {
        None
    }
}

/// `lull run` of the storm guest on 2 vCPUs (timers at the clamp, IPI flood, unclaimed
/// ports, reserved registers) with `--seccomp on`, its output piped.
fn start_storm(kernel: &str, metrics: &Path) -> Result<Child, Failed> {
    let child = Command::new(lull_bin())
        .args([
            "run",
            "--kernel",
            kernel,
            "--cpus",
            "2",
            "--irqchip",
            "user",
            "--seccomp",
            "on",
            "--cmdline",
            "ms=0 ipi=1 noise=1",
        ])
        .args(["--metrics".as_ref(), metrics.as_os_str()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start lull: {e}"))?;
    Ok(child)
}

/// Every line `output` writes, as it comes (the receiver) and all of it at its end (the
/// thread's result).
fn collect_lines(
    output: impl Read + Send + 'static,
) -> (mpsc::Receiver<String>, std::thread::JoinHandle<String>) {
    let (tx, rx) = mpsc::channel();
    let all = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    (rx, all)
}

/// Every lull thread (`lull`, `vcpu*`, `timers`) runs under a seccomp filter (mode 2), and
/// there is a vCPU thread.
fn every_thread_filtered(threads: &[(String, String)], context: &str) -> Result<(), Failed> {
    for (name, mode) in threads {
        let ours = name == "lull" || name.starts_with("vcpu") || name == "timers";
        if ours && mode != "2" {
            return Err(format!("thread {name} runs without a seccomp filter{context}").into());
        }
    }
    if !threads.iter().any(|(n, _)| n.starts_with("vcpu")) {
        return Err(format!("no vCPU thread seen{context}").into());
    }
    Ok(())
}

/// The full storm on 2 vCPUs (timers at the clamp, IPI flood, unclaimed ports, reserved
/// registers) with `--seccomp on`: every lull thread runs under its filter, lull answers
/// SIGTERM (sent once the log proves 256 misdeeds) with status 12 rather than hanging, and its
/// log stays logarithmic in the number of guest misdeeds.
fn flood_stays_responsive_under_seccomp() -> Result<(), Failed> {
    let kernel = kit_file("guests/storm.elf")?.display().to_string();
    let metrics = temp_path("flood.json");
    let mut child = start_storm(&kernel, &metrics)?;
    let pid = child.id();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (rx, console) = collect_lines(stdout);
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let (log_rx, log) = collect_lines(stderr);
    let started = Instant::now();
    // The window ends with the log line of the guest's MISDEEDS_BEFORE_SIGTERM-th unknown port
    // access, however long a loaded host takes to get there.
    let proof = format!("({MISDEEDS_BEFORE_SIGTERM} unknown port accesses so far)");
    if !line_within(&rx, "storm: flooding", started) {
        return Err(kill_and_report(
            child,
            console,
            log,
            "the storm never started",
        ));
    }
    let ticks_before = process_cpu_ticks(pid);
    let window_start = Instant::now();
    if !line_within(&log_rx, &proof, started) {
        let what = format!("no log line {proof} within {GUEST_DEADLINE:?}");
        return Err(kill_and_report(child, console, log, &what));
    }
    let threads = seccomp_of_threads(pid)?;
    let ticks = process_cpu_ticks(pid).saturating_sub(ticks_before);
    let window = window_start.elapsed();
    let term_sent = Instant::now();
    kill(pid, "-TERM");
    let status = wait_with_deadline(child, SIGTERM_DEADLINE);
    let answered = term_sent.elapsed();
    let console = console.join().unwrap_or_default();
    let log = log.join().unwrap_or_default();
    let json = std::fs::read_to_string(&metrics).unwrap_or_default();
    let _ = std::fs::remove_file(&metrics);
    let context = format!(
        "\n--- threads: {threads:?}\n--- console:\n{console}\n--- log:\n{log}\n--- metrics:\n{json}"
    );
    let Some(status) = status else {
        return Err(
            format!("lull did not answer SIGTERM within {SIGTERM_DEADLINE:?}{context}").into(),
        );
    };
    if status.code() != Some(12) {
        return Err(format!("expected status 12 after SIGTERM, got {status:?}{context}").into());
    }
    every_thread_filtered(&threads, &context)?;
    let m = report_from(&json).map_err(|e| format!("metrics JSON: {e}{context}"))?;
    let misdeeds = m.unknown_port_accesses + m.lapic_invalid_accesses;
    let log_lines = log.lines().count();
    // Each kind of misdeed logs its 1st, 2nd, 4th, ... occurrence: log2(n) lines per kind.
    let bound = 4 * (64 - misdeeds.leading_zeros() as usize) + 16;
    if misdeeds < MISDEEDS_BEFORE_SIGTERM || log_lines > bound {
        return Err(format!(
            "{log_lines} log lines for {misdeeds} guest misdeeds (bound {bound}){context}"
        )
        .into());
    }
    let run_ns = m.run_time_ms * 1_000_000;
    let fires: u64 = m.vcpus.iter().map(|v| v.lapic_timer_fires).sum();
    if fires > 2 * (run_ns / MIN_PERIOD_NS + 2) {
        return Err(format!("{fires} timer fires beat the clamp{context}").into());
    }
    // /proc clock ticks are USER_HZ = 100 per second on Linux x86-64.
    let cpu_ms = ticks * 10;
    eprintln!(
        "flood: {} ms window, lull CPU {cpu_ms} ms ({}% of one core) for 2 vCPUs; {fires} timer \
         fires, {} IPIs, {misdeeds} misdeeds -> {log_lines} log lines; SIGTERM answered in \
         {} ms",
        window.as_millis(),
        u128::from(cpu_ms) * 100 / window.as_millis().max(1),
        m.ipis,
        answered.as_millis()
    );
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        kvm_trial("timer_storm_is_clamped", timer_storm_is_clamped),
        kvm_trial(
            "flood_stays_responsive_under_seccomp",
            flood_stays_responsive_under_seccomp,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
