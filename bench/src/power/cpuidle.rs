//! The host CPUs' idle states from `cpuidle`: how often each CPU enters each state and what
//! share of the time it stays there.
//!
//! ```text
//! sys/devices/system/cpu/
//!   cpuidle/current_governor_ro (or current_governor)   menu, teo, ladder, haltpoll
//!   cpuidle/current_driver                              intel_idle, acpi_idle, haltpoll, none
//!   cpu0/cpuidle/state0/{name,usage,time,disable}       POLL, C1, C1E, C6 ... (deeper = higher)
//!   cpu1/...                                            no cpuidle/: the CPU has no states
//! ```
//!
//! `usage` counts entries into the state (each one ends in an exit: a host wake-up), `time`
//! the microseconds spent in it. A window is the delta of two samples over the wall time.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::read_file::ReadFile;
use super::reading::Reading;

/// The counters of one idle state of one CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCounter {
    /// The state's index (`stateN`): higher is deeper.
    pub index: u32,
    /// Its name (`POLL`, `C1`, `C6`).
    pub name: String,
    /// Entries so far (`usage`).
    pub usage: u64,
    /// Microseconds spent in it so far (`time`).
    pub time_us: u64,
    /// Whether it is disabled (`disable` is not 0).
    pub disabled: bool,
}

/// One CPU's idle states at one instant, or why it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuCounters {
    /// The CPU number.
    pub cpu: u32,
    /// Its states in index order.
    pub states: Result<Vec<StateCounter>, IdleError>,
}

/// Every host CPU's idle states at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleSample {
    /// `current_governor_ro` (or `current_governor`).
    pub governor: Result<String, IdleError>,
    /// `current_driver`.
    pub driver: Result<String, IdleError>,
    /// Every CPU, in number order.
    pub cpus: Vec<CpuCounters>,
}

/// One idle state of one CPU over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateWindow {
    /// The state's index: higher is deeper.
    pub index: u32,
    /// Its name.
    pub name: String,
    /// Entries per second.
    pub entries_per_s: f64,
    /// Share of the window spent in it (0 to 1).
    pub residency: f64,
    /// Whether it was disabled at the window's end.
    pub disabled: bool,
}

/// One CPU over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuIdleWindow {
    /// The CPU number.
    pub cpu: u32,
    /// Its states, or why it has none.
    pub states: Reading<Vec<StateWindow>>,
}

/// One state (by index) summed over the CPUs that have it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateSummary {
    /// The state's index: higher is deeper.
    pub index: u32,
    /// Its name (of the first CPU that has it).
    pub name: String,
    /// Entries per second, summed over the CPUs.
    pub entries_per_s: f64,
    /// Share of the window spent in it, the mean over the CPUs.
    pub residency: f64,
}

/// Every host CPU's idle states over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleWindow {
    /// The cpuidle governor.
    pub governor: Reading<String>,
    /// The cpuidle driver.
    pub driver: Reading<String>,
    /// Every CPU.
    pub cpus: Vec<CpuIdleWindow>,
    /// Every state over the CPUs that have it, in index order.
    pub states: Vec<StateSummary>,
    /// Idle exits per second: entries of every state of every CPU.
    pub exits_per_s: f64,
    /// The deepest enabled state's residency, the mean over the CPUs that have states.
    pub deepest_residency: f64,
}

/// Why idle states are missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdleError {
    /// No CPU directory at all.
    #[error("no CPUs under sys/devices/system/cpu: is sysfs mounted?")]
    NoCpus,
    /// This CPU has no cpuidle directory.
    #[error("CPU {0} has no cpuidle states (cpuidle driver none, or idle=poll)")]
    NoCpuidle(u32),
    /// No CPU has idle states.
    #[error("no host CPU has cpuidle states (cpuidle driver none, or idle=poll)")]
    NoStates,
    /// A file could not be read.
    #[error("cannot read {0}: {1}")]
    Read(String, String),
    /// A counter is not a number.
    #[error("{0} holds {1:?}, not a number")]
    NotANumber(String, String),
    /// The CPU's states changed during the window.
    #[error("CPU {0}'s idle states changed during the window (driver reloaded or CPU offlined)")]
    Changed(u32),
    /// The CPU was not there in the first sample.
    #[error("CPU {0} came online during the window")]
    CameOnline(u32),
    /// The window has no length.
    #[error("the window has no length")]
    EmptyWindow,
}

