//! What a window of a benchmark costs the host in power: energy (RAPL), how often the host's
//! CPUs leave their idle states, the interrupts that wake them, the context switches of
//! chosen processes, and an external power meter. Every reader parses files under a root
//! path (`/` for this host, a fixture tree in tests).
//!
//! ```text
//! PowerProbe::start(root, pids, meter)           PowerProbe::finish() -> PowerWindow
//!   rapl        sys/class/powercap/*/energy_uj     J and W per zone
//!   cpuidle     sys/devices/system/cpu/cpu*/cpuidle entries/s and residency per state, exits/s
//!   interrupts  proc/interrupts                    LOC and RES per second
//!   threads     proc/PID/task/*/status             context switches per second per process
//!   meter       sh -c CMD, once a second           J and mean W of the samples
//! ```
//!
//! A reading that cannot be had is a [`Reading`] with no value and the reason, never a 0: a
//! virtual machine has no RAPL, a user may not read `energy_uj`, a CPU may have no cpuidle.

pub mod cpuidle;
pub mod interrupts;
pub mod meter;
pub mod rapl;
mod read_file;
mod reading;
#[cfg(test)]
pub(crate) mod test_tree;
pub mod threads;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use self::cpuidle::{IdleSample, IdleWindow};
use self::interrupts::{Interrupts, InterruptsError, Kind};
use self::meter::{Meter, MeterConfig, MeterError, MeterWindow};
use self::rapl::{EnergyError, EnergySample, ZoneEnergy};
pub use self::read_file::{ReadFile, RealFs};
pub use self::reading::Reading;
use self::threads::{ThreadsError, ThreadsSample, ThreadsWindow};

/// Why a part of the window was not measured at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PowerError {
    /// No external meter was given.
    #[error("no external power meter: pass --power-meter CMD (a command that prints watts)")]
    NoMeter,
    /// No process was given to watch.
    #[error("no process to count context switches of")]
    NoProcesses,
    /// A process's switches are missing, so their sum would be too low.
    #[error("context switches not summed: {0}")]
    Process(String),
}

/// The context switches of one process over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessSwitches {
    /// The process.
    pub pid: u32,
    /// Its threads' switches, or why they are missing.
    pub switches: Reading<ThreadsWindow>,
}

/// Everything measured over one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PowerWindow {
    /// The window's length in seconds.
    pub seconds: f64,
    /// Energy and power per RAPL zone (zones overlap: never sum them).
    pub energy: Reading<Vec<ZoneEnergy>>,
    /// Host idle states: per CPU, per state, governor and driver.
    pub idle: Reading<IdleWindow>,
    /// Host CPU idle exits per second (entries of every state of every CPU).
    pub idle_exits_per_s: Reading<f64>,
    /// Local timer interrupts per second, all host CPUs.
    pub local_timer_irqs_per_s: Reading<f64>,
    /// Rescheduling interrupts per second, all host CPUs.
    pub resched_irqs_per_s: Reading<f64>,
    /// Function call interrupts (`CAL`) per second, all host CPUs.
    #[serde(default = "Reading::not_recorded")]
    pub call_irqs_per_s: Reading<f64>,
    /// Context switches per process.
    pub processes: Vec<ProcessSwitches>,
    /// Context switches per second (voluntary and nonvoluntary) of all the processes.
    pub context_switches_per_s: Reading<f64>,
    /// The external meter's energy and mean power.
    pub meter: Reading<MeterWindow>,
}

/// Every counter of the host (under a root) and of chosen processes, read at one instant;
/// two of them make a [`PowerWindow`] ([`PowerSample::window_to`]).
#[derive(Debug, Clone)]
pub struct PowerSample {
    /// When the reading began.
    pub at: Instant,
    energy: Result<EnergySample, EnergyError>,
    idle: Result<IdleSample, cpuidle::IdleError>,
    interrupts: Result<Interrupts, InterruptsError>,
    threads: Vec<(u32, Result<ThreadsSample, ThreadsError>)>,
}

impl PowerSample {
    /// Reads the host under `root` (`/` for this one) and the threads of `pids` now.
    pub fn take(root: &Path, pids: &[u32]) -> PowerSample {
        PowerSample {
            at: Instant::now(),
            energy: rapl::sample(root, &RealFs),
            idle: cpuidle::sample(root, &RealFs),
            interrupts: interrupts::sample(root, &RealFs),
            threads: pids
                .iter()
                .map(|&pid| (pid, threads::sample(root, pid, &RealFs)))
                .collect(),
        }
    }

