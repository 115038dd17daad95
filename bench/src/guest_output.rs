//! Parsing what the benchmark guests print on their serial console (`idle-sim`, `wake-ipi`,
//! `lapic-timer`;
//! formats in `resources/guests/src/*.c`) and merging the histograms of many VMs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A latency histogram over nanoseconds: bucket `[lo, hi)` -> count, plus exact extremes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// Counts by bucket bounds in ns.
    pub buckets: BTreeMap<(u64, u64), u64>,
    /// Samples.
    pub n: u64,
    /// Exact largest sample (ns).
    pub max: u64,
    /// Sum of the samples (ns), from the guest's exact mean.
    pub sum: u128,
}

/// Percentiles of a [`Histogram`] (field names are part of the bench JSON schema).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Samples.
    pub n: u64,
    /// Median: upper bound of the bucket holding it, ns.
    pub p50_ns: u64,
    /// 99th percentile: upper bound of the bucket holding it, ns.
    pub p99_ns: u64,
    /// Largest sample, exact, ns.
    pub max_ns: u64,
    /// Mean, exact, ns.
    pub mean_ns: u64,
}

impl Histogram {
    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (k, v) in &other.buckets {
            *self.buckets.entry(*k).or_insert(0) += v;
        }
        self.n += other.n;
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    /// The upper bound (ns, capped at the maximum) of the bucket holding quantile `q` (0..=1).
    pub fn quantile(&self, q: f64) -> u64 {
        let total: u64 = self.buckets.values().sum();
        if total == 0 {
            return 0;
        }
        // Rank of the quantile sample, 1-based: ceil(q * total), at least 1.
        let mut rank = 1;
        while (rank as f64) < q * total as f64 && rank < total {
            rank += 1;
        }
        let mut seen = 0;
        for ((_, hi), count) in &self.buckets {
            seen += count;
            if seen >= rank {
                return (*hi).min(self.max);
            }
        }
        self.max
    }

    /// The summary of every sample less `s` ns, floored at 0: the delay past a slack `s`.
    /// Taking `s` off keeps the samples' order, so the quantiles are this histogram's less
    /// `s`; the mean is estimated from the buckets' midpoints (the guest's exact sum is of the
    /// samples themselves).
    pub fn past(&self, s: u64) -> LatencySummary {
        let whole = self.summary();
        let total: u64 = self.buckets.values().sum();
        let sum: u128 = self
            .buckets
            .iter()
            .map(|((lo, hi), count)| {
                let mid = lo / 2 + hi / 2;
                u128::from(mid.saturating_sub(s)) * u128::from(*count)
            })
            .sum();
        LatencySummary {
            n: whole.n,
            p50_ns: whole.p50_ns.saturating_sub(s),
            p99_ns: whole.p99_ns.saturating_sub(s),
            max_ns: whole.max_ns.saturating_sub(s),
            mean_ns: if total == 0 {
                0
            } else {
                u64::try_from(sum / u128::from(total)).unwrap_or(u64::MAX)
            },
        }
    }

    /// p50, p99, max and mean.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            n: self.n,
            p50_ns: self.quantile(0.5),
            p99_ns: self.quantile(0.99),
            max_ns: self.max,
            mean_ns: if self.n == 0 {
                0
            } else {
                u64::try_from(self.sum / u128::from(self.n)).unwrap_or(u64::MAX)
            },
        }
    }
}

/// What one `idle-sim` run reported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdleSimReport {
    /// Timer events over all CPUs.
    pub events: u64,
    /// IPIs sent between CPUs.
    pub ipis_sent: u64,
    /// IPIs received.
    pub ipis_received: u64,
    /// Timer interrupts that came before their deadline (beyond the guest's tolerance).
    pub early: u64,
    /// Timer lateness.
    pub lateness: Histogram,
    /// IPI latency.
    pub ipi: Histogram,
    /// With `slack_ns=S`: each lateness less S, the host's delay past the slack (empty
    /// otherwise).
    pub past_slack: Histogram,
    /// The guest printed its PASS line.
    pub passed: bool,
}

fn word_after<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == key {
            return words.next();
        }
        if let Some(v) = w.strip_prefix(key).and_then(|r| r.strip_prefix('=')) {
            return Some(v);
        }
    }
    None
}

fn num_after(line: &str, key: &str) -> u64 {
    word_after(line, key)
        .and_then(|v| v.parse::<i64>().ok())
        .map_or(0, |v| u64::try_from(v).unwrap_or(0))
}

