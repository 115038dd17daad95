//! What the host says about a running VMM process, from `/proc` (parsed by `procfs-core`, as
//! `lull run`'s own statistics are): CPU time and context switches summed over its threads
//! (the switches read by [`crate::power::threads`]), resident memory, and the part of it that
//! is guest RAM.

use std::path::{Path, PathBuf};

use procfs_core::process::{MemoryMaps, Schedstat, SmapsRollup, Status};
use procfs_core::{FromRead, Meminfo};

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

/// A process's memory as `/proc/PID/smaps_rollup` sums it, KiB.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rollup {
    /// Resident.
    pub rss: u64,
    /// Proportional set size: each page divided among the processes that map it.
    pub pss: u64,
    /// The anonymous part of the PSS (a mapped clone's written pages, a copied one's all).
    pub pss_anon: u64,
    /// The file-backed part of the PSS (a mapped clone's pages of the snapshot).
    pub pss_file: u64,
    /// Resident pages other processes map too.
    pub shared: u64,
    /// Resident pages only this process maps.
    pub private: u64,
}

/// `pid`'s memory from `/proc/PID/smaps_rollup`; `None` if it cannot be read.
pub fn rollup(pid: u32) -> Option<Rollup> {
    let r = SmapsRollup::from_file(proc_dir(pid).join("smaps_rollup")).ok()?;
    Some(rollup_of(&r.memory_map_rollup))
}

fn rollup_of(maps: &MemoryMaps) -> Rollup {
    let kib = |keys: &[&str]| -> u64 {
        maps.iter()
            .flat_map(|m| keys.iter().filter_map(|k| m.extension.map.get(*k)))
            .sum::<u64>()
            / 1024
    };
    Rollup {
        rss: kib(&["Rss"]),
        pss: kib(&["Pss"]),
        pss_anon: kib(&["Pss_Anon"]),
        pss_file: kib(&["Pss_File"]),
        shared: kib(&["Shared_Clean", "Shared_Dirty"]),
        private: kib(&["Private_Clean", "Private_Dirty"]),
    }
}

/// `pid`'s threads now.
pub fn threads(pid: u32) -> Option<u64> {
    Status::from_file(proc_dir(pid).join("status"))
        .ok()
        .map(|s| s.threads)
}

/// The threads the host can still start: the least of `kernel.threads-max` and
/// `kernel.pid_max` less the threads running (/proc/loadavg), and of this cgroup's
/// `pids.max` less its `pids.current` (cgroup v2, where it is set); `None` if none is readable.
pub fn threads_available() -> Option<u64> {
    let number =
        |path: &str| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let running: Option<u64> = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok());
    let system = running.map(|now| {
        ["/proc/sys/kernel/threads-max", "/proc/sys/kernel/pid_max"]
            .into_iter()
            .filter_map(number)
            .map(|max| max.saturating_sub(now))
            .min()
    });
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        })
        .and_then(|dir| {
            let at = |f: &str| number(&format!("/sys/fs/cgroup{}/{f}", dir.trim_end_matches('/')));
            Some(at("pids.max")?.saturating_sub(at("pids.current")?))
        });
    [system.flatten(), cgroup].into_iter().flatten().min()
}

/// The host's `MemAvailable`, KiB.
pub fn mem_available_kib() -> Option<u64> {
    Meminfo::from_file("/proc/meminfo")
        .ok()?
        .mem_available
        .map(|b| b / 1024)
}

#[cfg(test)]
mod tests {
    use procfs_core::FromBufRead;

    use super::*;

    #[test]
    fn smaps_rollup_is_summed_by_kind() {
        let text = "55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss: 12888 kB\nPss: 2008 kB\n\
                    Pss_Anon: 568 kB\nPss_File: 1440 kB\nShared_Clean: 12256 kB\n\
                    Shared_Dirty: 4 kB\nPrivate_Clean: 60 kB\nPrivate_Dirty: 572 kB\n";
        let maps = SmapsRollup::from_buf_read(text.as_bytes()).unwrap();
        assert_eq!(
            rollup_of(&maps.memory_map_rollup),
            Rollup {
                rss: 12888,
                pss: 2008,
                pss_anon: 568,
                pss_file: 1440,
                shared: 12260,
                private: 632,
            }
        );
    }

    #[test]
    fn this_host_has_room_for_threads_and_this_process_has_some() {
        assert!(threads(std::process::id()).unwrap() >= 1);
        assert!(threads_available().unwrap() > 0);
    }

    #[test]
    fn this_process_has_a_rollup_and_the_host_memory() {
        let r = rollup(std::process::id()).unwrap();
        assert!(r.rss > 0 && r.pss > 0 && r.pss <= r.rss, "{r:?}");
        assert!(mem_available_kib().unwrap() > 0);
    }

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
