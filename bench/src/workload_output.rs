//! Parsing what the kit's Linux prints when it runs its in-kernel workload
//! (`lull.workload=idle|timers,...`; format in `resources/linux/lull_workload.c`).
//!
//! ```text
//! [ 41.6] lull-workload: start kind=idle seconds=70 cpus=2 hz=100 boot_ms=41620 arg=... (instead of /init)
//! [111.7] lull-workload: idle cpu=0 loc=23 res=0 cal=1 wakeups=8 ...            per CPU (skipped)
//! [111.7] lull-workload: idle cpu=all cpus=2 run_us=70012345 loc=33 res=0 cal=6 wakeups=14
//!         tick_stops=14 idle_us=19229901 idle_pct=94.9                          -> counters
//! [111.7] lull-workload: timers cpu=all events=178 late_p50_us=1500 ...         -> timers
//! [111.7] lull-workload: PASS                      (or: lull-workload: FAIL <why>)
//! ```
//!
//! The start line is printed just before the workload takes its first snapshot and the
//! per-CPU lines just after its last, so the first is where a run's measured span begins and
//! the second where it is over: [`START_MARKER`] and [`report_marker`]. Lines may carry the
//! kernel's printk time in front; everything before `lull-workload: ` is ignored.

/// Every workload line holds this; what follows it is parsed.
const PREFIX: &str = "lull-workload: ";
/// The console holds this once the workload has started (and boot is over).
pub const START_MARKER: &str = "lull-workload: start ";
/// The console holds one of these once the workload has ended, whether it passed or not.
pub const END_MARKERS: [&str; 2] = ["lull-workload: PASS", "lull-workload: FAIL"];

/// The console holds this once the workload `kind` has begun its report (its span is over).
pub fn report_marker(kind: &str) -> String {
    format!("{PREFIX}{kind} cpu=")
}

/// The start line: what ran and how long the kernel took to get there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadStart {
    /// `idle` or `timers`.
    pub kind: String,
    /// Length of the workload, seconds.
    pub seconds: u64,
    /// CPUs online.
    pub cpus: u64,
    /// Guest time from boot to the workload's start, ms.
    pub boot_ms: u64,
}

/// What the kernel counted over the workload on all CPUs together (the `cpu=all` line).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkloadCounters {
    /// CPUs counted.
    pub cpus: u64,
    /// Length of the span counted, microseconds (guest clock).
    pub run_us: u64,
    /// Local APIC timer interrupts (`/proc/interrupts` LOC).
    pub loc: u64,
    /// Rescheduling IPIs received.
    pub res: u64,
    /// Function-call IPIs received.
    pub cal: u64,
    /// Passes through the idle loop: one per HLT, so one per wake-up from idle.
    pub wakeups: u64,
    /// Idle passes that stopped the tick.
    pub tick_stops: u64,
    /// Idle residency over all CPUs, percent of `cpus` x `run_us`.
    pub idle_pct: f64,
}

/// The `timers` workload's totals over all CPUs (microseconds; percentiles are the upper
/// bounds of the guest's log-linear buckets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerTotals {
    /// Timer events over all CPUs.
    pub events: u64,
    /// Lateness at the hrtimer callback: median.
    pub late_p50_us: u64,
    /// ... 99th percentile.
    pub late_p99_us: u64,
    /// ... largest.
    pub late_max_us: u64,
    /// ... mean.
    pub late_mean_us: u64,
    /// Lateness when the timer's thread ran again: median.
    pub wake_p50_us: u64,
    /// ... 99th percentile.
    pub wake_p99_us: u64,
    /// ... largest.
    pub wake_max_us: u64,
}

/// Everything one VM's workload reported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadReport {
    /// The start line, if it came.
    pub start: Option<WorkloadStart>,
    /// The `cpu=all` counters, if they came.
    pub counters: Option<WorkloadCounters>,
    /// The `timers cpu=all` totals, if they came.
    pub timers: Option<TimerTotals>,
    /// The workload printed PASS.
    pub passed: bool,
    /// The reason of its FAIL line, if it printed one.
    pub failure: Option<String>,
}

