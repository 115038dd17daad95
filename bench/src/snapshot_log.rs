//! What `lull bench snapshot` reads from lull's log: its own pause and snapshot figures, and
//! the wall-clock time stamp of a line (to time a restore from the process's spawn).

use std::time::{SystemTime, UNIX_EPOCH};

use super::snapshot_report::SnapshotRow;
use super::spread::Spread;

/// lull's own figures from its log: each pause's stop time, the snapshot's time.
pub(crate) fn lull_log_figures(row: &mut SnapshotRow, log: &str) {
    row.lull_pause_us = Spread::of(lull_figures(log, "every vCPU stopped ", " us"));
    let snapshot_lines: String = log
        .lines()
        .filter(|l| l.contains("snapshot of "))
        .map(|l| format!("{l}\n"))
        .collect();
    row.lull_snapshot_ms = lull_figures(&snapshot_lines, " in ", " ms").pop();
    if row.lull_snapshot_ms.is_none() {
        row.miss(
            "lull_snapshot_ms",
            "no \"snapshot ... in N ms\" line in lull's log",
        );
    }
}

/// The numbers between `before` and `after` on the log's lines that hold both, in order.
fn lull_figures(log: &str, before: &str, after: &str) -> Vec<f64> {
    log.lines()
        .filter_map(|l| {
            let rest = l.rsplit_once(before)?.1;
            rest.split_once(after)?.0.trim().parse().ok()
        })
        .collect()
}

/// Seconds since midnight (UTC) of a log line's time stamp (`2026-12-03T22:54:34.948307Z ...`).
pub(crate) fn log_time_of_day(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let time = stamp.split_once('T')?.1.strip_suffix('Z')?;
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// ms from `t` to the later time of day `later` (seconds since midnight UTC), across midnight.
pub(crate) fn since_time_of_day(t: SystemTime, later: f64) -> f64 {
    let since_epoch = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let of_day = since_epoch % 86_400.0;
    (later - of_day).rem_euclid(86_400.0) * 1e3
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn lull_log_lines_give_its_figures() {
        let log = "2026-12-03T22:54:34.1Z  INFO VM paused: every vCPU stopped 213 us after the request\n\
                   2026-12-03T22:54:34.2Z  INFO VM resumed after 3 ms paused; guest time ran on\n\
                   2026-12-03T22:54:34.3Z  INFO VM paused: every vCPU stopped 180 us after the request\n\
                   2026-12-03T22:54:36.9Z  INFO snapshot of 256 MiB and 2 vCPU(s) written to /x in 2310 ms\n";
        assert_eq!(
            lull_figures(log, "every vCPU stopped ", " us"),
            vec![213.0, 180.0]
        );
        assert_eq!(lull_figures(log, " in ", " ms"), vec![2310.0]);
        let resumed = log.lines().find(|l| l.contains("VM resumed")).unwrap();
        let t = log_time_of_day(resumed).unwrap();
        assert!((t - (22.0 * 3600.0 + 54.0 * 60.0 + 34.2)).abs() < 1e-6);
        assert_eq!(log_time_of_day("no stamp here"), None);
    }

    #[test]
    fn time_of_day_differences_cross_midnight() {
        let t = UNIX_EPOCH + Duration::from_secs(86_400 * 3 + 86_399);
        let ms = since_time_of_day(t, 0.5);
        assert!((ms - 1500.0).abs() < 1e-6, "{ms}");
        let t = UNIX_EPOCH + Duration::from_millis(86_400_000 + 1000);
        assert!((since_time_of_day(t, 1.25) - 250.0).abs() < 1e-6);
    }
}