/// Reads every CPU's idle states under `root` (`/` for this host).
pub fn sample(root: &Path, fs: &dyn ReadFile) -> Result<IdleSample, IdleError> {
    let base = root.join("sys/devices/system/cpu");
    let cpus = numbered(&base, "cpu");
    if cpus.is_empty() {
        return Err(IdleError::NoCpus);
    }
    let text = |name: &str| {
        let path = base.join("cpuidle").join(name);
        fs.read(&path)
            .map(|s| s.trim().to_string())
            .map_err(|e| IdleError::Read(path.display().to_string(), e.to_string()))
    };
    Ok(IdleSample {
        governor: text("current_governor_ro").or_else(|_| text("current_governor")),
        driver: text("current_driver"),
        cpus: cpus
            .into_iter()
            .map(|cpu| CpuCounters {
                cpu,
                states: cpu_states(&base.join(format!("cpu{cpu}/cpuidle")), cpu, fs),
            })
            .collect(),
    })
}

/// The numbers N of the entries `<prefix>N` of `dir`, sorted.
fn numbered(dir: &Path, prefix: &str) -> Vec<u32> {
    let mut numbers: Vec<u32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix(prefix)?.parse().ok())
        .collect();
    numbers.sort_unstable();
    numbers
}

fn cpu_states(dir: &Path, cpu: u32, fs: &dyn ReadFile) -> Result<Vec<StateCounter>, IdleError> {
    let indexes = numbered(dir, "state");
    if indexes.is_empty() {
        return Err(IdleError::NoCpuidle(cpu));
    }
    indexes
        .into_iter()
        .map(|index| {
            let state = dir.join(format!("state{index}"));
            let read = |name: &str| {
                let path = state.join(name);
                fs.read(&path)
                    .map(|s| (s.trim().to_string(), path.display().to_string()))
                    .map_err(|e| IdleError::Read(path.display().to_string(), e.to_string()))
            };
            let number = |name: &str| -> Result<u64, IdleError> {
                let (text, path) = read(name)?;
                text.parse().map_err(|_| IdleError::NotANumber(path, text))
            };
            Ok(StateCounter {
                index,
                name: read("name")?.0,
                usage: number("usage")?,
                time_us: number("time")?,
                // Older kernels have no `disable`: every state is enabled.
                disabled: read("disable").is_ok_and(|(t, _)| t != "0"),
            })
        })
        .collect()
}

/// The idle states from `before` to `after`, `seconds` apart.
pub fn window(
    before: &IdleSample,
    after: &IdleSample,
    seconds: f64,
) -> Result<IdleWindow, IdleError> {
    if seconds <= 0.0 {
        return Err(IdleError::EmptyWindow);
    }
    let cpus: Vec<CpuIdleWindow> = after
        .cpus
        .iter()
        .map(|c| CpuIdleWindow {
            cpu: c.cpu,
            states: Reading::from(cpu_window(before, c, seconds)),
        })
        .collect();
    let with_states: Vec<&Vec<StateWindow>> = cpus
        .iter()
        .filter_map(|c| c.states.value.as_ref())
        .collect();
    if with_states.is_empty() {
        return Err(IdleError::NoStates);
    }
    let mut states: Vec<StateSummary> = Vec::new();
    for s in with_states.iter().copied().flatten() {
        match states.iter_mut().find(|t| t.index == s.index) {
            Some(t) => {
                t.entries_per_s += s.entries_per_s;
                t.residency += s.residency;
            }
            None => states.push(StateSummary {
                index: s.index,
                name: s.name.clone(),
                entries_per_s: s.entries_per_s,
                residency: s.residency,
            }),
        }
    }
    let n = with_states.len() as f64;
    for t in &mut states {
        t.residency /= n;
    }
    states.sort_by_key(|t| t.index);
    let deepest: f64 = with_states
        .iter()
        .filter_map(|states| states.iter().rev().find(|s| !s.disabled))
        .map(|s| s.residency)
        .sum();
    Ok(IdleWindow {
        governor: Reading::from(after.governor.clone()),
        driver: Reading::from(after.driver.clone()),
        exits_per_s: states.iter().map(|t| t.entries_per_s).sum(),
        deepest_residency: deepest / n,
        cpus,
        states,
    })
}