    /// The window from this sample to `later` (of the same processes), with the external
    /// meter's reading of that window.
    pub fn window_to(&self, later: &PowerSample, meter: Reading<MeterWindow>) -> PowerWindow {
        let seconds = later.at.saturating_duration_since(self.at).as_secs_f64();
        let processes: Vec<ProcessSwitches> = self
            .threads
            .iter()
            .map(|(pid, before)| ProcessSwitches {
                pid: *pid,
                switches: Reading::from(before.clone().and_then(|before| {
                    let after = later
                        .threads
                        .iter()
                        .find(|(p, _)| p == pid)
                        .and_then(|(_, s)| s.as_ref().ok());
                    threads::window(&before, after, seconds)
                })),
            })
            .collect();
        let idle = Reading::from(match (&self.idle, &later.idle) {
            (Ok(before), Ok(after)) => cpuidle::window(before, after, seconds),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        });
        let irq_rate = |kind| {
            Reading::from(match (&self.interrupts, &later.interrupts) {
                (Ok(before), Ok(after)) => interrupts::per_second(before, after, kind, seconds),
                (Err(e), _) | (_, Err(e)) => Err(e.clone()),
            })
        };
        PowerWindow {
            seconds,
            energy: Reading::from(match (&self.energy, &later.energy) {
                (Ok(before), Ok(after)) => rapl::window(before, after, seconds),
                (Err(e), _) | (_, Err(e)) => Err(e.clone()),
            }),
            idle_exits_per_s: Reading {
                value: idle.value.as_ref().map(|w| w.exits_per_s),
                reason: idle.reason.clone(),
            },
            idle,
            local_timer_irqs_per_s: irq_rate(Kind::LocalTimer),
            resched_irqs_per_s: irq_rate(Kind::Reschedule),
            call_irqs_per_s: irq_rate(Kind::FunctionCall),
            context_switches_per_s: Reading::from(switches_per_s(&processes)),
            processes,
            meter,
        }
    }
}

/// The first samples of a window; [`PowerProbe::finish`] takes the second and compares.
#[derive(Debug)]
pub struct PowerProbe {
    root: PathBuf,
    pids: Vec<u32>,
    first: PowerSample,
    meter: Option<Result<Meter, MeterError>>,
}

impl PowerProbe {
    /// Opens a window now: reads the host under `root` (`/` for this one), the threads of
    /// `pids`, and starts `meter` if given.
    pub fn start(root: &Path, pids: &[u32], meter: Option<MeterConfig>) -> PowerProbe {
        let meter = meter.map(Meter::start);
        PowerProbe {
            root: root.to_path_buf(),
            pids: pids.to_vec(),
            first: PowerSample::take(root, pids),
            meter,
        }
    }

    /// Closes the window now and reports it.
    pub fn finish(self) -> PowerWindow {
        let later = PowerSample::take(&self.root, &self.pids);
        let meter = match self.meter {
            None => Reading::missing(PowerError::NoMeter),
            Some(meter) => Reading::from(meter.and_then(Meter::finish)),
        };
        self.first.window_to(&later, meter)
    }
}