fn parse_summary(line: &str, h: &mut Histogram) {
    h.n = num_after(line, "n");
    h.max = num_after(line, "max");
    h.sum = u128::from(num_after(line, "mean")) * u128::from(h.n);
}

fn parse_buckets(rest: &str, h: &mut Histogram) {
    for item in rest.split_whitespace() {
        let parsed = item.split_once(':').and_then(|(range, count)| {
            let (lo, hi) = range.split_once('-')?;
            Some((
                (lo.parse::<u64>().ok()?, hi.parse::<u64>().ok()?),
                count.parse::<u64>().ok()?,
            ))
        });
        if let Some((k, v)) = parsed {
            *h.buckets.entry(k).or_insert(0) += v;
        }
    }
}

/// Parses an `idle-sim` console log.
pub fn parse_idle_sim(log: &str) -> IdleSimReport {
    let mut r = IdleSimReport::default();
    for line in log.lines() {
        let Some(body) = line.trim_end().strip_prefix("idle-sim: ") else {
            continue;
        };
        if body.starts_with("cpu ") {
            r.events += num_after(body, "events");
            r.ipis_sent += num_after(body, "ipis_sent");
            r.ipis_received += num_after(body, "ipis_received");
            r.early += num_after(body, "early");
        } else if body.starts_with("lateness_ns ") {
            parse_summary(body, &mut r.lateness);
        } else if body.starts_with("ipi_ns ") {
            parse_summary(body, &mut r.ipi);
        } else if let Some(rest) = body.strip_prefix("hist lateness") {
            parse_buckets(rest, &mut r.lateness);
        } else if let Some(rest) = body.strip_prefix("hist ipi") {
            parse_buckets(rest, &mut r.ipi);
        } else if body.starts_with("past_slack_ns ") {
            parse_summary(body, &mut r.past_slack);
        } else if let Some(rest) = body.strip_prefix("hist past_slack") {
            parse_buckets(rest, &mut r.past_slack);
        } else if body == "PASS" {
            r.passed = true;
        }
    }
    r
}

/// What one `wake-ipi` run reported (ns).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WakeIpiReport {
    /// Samples.
    pub n: u64,
    /// Smallest latency.
    pub min_ns: u64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Largest latency.
    pub max_ns: u64,
    /// Mean.
    pub mean_ns: u64,
}

/// Parses a `wake-ipi` console log; `None` without its result line.
pub fn parse_wake_ipi(log: &str) -> Option<WakeIpiReport> {
    let line = log
        .lines()
        .find(|l| l.starts_with("wake-ipi: delay_us") && l.contains("latency ns"))?;
    let body = line.split_once("latency ns")?.1;
    Some(WakeIpiReport {
        n: num_after(line, "n"),
        min_ns: num_after(body, "min"),
        p50_ns: num_after(body, "p50"),
        p90_ns: num_after(body, "p90"),
        p99_ns: num_after(body, "p99"),
        max_ns: num_after(body, "max"),
        mean_ns: num_after(body, "mean"),
    })
}

/// One timer mode of a `lapic-timer` run (`one-shot div1`, `tsc-deadline`, ...), in ns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerModeLine {
    /// The guest's name of the mode.
    pub mode: String,
    /// Interrupts measured.
    pub n: u64,
    /// Median lateness.
    pub p50_ns: i64,
    /// 99th percentile lateness.
    pub p99_ns: i64,
}

