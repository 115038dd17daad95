//! What the host says about a running VMM process, from `/proc` (parsed by `procfs-core`, as
//! `lull run`'s own statistics are): CPU time and context switches summed over its threads
//! (the switches read by [`crate::power::threads`]), resident memory, and the part of it that
//! is guest RAM.

use std::path::{Path, PathBuf};

use procfs_core::process::{MemoryMaps, Schedstat, Status};
use procfs_core::FromRead;

use crate::power::threads;
use crate::power::RealFs;

/// Cumulative counters of one process (all its live threads), read at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// CPU time of its threads in nanoseconds (`/proc/PID/task/*/schedstat`, first field).
    pub cpu_ns: u64,
    /// Voluntary context switches of its threads: each is a block followed by a wake-up.
    pub voluntary: u64,
    /// Nonvoluntary context switches (preemptions) of its threads.
    pub nonvoluntary: u64,
    /// Resident set size in KiB (`VmRSS`).
    pub rss_kib: u64,
}

fn proc_dir(pid: u32) -> PathBuf {
    Path::new("/proc").join(pid.to_string())
}

/// Reads the counters of process `pid`; `None` once it has exited.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let dir = proc_dir(pid);
    // A zombie has no memory: its threads are gone and their counters with them.
    let rss_kib = Status::from_file(dir.join("status"))
        .ok()?
        .vmrss
        .filter(|&kib| kib > 0)?;
    let switches = threads::sample(Path::new("/"), pid, &RealFs).ok()?.total();
    let mut cpu_ns = 0;
    for task in std::fs::read_dir(dir.join("task")).ok()?.flatten() {
        cpu_ns +=
            Schedstat::from_file(task.path().join("schedstat")).map_or(0, |st| st.sum_exec_runtime);
    }
    Some(ProcSample {
        cpu_ns,
        voluntary: switches.voluntary,
        nonvoluntary: switches.nonvoluntary,
        rss_kib,
    })
}

/// Resident memory of `pid` split into (guest RAM, everything else) in KiB: the guest RAM is
/// the mapping whose size is `guest_bytes` (the largest anonymous mapping of a VMM with a
/// small guest).
pub fn rss_split_kib(pid: u32, guest_bytes: u64) -> Option<(u64, u64)> {
    let maps = MemoryMaps::from_file(proc_dir(pid).join("smaps")).ok()?;
    Some(split_smaps(&maps, guest_bytes))
}

fn split_smaps(maps: &MemoryMaps, guest_bytes: u64) -> (u64, u64) {
    let (mut guest, mut other) = (0, 0);
    for m in maps.iter() {
        let kib = m.extension.map.get("Rss").copied().unwrap_or(0) / 1024;
        if m.address.1.saturating_sub(m.address.0) == guest_bytes {
            guest += kib;
        } else {
            other += kib;
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
        assert!(s.voluntary + s.nonvoluntary > 0);
    }

    #[test]
    fn a_missing_process_has_none() {
        // PIDs never exceed pid_max (at most 2^22), so this one cannot exist.
        assert_eq!(sample(i32::MAX as u32), None);
    }

    #[test]
    fn smaps_split_by_mapping_size() {
        let smaps = "\
7f0000000000-7f0004000000 rw-p 00000000 00:00 0 
Size:              65536 kB
Rss:                 120 kB
55d000000000-55d000001000 r-xp 00000000 08:01 1234                       /usr/bin/lull
Size:                  4 kB
Rss:                   4 kB
7f0004000000-7f0004002000 rw-p 00000000 00:00 0 
Size:                  8 kB
Rss:                   8 kB
";
        let maps = MemoryMaps::from_read(smaps.as_bytes()).unwrap();
        assert_eq!(split_smaps(&maps, 64 << 20), (120, 12));
    }

    #[test]
    fn this_process_splits_its_rss() {
        let (guest, other) = rss_split_kib(std::process::id(), 1).unwrap();
        assert_eq!(guest, 0, "no mapping is one byte long");
        assert!(other > 0);
    }
}
