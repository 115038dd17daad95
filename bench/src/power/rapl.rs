//! Energy from RAPL through powercap: every zone under `<root>/sys/class/powercap`.
//!
//! ```text
//! sys/class/powercap/
//!   intel-rapl            control type: no energy_uj, skipped
//!   intel-rapl:0          name = package-0   energy_uj, max_energy_range_uj
//!   intel-rapl:0:0        name = core        (a subzone of package-0)
//!   intel-rapl:0:1        name = uncore
//!   intel-rapl:0:2        name = dram
//!   intel-rapl:1          name = psys        (the whole SoC, where the firmware has it)
//! ```
//!
//! AMD's RAPL shows through the same `intel-rapl` driver (package and core). Zones overlap
//! (a package holds its cores, psys holds the packages): each is reported on its own, never
//! summed. `energy_uj` is a counter in microjoules that wraps to 0 after
//! `max_energy_range_uj`; a delta across one wrap is corrected, more than one wrap between two
//! samples (minutes at full power) cannot be seen. Since Linux 5.10 `energy_uj` is readable
//! only by root (CVE-2020-8694, the PLATYPUS power side channel).

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::read_file::ReadFile;
use super::reading::Reading;

/// The counters of one zone at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneCounter {
    /// The zone's directory name (`intel-rapl:0:1`).
    pub zone: String,
    /// What it measures (`package-0`, `core`, `uncore`, `dram`, `psys`).
    pub name: String,
    /// `energy_uj`, or why it could not be read.
    pub energy_uj: Result<u64, EnergyError>,
    /// `max_energy_range_uj` (where the counter wraps), if readable.
    pub max_range_uj: Option<u64>,
}

/// Every zone's counters at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnergySample {
    /// The zones, in directory-name order.
    pub zones: Vec<ZoneCounter>,
}

/// The energy one zone used over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZoneEnergy {
    /// The zone's directory name (`intel-rapl:0:1`).
    pub zone: String,
    /// What it measures (`package-0`, `core`, `uncore`, `dram`, `psys`).
    pub name: String,
    /// Joules used in the window.
    pub joules: Reading<f64>,
    /// Mean power in watts over the window.
    pub watts: Reading<f64>,
}

/// Why energy is not readable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnergyError {
    /// No powercap zone with an energy counter.
    #[error("no RAPL powercap zones (virtual machine or unsupported CPU)")]
    NoZones,
    /// The counter is readable only by root.
    #[error("energy_uj needs root since Linux 5.10 (CVE-2020-8694): run lull bench as root")]
    NeedsRoot(PathBuf),
    /// Another read error.
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, String),
    /// The file does not hold a number.
    #[error("{0} holds {1:?}, not a number of microjoules")]
    NotANumber(PathBuf, String),
    /// The counter went back and its range is unknown: no wrap can be corrected.
    #[error(
        "energy counter of zone {0} went back with no max_energy_range_uj to correct the wrap"
    )]
    WentBack(String),
    /// The zone was not there in the first sample.
    #[error("zone {0} appeared during the window")]
    Appeared(String),
    /// The window has no length.
    #[error("the window has no length")]
    EmptyWindow,
}

/// Reads every zone's counters under `root` (`/` for this host).
pub fn sample(root: &Path, fs: &dyn ReadFile) -> Result<EnergySample, EnergyError> {
    let dir = root.join("sys/class/powercap");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(EnergyError::NoZones),
        Err(e) => return Err(read_error(&dir, &e)),
    };
    let mut zones: Vec<ZoneCounter> = entries
        .flatten()
        .filter(|e| e.path().join("energy_uj").exists())
        .map(|e| read_zone(&e.path(), &e.file_name().to_string_lossy(), fs))
        .collect();
    if zones.is_empty() {
        return Err(EnergyError::NoZones);
    }
    zones.sort_by(|a, b| a.zone.cmp(&b.zone));
    Ok(EnergySample { zones })
}

fn read_zone(dir: &Path, zone: &str, fs: &dyn ReadFile) -> ZoneCounter {
    let name = fs
        .read(&dir.join("name"))
        .map_or_else(|_| zone.to_string(), |s| s.trim().to_string());
    ZoneCounter {
        zone: zone.to_string(),
        name,
        energy_uj: read_uj(&dir.join("energy_uj"), fs),
        max_range_uj: read_uj(&dir.join("max_energy_range_uj"), fs).ok(),
    }
}

