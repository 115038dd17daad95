//! A process's thread wake-ups: the context switches of every thread of a PID, from
//! `<root>/proc/PID/task/TID/status` (`voluntary_ctxt_switches`: the thread blocked and was
//! woken later; `nonvoluntary_ctxt_switches`: it was preempted), parsed by
//! `vmm::host::stats::context_switches` as `lull run`'s own thread statistics are. The bench
//! reads them here only: the power window's rates and the fleet's per-process totals
//! (`proc_sample`).
//!
//! `/proc/PID/status` alone counts only the main thread, so every task is read and matched by
//! TID across the window: a thread born in the window counts all its switches, one that
//! exited in it is lost with its counts (and counted as exited).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use vmm::host::stats::{context_switches, ContextSwitches};

use super::read_file::ReadFile;

/// Every thread of a process at one instant, by TID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadsSample {
    /// The process.
    pub pid: u32,
    /// Its threads.
    pub threads: BTreeMap<u32, ContextSwitches>,
}

impl ThreadsSample {
    /// The switches of all its threads.
    pub fn total(&self) -> ContextSwitches {
        self.threads
            .values()
            .fold(ContextSwitches::default(), |a, t| ContextSwitches {
                voluntary: a.voluntary + t.voluntary,
                nonvoluntary: a.nonvoluntary + t.nonvoluntary,
            })
    }
}

/// A process's context switches over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadsWindow {
    /// Voluntary switches (wake-ups after a block) per second, all threads.
    pub voluntary_per_s: f64,
    /// Nonvoluntary switches (preemptions) per second, all threads (`involuntary_per_s` in
    /// the readings of a bench before it took `/proc`'s spelling).
    #[serde(alias = "involuntary_per_s")]
    pub nonvoluntary_per_s: f64,
    /// Threads alive at the window's end.
    pub threads: usize,
    /// Threads that exited during the window (their switches are not counted).
    pub exited: usize,
}

/// Why a process's switches are not counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThreadsError {
    /// The process is not there.
    #[error("process {0} does not exist (or has exited)")]
    NoProcess(u32),
    /// It exited during the window.
    #[error("process {0} exited during the window")]
    Exited(u32),
    /// A status file lacks the counters.
    #[error("{0} has no voluntary_ctxt_switches/nonvoluntary_ctxt_switches")]
    NoCounters(String),
    /// Two samples of different processes.
    #[error("samples of processes {0} and {1} compared")]
    OtherProcess(u32, u32),
    /// The window has no length.
    #[error("the window has no length")]
    EmptyWindow,
}

/// Reads every thread of `pid` under `root` (`/` for this host).
pub fn sample(root: &Path, pid: u32, fs: &dyn ReadFile) -> Result<ThreadsSample, ThreadsError> {
    let tasks = root.join(format!("proc/{pid}/task"));
    let entries = std::fs::read_dir(&tasks).map_err(|_| ThreadsError::NoProcess(pid))?;
    let mut threads = BTreeMap::new();
    for tid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
    {
        let path = tasks.join(format!("{tid}/status"));
        // A thread that exits between the listing and the read is simply not there.
        let Ok(text) = fs.read(&path) else { continue };
        let switches = context_switches(&text)
            .ok_or_else(|| ThreadsError::NoCounters(path.display().to_string()))?;
        threads.insert(tid, switches);
    }
    if threads.is_empty() {
        return Err(ThreadsError::NoProcess(pid));
    }
    Ok(ThreadsSample { pid, threads })
}

/// The switches of `before`'s process up to `after` (`None`: it exited), `seconds` apart.
pub fn window(
    before: &ThreadsSample,
    after: Option<&ThreadsSample>,
    seconds: f64,
) -> Result<ThreadsWindow, ThreadsError> {
    let after = after.ok_or(ThreadsError::Exited(before.pid))?;
    if after.pid != before.pid {
        return Err(ThreadsError::OtherProcess(before.pid, after.pid));
    }
    if seconds <= 0.0 {
        return Err(ThreadsError::EmptyWindow);
    }
    let mut total = ContextSwitches::default();
    for (tid, now) in &after.threads {
        let then = before.threads.get(tid).copied().unwrap_or_default();
        total.voluntary += now.voluntary.saturating_sub(then.voluntary);
        total.nonvoluntary += now.nonvoluntary.saturating_sub(then.nonvoluntary);
    }
    Ok(ThreadsWindow {
        voluntary_per_s: total.voluntary as f64 / seconds,
        nonvoluntary_per_s: total.nonvoluntary as f64 / seconds,
        threads: after.threads.len(),
        exited: before
            .threads
            .keys()
            .filter(|tid| !after.threads.contains_key(tid))
            .count(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::read_file::RealFs;
    use super::super::test_tree::TempTree;
    use super::*;

    fn task(tree: &TempTree, pid: u32, tid: u32, voluntary: u64, nonvoluntary: u64) {
        tree.file(
            &format!("proc/{pid}/task/{tid}/status"),
            &format!(
                "Name:\tlull\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{tid}\n\
                 voluntary_ctxt_switches:\t{voluntary}\nnonvoluntary_ctxt_switches:\t{nonvoluntary}\n"
            ),
        );
    }

    #[test]
    fn every_thread_counts_new_ones_whole_and_exited_ones_are_named() {
        let tree = TempTree::new("threads");
        task(&tree, 40, 40, 100, 5);
        task(&tree, 40, 41, 1000, 50);
        task(&tree, 40, 42, 7, 0);
        let before = sample(tree.path(), 40, &RealFs).unwrap();
        task(&tree, 40, 40, 110, 5);
        task(&tree, 40, 41, 1300, 52);
        std::fs::remove_dir_all(tree.path().join("proc/40/task/42")).unwrap();
        task(&tree, 40, 43, 90, 1);
        let after = sample(tree.path(), 40, &RealFs).unwrap();
        let w = window(&before, Some(&after), 2.0).unwrap();
        // (10 + 300 + 90) / 2 and (0 + 2 + 1) / 2.
        assert_eq!((w.voluntary_per_s, w.nonvoluntary_per_s), (200.0, 1.5));
        assert_eq!((w.threads, w.exited), (3, 1));
        let total = after.total();
        assert_eq!(
            (total.voluntary, total.nonvoluntary),
            (110 + 1300 + 90, 5 + 52 + 1)
        );
    }

    #[test]
    fn a_missing_or_exited_process_or_a_bad_status_says_why() {
        let tree = TempTree::new("threads-missing");
        assert_eq!(
            sample(tree.path(), 9, &RealFs),
            Err(ThreadsError::NoProcess(9))
        );
        task(&tree, 9, 9, 1, 1);
        let before = sample(tree.path(), 9, &RealFs).unwrap();
        assert_eq!(window(&before, None, 1.0), Err(ThreadsError::Exited(9)));
        tree.file("proc/9/task/9/status", "Name:\tx\n");
        assert!(matches!(
            sample(tree.path(), 9, &RealFs),
            Err(ThreadsError::NoCounters(p)) if p.ends_with("task/9/status")
        ));
    }

    #[test]
    fn this_process_has_threads_that_switch() {
        let pid = std::process::id();
        let before = sample(Path::new("/"), pid, &RealFs).unwrap();
        // The block being counted: a sleeping thread always leaves its CPU voluntarily.
        std::thread::sleep(std::time::Duration::from_millis(1));
        let after = sample(Path::new("/"), pid, &RealFs).unwrap();
        assert!(after.threads.contains_key(&pid));
        let w = window(&before, Some(&after), 1.0).unwrap();
        assert!(w.voluntary_per_s >= 1.0, "{w:?}");
    }
}