/// The value of `key=` among the words of `body`.
fn value<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    body.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn num(body: &str, key: &str) -> Option<u64> {
    value(body, key)?.parse().ok()
}

fn parse_start(body: &str) -> Option<WorkloadStart> {
    Some(WorkloadStart {
        kind: value(body, "kind")?.to_string(),
        seconds: num(body, "seconds")?,
        cpus: num(body, "cpus")?,
        boot_ms: num(body, "boot_ms")?,
    })
}

fn parse_counters(body: &str) -> Option<WorkloadCounters> {
    Some(WorkloadCounters {
        cpus: num(body, "cpus")?,
        run_us: num(body, "run_us")?,
        loc: num(body, "loc")?,
        res: num(body, "res")?,
        cal: num(body, "cal")?,
        wakeups: num(body, "wakeups")?,
        tick_stops: num(body, "tick_stops")?,
        idle_pct: value(body, "idle_pct")?.parse().ok()?,
    })
}

fn parse_timers(body: &str) -> Option<TimerTotals> {
    Some(TimerTotals {
        events: num(body, "events")?,
        late_p50_us: num(body, "late_p50_us")?,
        late_p99_us: num(body, "late_p99_us")?,
        late_max_us: num(body, "late_max_us")?,
        late_mean_us: num(body, "late_mean_us")?,
        wake_p50_us: num(body, "wake_p50_us")?,
        wake_p99_us: num(body, "wake_p99_us")?,
        wake_max_us: num(body, "wake_max_us")?,
    })
}

