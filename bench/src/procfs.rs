//! What the host says about a running VMM process, from `/proc`: CPU time and context switches
//! summed over its threads, resident memory, and the part of it that is guest RAM.

use std::path::Path;

/// Cumulative counters of one process (all its live threads), read at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// CPU time of its threads in nanoseconds (`/proc/PID/task/*/schedstat`, first field).
    pub cpu_ns: u64,
    /// Voluntary context switches of its threads: each is a block followed by a wake-up.
    pub voluntary: u64,
    /// Involuntary context switches (preemptions) of its threads.
    pub nonvoluntary: u64,
    /// Resident set size in KiB (`VmRSS`).
    pub rss_kib: u64,
}

fn status_field(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Reads the counters of process `pid`; `None` once it has exited.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let base = Path::new("/proc").join(pid.to_string());
    let status = std::fs::read_to_string(base.join("status")).ok()?;
    if status_field(&status, "VmRSS:") == 0 {
        // A zombie has no memory: its threads are gone and their counters with them.
        return None;
    }
    let mut s = ProcSample {
        rss_kib: status_field(&status, "VmRSS:"),
        ..ProcSample::default()
    };
    for task in std::fs::read_dir(base.join("task")).ok()?.flatten() {
        let read = |f: &str| std::fs::read_to_string(task.path().join(f)).unwrap_or_default();
        s.cpu_ns += read("schedstat")
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let st = read("status");
        s.voluntary += status_field(&st, "voluntary_ctxt_switches:");
        s.nonvoluntary += status_field(&st, "nonvoluntary_ctxt_switches:");
    }
    Some(s)
}

/// Resident memory of `pid` split into (guest RAM, everything else) in KiB: the guest RAM is
/// the mapping whose size is `guest_bytes` (the largest anonymous mapping of a VMM with a
/// small guest), as `resources/bench/boot_time.py` does.
pub fn rss_split_kib(pid: u32, guest_bytes: u64) -> Option<(u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    Some(split_smaps(&smaps, guest_bytes))
}

fn split_smaps(smaps: &str, guest_bytes: u64) -> (u64, u64) {
    let mut guest = 0;
    let mut other = 0;
    let mut in_guest = false;
    for line in smaps.lines() {
        let mut parts = line.split_whitespace();
        let Some(first) = parts.next() else { continue };
        if let Some((lo, hi)) = first.split_once('-') {
            if !first.contains(':') {
                let size = u64::from_str_radix(hi, 16)
                    .ok()
                    .zip(u64::from_str_radix(lo, 16).ok())
                    .map_or(0, |(h, l)| h.saturating_sub(l));
                in_guest = size == guest_bytes;
                continue;
            }
        }
        if first == "Rss:" {
            let kib: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            if in_guest {
                guest += kib;
            } else {
                other += kib;
            }
        }
    }
    (guest, other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_counters() {
        let s = sample(std::process::id()).unwrap();
        assert!(s.cpu_ns > 0);
        assert!(s.rss_kib > 0);
    }

    #[test]
    fn smaps_split_by_mapping_size() {
        let smaps = "\
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
Size:              65536 kB
Rss:                 120 kB
55d000000000-55d000001000 r-xp 00000000 08:01 1234 /usr/bin/lull
Size:                  4 kB
Rss:                   4 kB
7f0004000000-7f0004002000 rw-p 00000000 00:00 0
Rss:                   8 kB
";
        assert_eq!(split_smaps(smaps, 64 << 20), (120, 12));
    }
}