fn read_uj(path: &Path, fs: &dyn ReadFile) -> Result<u64, EnergyError> {
    let text = fs.read(path).map_err(|e| read_error(path, &e))?;
    text.trim()
        .parse()
        .map_err(|_| EnergyError::NotANumber(path.to_path_buf(), text.trim().to_string()))
}

fn read_error(path: &Path, e: &io::Error) -> EnergyError {
    if e.kind() == io::ErrorKind::PermissionDenied {
        EnergyError::NeedsRoot(path.to_path_buf())
    } else {
        EnergyError::Read(path.to_path_buf(), e.to_string())
    }
}

/// Microjoules from `before` to `after` of a counter that wraps to 0 after `max_range`.
pub fn counter_delta(before: u64, after: u64, max_range: Option<u64>) -> Option<u64> {
    if after >= before {
        return Some(after - before);
    }
    let max = max_range.filter(|&m| m >= before)?;
    Some(max - before + after)
}

/// The energy of every zone from `before` to `after`, `seconds` apart: all zones, or why none.
pub fn window(
    before: &EnergySample,
    after: &EnergySample,
    seconds: f64,
) -> Result<Vec<ZoneEnergy>, EnergyError> {
    if seconds <= 0.0 {
        return Err(EnergyError::EmptyWindow);
    }
    let results: Vec<_> = after
        .zones
        .iter()
        .map(|z| (z, zone_joules(before, z)))
        .collect();
    // Where no zone has a reading, the first one's reason is the window's (EACCES fails all).
    if !results.iter().any(|(_, r)| r.is_ok()) {
        return Err(match results.first() {
            Some((_, Err(e))) => e.clone(),
            _ => EnergyError::NoZones,
        });
    }
    Ok(results
        .into_iter()
        .map(|(z, joules)| ZoneEnergy {
            zone: z.zone.clone(),
            name: z.name.clone(),
            watts: Reading::from(joules.clone().map(|j| j / seconds)),
            joules: Reading::from(joules),
        })
        .collect())
}

