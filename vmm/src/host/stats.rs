//! What the host saw of a run: per-thread context switches and CPU time from
//! `/proc/self/task` (parsed by `procfs-core`), and KVM's own exit counters from debugfs (when it is mounted).

use std::collections::BTreeMap;

use procfs_core::process::{Schedstat, Status};
use procfs_core::FromRead;

pub use lull_schema::ThreadStat;

/// A thread's context switches, as its `/proc/.../status` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContextSwitches {
    /// `voluntary_ctxt_switches`: the thread blocked and was woken later.
    pub voluntary: u64,
    /// `nonvoluntary_ctxt_switches`: it was preempted.
    pub nonvoluntary: u64,
}

/// The context switches in the text of a thread's `status` file; `None` if it lacks either
/// count. lull's one reader of them: `lull run`'s thread statistics and the bench's
/// (`bench::power::threads`) both parse through it.
pub fn context_switches(status: &str) -> Option<ContextSwitches> {
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(ContextSwitches {
        voluntary: field("voluntary_ctxt_switches")?,
        nonvoluntary: field("nonvoluntary_ctxt_switches")?,
    })
}

fn task_stat(path: &std::path::Path) -> ThreadStat {
    // procfs-core parses the rest; the files are opened here with plain read-only opens, the
    // only kind the vCPU and timer threads' seccomp filters allow (the `procfs` crate opens
    // O_PATH directory descriptors).
    let text = std::fs::read_to_string(path.join("status")).unwrap_or_default();
    let name = Status::from_read(text.as_bytes()).map_or_else(|_| String::new(), |s| s.name);
    let switches = context_switches(&text).unwrap_or_default();
    let cpu_ns = Schedstat::from_file(path.join("schedstat")).map_or(0, |s| s.sum_exec_runtime);
    ThreadStat {
        name,
        voluntary_ctxt_switches: switches.voluntary,
        nonvoluntary_ctxt_switches: switches.nonvoluntary,
        cpu_ns,
    }
}

/// The calling thread's statistics (taken by a thread just before it ends).
pub fn current_thread_stat() -> ThreadStat {
    task_stat(std::path::Path::new("/proc/thread-self"))
}

/// Every live thread of this process, plus `ended` (threads that recorded themselves before
/// ending), sorted by name.
pub fn thread_stats(ended: &[ThreadStat]) -> Vec<ThreadStat> {
    let mut out: Vec<ThreadStat> = ended.to_vec();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for task in dir.flatten() {
            let stat = task_stat(&task.path());
            if !stat.name.is_empty() && !out.iter().any(|t| t.name == stat.name) {
                out.push(stat);
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// KVM counters lull reports (names of KVM's binary statistics).
pub const KVM_STATS: &[&str] = &[
    "exits",
    "halt_exits",
    "halt_wakeup",
    "halt_successful_poll",
    "halt_attempted_poll",
    "io_exits",
    "mmio_exits",
    "irq_exits",
    "irq_window_exits",
    "request_irq_exits",
    "signal_exits",
    "irq_injections",
    "insn_emulation",
];

/// Reads the counters named in [`KVM_STATS`] from a KVM binary statistics fd
/// (`KVM_GET_STATS_FD`, Documentation/virt/kvm/api.rst "KVM_GET_STATS_FD") into `into`,
/// adding them up.
pub fn read_kvm_stats(fd: &std::fs::File, into: &mut BTreeMap<String, u64>) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let u32_at = |buf: &[u8], off: usize| -> u32 {
        buf.get(off..off + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    };
    let mut header = [0u8; 24];
    fd.read_exact_at(&mut header, 0)?;
    let name_size = u32_at(&header, 4) as usize;
    let num_desc = u32_at(&header, 8) as usize;
    let desc_offset = u64::from(u32_at(&header, 16));
    let data_offset = u64::from(u32_at(&header, 20));
    let desc_size = 16 + name_size;
    let mut descs = vec![0u8; desc_size * num_desc];
    fd.read_exact_at(&mut descs, desc_offset)?;
    for d in descs.chunks_exact(desc_size) {
        let name_bytes = &d[16..];
        let len = name_bytes
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(name_bytes.len());
        let name = String::from_utf8_lossy(&name_bytes[..len]);
        if !KVM_STATS.contains(&name.as_ref()) {
            continue;
        }
        let offset = u64::from(u32_at(d, 8));
        let mut value = [0u8; 8];
        fd.read_exact_at(&mut value, data_offset + offset)?;
        *into.entry(name.into_owned()).or_insert(0) += u64::from_le_bytes(value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_switches_need_both_counts() {
        let status = "Name:\tlull\nvoluntary_ctxt_switches:\t7\nnonvoluntary_ctxt_switches:\t2\n";
        assert_eq!(
            context_switches(status),
            Some(ContextSwitches {
                voluntary: 7,
                nonvoluntary: 2
            })
        );
        assert_eq!(
            context_switches("Name:\tlull\nvoluntary_ctxt_switches:\t7\n"),
            None
        );
    }

    #[test]
    fn this_thread_is_listed_once() {
        let me = current_thread_stat();
        assert!(!me.name.is_empty());
        let stats = thread_stats(std::slice::from_ref(&me));
        assert_eq!(stats.iter().filter(|t| t.name == me.name).count(), 1);
        assert!(stats.iter().any(|t| t.cpu_ns > 0));
    }

    #[test]
    fn a_named_thread_reports_its_name_and_counters() {
        let stat = std::thread::Builder::new()
            .name("stat-probe".into())
            .spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                current_thread_stat()
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(stat.name, "stat-probe");
        assert!(stat.voluntary_ctxt_switches >= 1, "it slept: {stat:?}");
        assert!(stat.cpu_ns > 0);
    }
}