fn cpu_window(
    before: &IdleSample,
    after: &CpuCounters,
    seconds: f64,
) -> Result<Vec<StateWindow>, IdleError> {
    let cpu = after.cpu;
    let first = before
        .cpus
        .iter()
        .find(|c| c.cpu == cpu)
        .ok_or(IdleError::CameOnline(cpu))?;
    let (from, to) = (first.states.as_ref(), after.states.as_ref());
    let (from, to) = (from.map_err(Clone::clone)?, to.map_err(Clone::clone)?);
    if from.len() != to.len() {
        return Err(IdleError::Changed(cpu));
    }
    from.iter()
        .zip(to)
        .map(|(a, b)| {
            if a.index != b.index || a.name != b.name || b.usage < a.usage || b.time_us < a.time_us
            {
                return Err(IdleError::Changed(cpu));
            }
            Ok(StateWindow {
                index: b.index,
                name: b.name.clone(),
                entries_per_s: (b.usage - a.usage) as f64 / seconds,
                residency: (b.time_us - a.time_us) as f64 / 1e6 / seconds,
                disabled: b.disabled,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::read_file::RealFs;
    use super::super::test_tree::TempTree;
    use super::*;

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/power/this-host")
    }

    /// Writes CPU `cpu`'s state `index` into `tree`.
    fn state(tree: &TempTree, cpu: u32, index: u32, name: &str, usage: u64, time: u64) {
        let dir = format!("sys/devices/system/cpu/cpu{cpu}/cpuidle/state{index}");
        tree.file(&format!("{dir}/name"), &format!("{name}\n"));
        tree.file(&format!("{dir}/usage"), &format!("{usage}\n"));
        tree.file(&format!("{dir}/time"), &format!("{time}\n"));
        tree.file(&format!("{dir}/disable"), "0\n");
    }

    #[test]
    fn this_hosts_copied_tree_parses() {
        let s = sample(&fixture(), &RealFs).unwrap();
        assert_eq!(s.governor.as_deref(), Ok("haltpoll"));
        assert_eq!(s.driver.as_deref(), Ok("haltpoll"));
        assert_eq!(s.cpus.len(), 2);
        let cpu1 = s.cpus[1].states.as_ref().unwrap();
        assert_eq!(
            cpu1[1],
            StateCounter {
                index: 1,
                name: "haltpoll idle".into(),
                usage: 513_177,
                time_us: 1_031_090_141,
                disabled: false,
            }
        );
        assert_eq!((cpu1[0].name.as_str(), cpu1[0].usage), ("POLL", 0));
    }

    #[test]
    fn a_window_gives_entries_per_second_and_residency_per_state() {
        // Two CPUs of a C1/C6 host over 2 s: CPU0 enters C1 100 times (0.2 s) and C6 40 times
        // (1.5 s); CPU1 enters C1 300 times (1 s) and C6 20 times (0.5 s).
        let tree = TempTree::new("cpuidle-window");
        tree.file("sys/devices/system/cpu/cpuidle/current_governor", "menu\n");
        tree.file(
            "sys/devices/system/cpu/cpuidle/current_driver",
            "intel_idle\n",
        );
        let write = |k: u64| {
            state(&tree, 0, 0, "C1", 1000 + 100 * k, 5_000_000 + 200_000 * k);
            state(&tree, 0, 1, "C6", 2000 + 40 * k, 9_000_000 + 1_500_000 * k);
            state(&tree, 1, 0, "C1", 3000 + 300 * k, 7_000_000 + 1_000_000 * k);
            state(&tree, 1, 1, "C6", 4000 + 20 * k, 8_000_000 + 500_000 * k);
        };
        write(0);
        let before = sample(tree.path(), &RealFs).unwrap();
        write(1);
        let after = sample(tree.path(), &RealFs).unwrap();
        let w = window(&before, &after, 2.0).unwrap();
        assert_eq!(
            w.governor.value.as_deref(),
            Some("menu"),
            "current_governor"
        );
        assert_eq!(w.driver.value.as_deref(), Some("intel_idle"));
        let cpu0 = w.cpus[0].states.value.as_ref().unwrap();
        assert_eq!((cpu0[0].entries_per_s, cpu0[0].residency), (50.0, 0.1));
        assert_eq!((cpu0[1].entries_per_s, cpu0[1].residency), (20.0, 0.75));
        assert_eq!(w.states[0].entries_per_s, 200.0);
        assert_eq!(w.states[1].entries_per_s, 30.0);
        assert_eq!(w.states[1].residency, 0.5);
        assert_eq!(w.exits_per_s, 230.0);
        assert_eq!(w.deepest_residency, 0.5);
    }

    #[test]
    fn a_cpu_without_cpuidle_is_reported_as_such() {
        let tree = TempTree::new("cpuidle-missing");
        tree.file(
            "sys/devices/system/cpu/cpuidle/current_governor_ro",
            "teo\n",
        );
        tree.file(
            "sys/devices/system/cpu/cpuidle/current_driver",
            "acpi_idle\n",
        );
        state(&tree, 0, 0, "POLL", 10, 100);
        state(&tree, 0, 1, "C1", 10, 100);
        tree.dir("sys/devices/system/cpu/cpu1");
        let before = sample(tree.path(), &RealFs).unwrap();
        state(&tree, 0, 1, "C1", 30, 500_100);
        tree.file("sys/devices/system/cpu/cpu0/cpuidle/state1/disable", "1\n");
        let after = sample(tree.path(), &RealFs).unwrap();
        let w = window(&before, &after, 1.0).unwrap();
        assert_eq!(
            w.governor.value.as_deref(),
            Some("teo"),
            "current_governor_ro"
        );
        assert_eq!(w.cpus[1].states.value, None);
        assert_eq!(
            w.cpus[1].states.reason.as_deref(),
            Some("CPU 1 has no cpuidle states (cpuidle driver none, or idle=poll)")
        );
        // Only CPU0 counts: 20 entries; C1 disabled at the end, POLL is the deepest enabled.
        assert_eq!(w.exits_per_s, 20.0);
        assert_eq!(w.states[1].residency, 0.5);
        assert_eq!(w.deepest_residency, 0.0);
    }

    #[test]
    fn no_states_anywhere_or_no_cpus_is_an_error_not_zero() {
        let tree = TempTree::new("cpuidle-none");
        assert_eq!(sample(tree.path(), &RealFs), Err(IdleError::NoCpus));
        tree.dir("sys/devices/system/cpu/cpu0");
        tree.dir("sys/devices/system/cpu/cpufreq");
        let s = sample(tree.path(), &RealFs).unwrap();
        assert_eq!(s.cpus.len(), 1, "cpufreq is no CPU");
        assert!(matches!(s.governor, Err(IdleError::Read(..))));
        assert_eq!(window(&s, &s, 1.0), Err(IdleError::NoStates));
    }

    #[test]
    fn changed_states_or_a_new_cpu_are_not_counted() {
        let tree = TempTree::new("cpuidle-changed");
        state(&tree, 0, 0, "C1", 10, 100);
        state(&tree, 1, 0, "C1", 10, 100);
        let before = sample(tree.path(), &RealFs).unwrap();
        state(&tree, 0, 0, "C1", 5, 100);
        state(&tree, 2, 0, "C1", 10, 100);
        let after = sample(tree.path(), &RealFs).unwrap();
        let w = window(&before, &after, 1.0).unwrap();
        assert_eq!(
            w.cpus[0].states.reason,
            Some(IdleError::Changed(0).to_string())
        );
        assert_eq!(
            w.cpus[2].states.reason,
            Some(IdleError::CameOnline(2).to_string())
        );
        assert_eq!(
            w.exits_per_s, 0.0,
            "CPU1 is idle-free and the only one counted"
        );
    }
}