fn zone_joules(before: &EnergySample, z: &ZoneCounter) -> Result<f64, EnergyError> {
    let first = before
        .zones
        .iter()
        .find(|b| b.zone == z.zone)
        .ok_or_else(|| EnergyError::Appeared(z.zone.clone()))?;
    let from = first.energy_uj.clone()?;
    let to = z.energy_uj.clone()?;
    let uj = counter_delta(from, to, z.max_range_uj.or(first.max_range_uj))
        .ok_or_else(|| EnergyError::WentBack(z.zone.clone()))?;
    Ok(uj as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::super::read_file::RealFs;
    use super::super::test_tree::{DenyFile, TempTree};
    use super::*;

    /// A powercap tree of an Intel package with core, uncore and dram, and psys.
    fn intel(tree: &TempTree, energy: [u64; 5]) {
        tree.file("sys/class/powercap/intel-rapl/enabled", "1");
        let zones = [
            ("intel-rapl:0", "package-0"),
            ("intel-rapl:0:0", "core"),
            ("intel-rapl:0:1", "uncore"),
            ("intel-rapl:0:2", "dram"),
            ("intel-rapl:1", "psys"),
        ];
        for ((zone, name), uj) in zones.iter().zip(energy) {
            let dir = format!("sys/class/powercap/{zone}");
            tree.file(&format!("{dir}/name"), &format!("{name}\n"));
            tree.file(&format!("{dir}/energy_uj"), &format!("{uj}\n"));
            tree.file(&format!("{dir}/max_energy_range_uj"), "262143328850\n");
        }
    }

    #[test]
    fn every_zone_is_read_and_its_power_is_the_delta_over_the_window() {
        let tree = TempTree::new("rapl-intel");
        intel(&tree, [1_000_000, 500_000, 100_000, 200_000, 3_000_000]);
        let before = sample(tree.path(), &RealFs).unwrap();
        intel(
            &tree,
            [21_000_000, 8_500_000, 2_100_000, 4_200_000, 43_000_000],
        );
        let after = sample(tree.path(), &RealFs).unwrap();
        let names: Vec<_> = after.zones.iter().map(|z| z.name.as_str()).collect();
        assert_eq!(names, ["package-0", "core", "uncore", "dram", "psys"]);
        let zones = window(&before, &after, 2.0).unwrap();
        let watts: Vec<_> = zones.iter().map(|z| z.watts.value.unwrap()).collect();
        assert_eq!(watts, [10.0, 4.0, 1.0, 2.0, 20.0]);
        assert_eq!(zones[0].joules.value, Some(20.0));
    }

    #[test]
    fn a_counter_that_wraps_counts_across_the_wrap() {
        // A package and its core whose counters wrap at 2^32 - 1 microjoules.
        let tree = TempTree::new("rapl-wrap");
        let max = u64::from(u32::MAX);
        let write = |uj: u64| {
            for (zone, name) in [("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "core")] {
                let dir = format!("sys/class/powercap/{zone}");
                tree.file(&format!("{dir}/name"), name);
                tree.file(&format!("{dir}/energy_uj"), &uj.to_string());
                tree.file(&format!("{dir}/max_energy_range_uj"), &max.to_string());
            }
        };
        write(max - 3_000_000);
        let before = sample(tree.path(), &RealFs).unwrap();
        write(5_000_000);
        let after = sample(tree.path(), &RealFs).unwrap();
        let zones = window(&before, &after, 4.0).unwrap();
        assert_eq!(zones[0].joules.value, Some(8.0));
        assert_eq!(zones[1].watts.value, Some(2.0));
        assert_eq!(counter_delta(10, 4, None), None, "no range: no guess");
        assert_eq!(
            counter_delta(10, 4, Some(5)),
            None,
            "a value above the range"
        );
    }

    #[test]
    fn no_powercap_directory_or_no_zone_says_so() {
        let tree = TempTree::new("rapl-none");
        assert_eq!(sample(tree.path(), &RealFs), Err(EnergyError::NoZones));
        tree.file("sys/class/powercap/intel-rapl/enabled", "0");
        assert_eq!(sample(tree.path(), &RealFs), Err(EnergyError::NoZones));
        assert_eq!(
            EnergyError::NoZones.to_string(),
            "no RAPL powercap zones (virtual machine or unsupported CPU)"
        );
    }

    #[test]
    fn an_unreadable_counter_says_it_needs_root() {
        // Tests run as root, for whom mode 000 is no bar: the reader injects EACCES for every
        // energy_uj, as the kernel returns it to a user since 5.10.
        let tree = TempTree::new("rapl-eacces");
        intel(&tree, [1, 2, 3, 4, 5]);
        let deny = DenyFile("energy_uj");
        let before = sample(tree.path(), &deny).unwrap();
        let after = sample(tree.path(), &deny).unwrap();
        assert_eq!(after.zones[0].name, "package-0", "the names stay readable");
        let err = window(&before, &after, 1.0).unwrap_err();
        assert!(matches!(&err, EnergyError::NeedsRoot(p) if p.ends_with("intel-rapl:0/energy_uj")));
        assert!(err.to_string().contains("CVE-2020-8694"), "{err}");
    }

    #[test]
    fn one_bad_zone_keeps_the_others_and_says_why() {
        let tree = TempTree::new("rapl-one-bad");
        intel(&tree, [1_000_000, 2, 3, 4, 5]);
        let mut before = sample(tree.path(), &RealFs).unwrap();
        // uncore's range is unknown: its counter going back from 3 to 1 cannot be a wrap.
        before.zones[2].max_range_uj = None;
        intel(&tree, [3_000_000, 2, 1, 4, 5]);
        tree.file("sys/class/powercap/intel-rapl:0:2/energy_uj", "n/a\n");
        let mut after = sample(tree.path(), &RealFs).unwrap();
        after.zones[2].max_range_uj = None;
        let zones = window(&before, &after, 1.0).unwrap();
        assert_eq!(zones[0].watts.value, Some(2.0));
        assert_eq!(zones[2].joules.value, None);
        let uncore = zones[2].joules.reason.as_deref().unwrap_or_default();
        assert!(uncore.contains("went back"), "{uncore}");
        assert!(zones[3]
            .joules
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("\"n/a\""));
    }

    #[test]
    fn an_empty_window_has_no_power() {
        let tree = TempTree::new("rapl-empty");
        intel(&tree, [1, 2, 3, 4, 5]);
        let s = sample(tree.path(), &RealFs).unwrap();
        assert_eq!(window(&s, &s, 0.0), Err(EnergyError::EmptyWindow));
    }
}