/// Parses the lateness lines of a `lapic-timer` console log
/// (`lapic-timer: MODE: n=N lateness ns min A p50 B p99 C max D`).
pub fn parse_lapic_timer(log: &str) -> Vec<TimerModeLine> {
    log.lines()
        .filter_map(|line| {
            let body = line.trim_end().strip_prefix("lapic-timer: ")?;
            let (mode, rest) = body.split_once(": n=")?;
            let (n, stats) = rest.split_once(" lateness ns ")?;
            let signed = |key: &str| word_after(stats, key)?.parse::<i64>().ok();
            Some(TimerModeLine {
                mode: mode.to_string(),
                n: n.trim().parse().ok()?,
                p50_ns: signed("p50")?,
                p99_ns: signed("p99")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
idle-sim: 2 CPUs, tsc-deadline, duration 3000 ms, mix 30:1,30:4,40:10-500, ipi 5%
idle-sim: cpu 0: events 30 ipis_sent 2 ipis_received 1 early 0
idle-sim: cpu 1: events 35 ipis_sent 1 ipis_received 2 early 1
idle-sim: lateness_ns n=65 min 56517 p50 2393488 p99 115875233 max 115875233 mean 7072620
idle-sim: hist lateness 55206-56987:1 60549-64111:63
idle-sim: hist lateness 113063846-116711067:1
idle-sim: ipi_ns n=3 min 82486 p50 185210 p99 103913617 max 103913617 mean 34724889
idle-sim: hist ipi 81920-85481:1 178086-185210:1 102122184-105769405:1
idle-sim: past_slack_ns n=65 min 0 p50 0 p99 114875233 max 114875233 mean 6100000
idle-sim: hist past_slack 0-0:64 113063846-116711067:1
idle-sim: PASS
";

    #[test]
    fn idle_sim_log_parses() {
        let r = parse_idle_sim(LOG);
        assert!(r.passed);
        assert_eq!(
            (r.events, r.ipis_sent, r.ipis_received, r.early),
            (65, 3, 3, 1)
        );
        assert_eq!(r.lateness.n, 65);
        assert_eq!(r.lateness.buckets.len(), 3);
        assert_eq!(r.lateness.max, 115_875_233);
        let s = r.lateness.summary();
        assert_eq!(s.p50_ns, 64111);
        assert_eq!(s.p99_ns, 115_875_233); // capped at the exact max
        assert_eq!(s.mean_ns, 7_072_620);
        assert_eq!(r.ipi.summary().p50_ns, 185_210);
        assert_eq!((r.past_slack.n, r.past_slack.max), (65, 114_875_233));
        assert_eq!(r.past_slack.buckets.len(), 2, "its buckets are its own");
        assert_eq!(r.past_slack.summary().p50_ns, 0);
    }

    #[test]
    fn lateness_past_a_slack_has_the_guests_own_quantiles() {
        // The log's `past_slack` is the guest's own split at 1 ms.
        let r = parse_idle_sim(LOG);
        let (past, guests) = (r.lateness.past(1_000_000), r.past_slack.summary());
        assert_eq!(
            (past.n, past.p50_ns, past.p99_ns, past.max_ns),
            (guests.n, guests.p50_ns, guests.p99_ns, guests.max_ns)
        );
        // Only the one sample past 1 ms counts towards the mean: (about 114.9 ms) / 65.
        assert!((1_700_000..1_800_000).contains(&past.mean_ns), "{past:?}");
    }

    #[test]
    fn histograms_merge() {
        let a = parse_idle_sim(LOG);
        let mut m = Histogram::default();
        m.merge(&a.lateness);
        m.merge(&a.lateness);
        assert_eq!(m.n, 130);
        assert_eq!(m.buckets[&(60549, 64111)], 126);
        assert_eq!(m.summary().mean_ns, 7_072_620);
    }

    #[test]
    fn wake_ipi_line_parses() {
        let log = "wake-ipi: count 200 delay_us 1 gap_us 1000\n\
            wake-ipi: delay_us 1: n=200 latency ns min 10 p50 20 p90 30 p99 40 max 50 mean 21\n\
            wake-ipi: PASS\n";
        let r = parse_wake_ipi(log).unwrap();
        assert_eq!(
            (r.n, r.min_ns, r.p50_ns, r.p99_ns, r.max_ns),
            (200, 10, 20, 40, 50)
        );
        assert!(parse_wake_ipi("nothing").is_none());
    }

    #[test]
    fn lapic_timer_lines_parse() {
        let log = "lapic-timer: one-shot div16: initial count 62500 (1000000 ns at bus 1000000 kHz)\n\
            lapic-timer: one-shot div16: n=10 lateness ns min 150141 p50 2763191 p99 6793310 max 6793310\n\
            lapic-timer: periodic div1: 10 interrupts over 36 periods (27 coalesced)\n\
            lapic-timer: tsc-deadline: n=12 lateness ns min -5 p50 -3 p99 811246 max 811246\n\
            lapic-timer: PASS\n";
        let lines = parse_lapic_timer(log);
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[1],
            TimerModeLine {
                mode: "tsc-deadline".into(),
                n: 12,
                p50_ns: -3,
                p99_ns: 811_246
            }
        );
        assert_eq!((lines[0].mode.as_str(), lines[0].n), ("one-shot div16", 10));
    }
}