/// The context switches per second of all `processes`, or why one is missing.
fn switches_per_s(processes: &[ProcessSwitches]) -> Result<f64, PowerError> {
    if processes.is_empty() {
        return Err(PowerError::NoProcesses);
    }
    let mut total = 0.0;
    for p in processes {
        match &p.switches.value {
            Some(w) => total += w.voluntary_per_s + w.nonvoluntary_per_s,
            None => {
                let why = p.switches.reason.clone().unwrap_or_default();
                return Err(PowerError::Process(why));
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::test_tree::TempTree;
    use super::*;

    /// A host of 2 CPUs (CPU1 without cpuidle), one RAPL package, and process 7; `k` moves
    /// every counter on.
    fn host(tree: &TempTree, k: u64) {
        let zone = "sys/class/powercap/intel-rapl:0";
        tree.file(&format!("{zone}/name"), "package-0\n");
        tree.file(
            &format!("{zone}/energy_uj"),
            &format!("{}\n", 1_000 + 6_000_000 * k),
        );
        tree.file(&format!("{zone}/max_energy_range_uj"), "262143328850\n");
        let cpu = "sys/devices/system/cpu";
        tree.file(&format!("{cpu}/cpuidle/current_governor_ro"), "menu\n");
        tree.file(&format!("{cpu}/cpuidle/current_driver"), "intel_idle\n");
        tree.file(&format!("{cpu}/cpu0/cpuidle/state0/name"), "C1\n");
        tree.file(
            &format!("{cpu}/cpu0/cpuidle/state0/usage"),
            &format!("{}\n", 500 * k),
        );
        tree.file(
            &format!("{cpu}/cpu0/cpuidle/state0/time"),
            &format!("{}\n", 1000 * k),
        );
        tree.dir(&format!("{cpu}/cpu1"));
        let (loc, res) = (100 + 30 * k, 7 + 2 * k);
        tree.file(
            "proc/interrupts",
            &format!(
                "           CPU0       CPU1\nLOC: {loc} {loc} Local timer interrupts\n\
                 RES: {res} {res} Rescheduling interrupts\nERR: 0\n"
            ),
        );
        tree.file(
            "proc/7/task/7/status",
            &format!(
                "voluntary_ctxt_switches:\t{}\nnonvoluntary_ctxt_switches:\t1\n",
                9 * k
            ),
        );
    }

    /// `rate` over the window is `count` events.
    fn counts(rate: &Reading<f64>, seconds: f64, count: f64) -> bool {
        rate.value
            .is_some_and(|r| (r * seconds - count).abs() < 1e-6 * count.max(1.0))
    }

    #[test]
    fn a_probe_over_a_fixture_host_reports_every_reading() {
        let tree = TempTree::new("probe");
        host(&tree, 0);
        let probe = PowerProbe::start(tree.path(), &[7, 8], None);
        host(&tree, 1);
        let w = probe.finish();
        let s = w.seconds;
        assert!(s > 0.0);
        let zones = w.energy.value.as_ref().unwrap();
        assert_eq!(zones[0].joules.value, Some(6.0));
        assert!(counts(&zones[0].watts, s, 6.0), "{w:?}");
        assert!(counts(&w.idle_exits_per_s, s, 500.0), "{w:?}");
        assert!(counts(&w.local_timer_irqs_per_s, s, 60.0), "{w:?}");
        assert!(counts(&w.resched_irqs_per_s, s, 4.0), "{w:?}");
        let idle = w.idle.value.as_ref().unwrap();
        assert_eq!(idle.cpus[1].states.value, None, "CPU1 has no cpuidle");
        assert_eq!(idle.driver.value.as_deref(), Some("intel_idle"));
        let seven = w.processes[0].switches.value.as_ref().unwrap();
        assert!((seven.voluntary_per_s * s - 9.0).abs() < 1e-6, "{w:?}");
        assert_eq!(
            w.processes[1].switches.reason,
            Some(ThreadsError::NoProcess(8).to_string())
        );
        assert_eq!(
            w.context_switches_per_s.reason.as_deref(),
            Some("context switches not summed: process 8 does not exist (or has exited)")
        );
        assert_eq!(w.meter.reason, Some(PowerError::NoMeter.to_string()));
    }

    #[test]
    fn unreadable_energy_is_null_with_its_reason_in_json() {
        let tree = TempTree::new("probe-json");
        host(&tree, 0);
        std::fs::remove_dir_all(tree.path().join("sys/class/powercap")).unwrap();
        let w = PowerProbe::start(tree.path(), &[7], Some(MeterConfig::new("exit 2"))).finish();
        let json = serde_json::to_value(&w).unwrap();
        assert_eq!(
            json["energy"],
            serde_json::json!({
                "value": null,
                "reason": "no RAPL powercap zones (virtual machine or unsupported CPU)"
            })
        );
        assert!(json["meter"]["value"].is_null());
        assert!(json["meter"]["reason"]
            .as_str()
            .unwrap()
            .contains("power meter"));
        let back: PowerWindow = serde_json::from_value(json).unwrap();
        assert_eq!(back, w);
    }

    #[test]
    fn this_host_gives_its_idle_states_or_says_why_and_says_why_energy_is_missing() {
        let me = std::process::id();
        let w = PowerProbe::start(Path::new("/"), &[me], None).finish();
        if test_tree::host_has_cpuidle_states() {
            let idle = w.idle.value.as_ref().expect("this host has cpuidle states");
            assert!(!idle.states.is_empty());
            assert!(idle.cpus.iter().any(|c| c.states.value.is_some()));
            assert!(w.idle_exits_per_s.value.is_some());
            assert!(idle.governor.value.is_some() && idle.driver.value.is_some());
        } else {
            let why = Some(cpuidle::IdleError::NoStates.to_string());
            assert_eq!((w.idle.value.is_none(), &w.idle.reason), (true, &why));
            assert_eq!(w.idle_exits_per_s.reason, why);
        }
        assert!(w.local_timer_irqs_per_s.value.is_some(), "{w:?}");
        assert!(w.context_switches_per_s.value.is_some(), "{w:?}");
        if Path::new("/sys/class/powercap").exists() {
            // A hardware host: energy or the reason, never both nor neither.
            assert_ne!(w.energy.value.is_some(), w.energy.reason.is_some());
        } else {
            assert_eq!(w.energy.reason, Some(EnergyError::NoZones.to_string()));
        }
    }
}