/// Parses a console log of the kit's Linux running `lull.workload=`.
pub fn parse_workload(log: &str) -> WorkloadReport {
    let mut r = WorkloadReport::default();
    for line in log.lines() {
        let Some((_, body)) = line.trim_end().split_once(PREFIX) else {
            continue;
        };
        if let Some(rest) = body.strip_prefix("start ") {
            r.start = parse_start(rest);
        } else if body == "PASS" {
            r.passed = true;
        } else if let Some(why) = body.strip_prefix("FAIL") {
            r.failure = Some(why.trim().to_string());
        } else if value(body, "cpu") == Some("all") {
            // Both kinds print the counters on a `cpu=all` line; `timers` adds a second.
            if body.contains(" events=") {
                r.timers = parse_timers(body);
            } else {
                r.counters = parse_counters(body);
            }
        }
    }
    r
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The end of a real console of `lull run --irqchip user --timer-model pull`, 2 vCPUs,
    /// 32 MiB, `lull.workload=timers,seconds=10,cpus=2` on this project's PVM host (from
    /// `Freeing unused kernel image` on).
    pub(crate) const TIMERS_LOG: &str = "\
[   32.939775] Freeing unused kernel image (text/rodata gap) memory: 2044K
[   38.610522] Freeing unused kernel image (rodata/data gap) memory: 1780K
[   38.666478] lull-workload: start kind=timers seconds=10 cpus=2 hz=100 boot_ms=37969 arg=timers,seconds=10,cpus=2 (instead of /init)
[   48.732479] lull-workload: timers cpu=0 loc=196 res=1 cal=32 wakeups=68 tick_stops=68 idle_us=8345862 idle_pct=83.2
[   48.786272] lull-workload: timers cpu=1 loc=222 res=0 cal=32 wakeups=86 tick_stops=86 idle_us=8182653 idle_pct=81.6
[   48.824032] lull-workload: timers cpu=all cpus=2 run_us=10025589 loc=418 res=1 cal=64 wakeups=154 tick_stops=154 idle_us=16528515 idle_pct=82.4
[   48.900626] lull-workload: timers cpu=0 events=94 late_p50_us=2097 late_p99_us=19975 late_max_us=19975 late_mean_us=3334 wake_p50_us=7602 wake_p99_us=40075 wake_max_us=40075
[   49.012135] lull-workload: timers cpu=1 events=84 late_p50_us=1310 late_p99_us=17142 late_max_us=17142 late_mean_us=3044 wake_p50_us=8388 wake_p99_us=37182 wake_max_us=37182
[   49.114639] lull-workload: timers cpu=all events=178 late_p50_us=1966 late_p99_us=19922 late_max_us=19975 late_mean_us=3197 wake_p50_us=8126 wake_p99_us=37748 wake_max_us=40075
[   49.160275] lull-workload: PASS
";

    #[test]
    fn a_timers_run_parses() {
        let r = parse_workload(TIMERS_LOG);
        assert!(r.passed);
        assert_eq!(r.failure, None);
        assert_eq!(
            r.start,
            Some(WorkloadStart {
                kind: "timers".into(),
                seconds: 10,
                cpus: 2,
                boot_ms: 37969
            })
        );
        let c = r.counters.unwrap();
        // The cpu=all line, not a per-CPU one.
        assert_eq!((c.cpus, c.run_us, c.loc), (2, 10_025_589, 418));
        assert_eq!((c.res, c.cal, c.wakeups, c.tick_stops), (1, 64, 154, 154));
        assert_eq!(c.idle_pct, 82.4);
        let t = r.timers.unwrap();
        assert_eq!(
            (t.events, t.late_p50_us, t.late_p99_us, t.late_max_us),
            (178, 1966, 19922, 19975)
        );
        assert_eq!(t.late_mean_us, 3197);
        assert_eq!(
            (t.wake_p50_us, t.wake_p99_us, t.wake_max_us),
            (8126, 37748, 40075)
        );
    }

    #[test]
    fn an_idle_run_has_no_timer_totals() {
        // resources/linux/README.md's sample, without printk times.
        let log = "\
lull-workload: start kind=idle seconds=10 cpus=2 hz=100 boot_ms=122620 arg=idle,seconds=10 (instead of /init)
lull-workload: idle cpu=0 loc=23 res=0 cal=1 wakeups=8 tick_stops=8 idle_us=9511649 idle_pct=93.9
lull-workload: idle cpu=1 loc=10 res=0 cal=5 wakeups=6 tick_stops=6 idle_us=9718252 idle_pct=95.9
lull-workload: idle cpu=all cpus=2 run_us=10123575 loc=33 res=0 cal=6 wakeups=14 tick_stops=14 idle_us=19229901 idle_pct=94.9
lull-workload: PASS
";
        let r = parse_workload(log);
        assert!(r.passed);
        assert_eq!(r.start.as_ref().map(|s| s.boot_ms), Some(122_620));
        let c = r.counters.unwrap();
        assert_eq!((c.loc, c.wakeups, c.cal), (33, 14, 6));
        assert_eq!(c.idle_pct, 94.9);
        assert_eq!(r.timers, None);
        assert!(log.contains(&report_marker("idle")));
        assert!(!log.lines().next().unwrap().contains(&report_marker("idle")));
    }

    #[test]
    fn a_failure_is_kept_and_a_cut_log_has_no_totals() {
        let log = "[ 2.0] lull-workload: start kind=idle seconds=2 cpus=1 hz=100 boot_ms=2000 arg=idle,seconds=2,cpus=2 (instead of /init)\n\
                   [ 2.1] lull-workload: FAIL not as many CPUs online as cpus= asked (lull.workload=idle,seconds=2,cpus=2)\n";
        let r = parse_workload(log);
        assert!(!r.passed);
        assert_eq!(
            r.failure.as_deref(),
            Some("not as many CPUs online as cpus= asked (lull.workload=idle,seconds=2,cpus=2)")
        );
        assert!(END_MARKERS.iter().any(|m| log.contains(m)));
        // A console cut in the middle of the counters line gives no counters.
        let cut = &TIMERS_LOG[..TIMERS_LOG.find("tick_stops=154 idle_us=16528515").unwrap()];
        let r = parse_workload(cut);
        assert_eq!(r.counters, None);
        assert!(r.start.is_some() && !r.passed);
    }
}
