//! The cost per event of the two ways a halted vCPU can wait for its next timer
//! (`--timer-slack`): today's hard wait (re-arm an absolute timerfd, `ppoll` on the kick
//! eventfd and the timerfd, thread slack 1 ns) against the ranged wait (`ppoll` on the same
//! two fds with a relative timeout, the thread's `PR_SET_TIMERSLACK` set to the slack).
//!
//! One thread sleeps `--events` times (or for `--duration`) for `--period` each way, and
//! reports per event: the thread's CPU time (the system calls and the wake-up's own work) and
//! the lateness of the wake-up behind its target (p50, p99, max). Run it on a quiet host;
//! compare the two rows of one run, never rows of different runs:
//!
//! ```text
//! cargo run -p vmm --release --example wait_cost -- --duration 10s --period 1ms --slack 100us
//! ```

use std::time::Duration;

use clap::Parser;
use nix::time::{clock_gettime, ClockId};
use vmm::config::knob::parse_duration_ns;
use vmm::host::sys::clock::monotonic_ns;
use vmm::host::sys::poll::wait;
use vmm::host::sys::thread::set_timer_slack;
use vmm::host::sys::timerfd::TimerFd;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// What to measure.
#[derive(Debug, Parser)]
struct Args {
    /// How long each way runs (e.g. 1s, 10s).
    #[arg(long, default_value = "2s", value_parser = parse_ns)]
    duration: u64,
    /// The sleep of one event (e.g. 1ms).
    #[arg(long, default_value = "1ms", value_parser = parse_ns)]
    period: u64,
    /// The ranged wait's thread timer slack (e.g. 100us, 1ms).
    #[arg(long, default_value = "100us", value_parser = parse_ns)]
    slack: u64,
}

fn parse_ns(s: &str) -> Result<u64, String> {
    parse_duration_ns(s).map_err(|e| e.0)
}

/// The calling thread's CPU time, ns.
fn thread_cpu_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| {
            u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
                + u64::try_from(t.tv_nsec()).unwrap_or(0)
        })
        .unwrap_or(0)
}

/// One way's results.
struct Row {
    events: u64,
    cpu_ns: u64,
    late: Vec<u64>,
}

impl Row {
    fn print(&mut self, name: &str) {
        self.late.sort_unstable();
        let at = |q: usize| {
            self.late
                .get((self.late.len() * q / 100).min(self.late.len() - 1))
        };
        let us = |v: Option<&u64>| v.map_or(0.0, |&ns| ns as f64 / 1000.0);
        println!(
            "{name:<22} {:>8} {:>12.2} {:>10.1} {:>10.1} {:>10.1}",
            self.events,
            self.cpu_ns as f64 / self.events.max(1) as f64 / 1000.0,
            us(at(50)),
            us(at(99)),
            us(self.late.last()),
        );
    }
}

/// Sleeps `period` at a time for `duration`, each sleep through `sleep(target)`.
fn measure(args: &Args, mut sleep: impl FnMut(u64)) -> Row {
    let end = monotonic_ns() + args.duration;
    let cpu0 = thread_cpu_ns();
    let mut row = Row {
        events: 0,
        cpu_ns: 0,
        late: Vec::new(),
    };
    while monotonic_ns() < end {
        let target = monotonic_ns() + args.period;
        sleep(target);
        row.late.push(monotonic_ns().saturating_sub(target));
        row.events += 1;
    }
    row.cpu_ns = thread_cpu_ns() - cpu0;
    row
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let kick = EventFd::new(EFD_NONBLOCK)?;
    let fd = TimerFd::nonblocking()?;
    println!(
        "{:<22} {:>8} {:>12} {:>10} {:>10} {:>10}",
        "wait", "events", "cpu_us/event", "late_p50", "late_p99", "late_max"
    );
    set_timer_slack(1)?;
    let mut hard = measure(&args, |target| {
        // Today's halted wait: arm the wake-up timerfd, wait on the kick and the timerfd.
        let _ = fd.arm_at(target);
        let _ = wait(&kick, Some(&fd), None);
    });
    hard.print("timerfd (slack off)");
    let _ = fd.disarm();
    set_timer_slack(args.slack)?;
    let mut ranged = measure(&args, |target| {
        // The ranged wait: the same two fds (the timerfd a disarmed doorbell), a timeout.
        let rel = target.saturating_sub(monotonic_ns());
        let _ = wait(&kick, Some(&fd), Some(Duration::from_nanos(rel)));
    });
    ranged.print(&format!(
        "ppoll slack {}",
        vmm::config::knob::format_duration_ns(args.slack)
    ));
    Ok(())
}
