//! The snapshot's manifest: what the directory holds and what made it.

use serde::{Deserialize, Serialize};

use super::error::SnapshotError;
use crate::config::VmConfig;

/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";
/// The memory file's name before the unique token (`memory.TOKEN`).
pub const MEMORY: &str = "memory";

/// lull's version as a snapshot records it (all of lull's crates share the workspace's).
pub const LULL_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The snapshot format this lull writes and reads. Any change to what a snapshot holds or how
/// bumps it (3: every file of a snapshot is named by its manifest, `memory_file` included,
/// under a name unique to that snapshot).
pub const FORMAT_VERSION: u32 = 3;

/// What a snapshot holds in this format version (the manifest's `contents`): with
/// `--irqchip user` each vCPU file holds lull's LAPIC and PV registrations too, and the VM
/// file lull's IOAPIC (version 1 had neither: its user-irqchip snapshots are refused by
/// their version).
pub const CONTENTS: [&str; 6] = [
    "memory",
    "vcpu-kvm-state",
    "kvm-vm-state",
    "device-state",
    "user-lapic-state",
    "user-ioapic-state",
];

/// One region of guest memory, in the memory file in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// Guest-physical start.
    pub guest_addr: u64,
    /// Length in bytes.
    pub bytes: u64,
}

/// A disk the VM had: its image is not copied, only named and measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskRecord {
    /// The image file.
    pub path: std::path::PathBuf,
    /// Its size when the snapshot was taken.
    pub bytes: u64,
}

/// One state file (a vCPU's, the VM's KVM state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuFile {
    /// Its name in the snapshot directory (`vcpu-N.TOKEN.json`): a plain name
    /// ([`is_plain_name`]).
    pub file: String,
    /// Its size.
    pub bytes: u64,
    /// Its FNV-1a checksum.
    pub fnv64: u64,
}

/// The manifest (`manifest.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] of the lull that wrote it.
    pub format_version: u32,
    /// That lull's version.
    pub lull_version: String,
    /// The host CPU's vendor (`GenuineIntel`, `AuthenticAMD`, ...).
    pub cpu_vendor: String,
    /// The host CPU's feature flags (`flags` of /proc/cpuinfo).
    pub cpu_flags: Vec<String>,
    /// What the snapshot holds ([`CONTENTS`]).
    pub contents: Vec<String>,
    /// The VM's configuration (disks and taps by name: their contents are not copied).
    pub config: VmConfig,
    /// The configuration as the VM was created with it, if in another shape than lull's
    /// (Cloud Hypervisor's `VmConfig` sent to `vm.create`): shown by `vm.info` after a restore
    /// as before it, never read for the VM itself (that is `config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given_config: Option<serde_json::Value>,
    /// The memory file's name in the snapshot directory (`memory.TOKEN`).
    pub memory_file: String,
    /// Size of the memory file.
    pub memory_bytes: u64,
    /// Its regions, in file order.
    pub regions: Vec<Region>,
    /// One per vCPU, in vCPU order.
    pub vcpus: Vec<VcpuFile>,
    /// The disks, in `--disk` order.
    pub disks: Vec<DiskRecord>,
    /// The VM's KVM state (`kvm-vm.json`).
    pub kvm_vm: VcpuFile,
    /// The devices' state (`devices.json`).
    pub devices: VcpuFile,
}

/// The two fields read before anything else, so that another format is told as such.
#[derive(Deserialize)]
struct Versions {
    format_version: u32,
    lull_version: String,
}

impl Manifest {
    /// Parses `bytes` and checks them against this lull and a host whose CPU vendor is
    /// `host_vendor`.
    pub fn parse(bytes: &[u8], host_vendor: &str) -> Result<Self, SnapshotError> {
        let v: Versions = serde_json::from_slice(bytes).map_err(SnapshotError::ManifestJson)?;
        if v.format_version != FORMAT_VERSION {
            return Err(SnapshotError::FormatVersion {
                found: v.format_version,
                supported: FORMAT_VERSION,
                lull: v.lull_version,
            });
        }
        let running = LULL_VERSION;
        if v.lull_version != running {
            return Err(SnapshotError::LullVersion {
                found: v.lull_version,
                running,
            });
        }
        let m: Manifest = serde_json::from_slice(bytes).map_err(SnapshotError::ManifestJson)?;
        if m.cpu_vendor != host_vendor {
            return Err(SnapshotError::CpuVendor {
                found: m.cpu_vendor,
                host: host_vendor.to_string(),
            });
        }
        let total = m
            .regions
            .iter()
            .try_fold(0u64, |sum, r| sum.checked_add(r.bytes));
        if total != Some(m.memory_bytes) {
            return Err(SnapshotError::MemoryRegions(m.memory_bytes));
        }
        if usize::try_from(m.config.cpus).ok() != Some(m.vcpus.len()) {
            return Err(SnapshotError::VcpuCount {
                found: m.vcpus.len(),
                want: m.config.cpus,
            });
        }
        m.check_layout()?;
        m.check_names()?;
        Ok(m)
    }
}

impl Manifest {
    /// Fails unless the regions are exactly those of a VM of the configuration's memory size
    /// (`setup::layout::ram_ranges`): none overlaps, none is empty, none is out of order or
    /// moved, so the memory file goes into the new VM's memory as it came out of the old.
    fn check_layout(&self) -> Result<(), SnapshotError> {
        let want = crate::setup::layout::ram_ranges(self.config.memory.0);
        let same = want.len() == self.regions.len()
            && want
                .iter()
                .zip(&self.regions)
                .all(|(&(start, len), r)| r.guest_addr == start && r.bytes == len);
        if same {
            return Ok(());
        }
        Err(SnapshotError::MemoryLayout {
            memory: self.config.memory.0,
        })
    }

    /// Every file the manifest names, the memory file first.
    pub fn file_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.memory_file.as_str()).chain(
            self.vcpus
                .iter()
                .chain([&self.kvm_vm, &self.devices])
                .map(|f| f.file.as_str()),
        )
    }

    /// Fails unless every file the manifest names is a plain name in its directory
    /// ([`is_plain_name`]), named once, and not the manifest's own: a manifest cannot point
    /// outside its directory.
    fn check_names(&self) -> Result<(), SnapshotError> {
        let mut seen = std::collections::BTreeSet::new();
        for name in self.file_names() {
            if !is_plain_name(name) || name == MANIFEST || !seen.insert(name) {
                return Err(SnapshotError::VcpuFileName(name.to_string()));
            }
        }
        Ok(())
    }
}

/// Whether `name` names a file right in a directory: not empty, no `/`, not `.` or `..`, no
/// NUL, at most 255 bytes (what a reader of a snapshot takes from its manifest).
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0'])
}

impl Manifest {
    /// Fails unless the host's CPU, with `host_flags`, has every feature the snapshot's had
    /// (what KVM offered the guest came from them).
    pub fn check_cpu_flags(&self, host_flags: &[String]) -> Result<(), SnapshotError> {
        let missing: Vec<&str> = self
            .cpu_flags
            .iter()
            .filter(|f| !host_flags.contains(f))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(SnapshotError::CpuFeatures {
            count: missing.len(),
            missing: missing
                .iter()
                .take(8)
                .copied()
                .collect::<Vec<_>>()
                .join(" "),
        })
    }

    /// Fails unless every disk is where it was, a regular file (so that opening it cannot
    /// wait: a FIFO would), with the size it had.
    pub fn check_disks(&self) -> Result<(), SnapshotError> {
        for d in &self.disks {
            let missing = |source| SnapshotError::DiskMissing {
                path: d.path.clone(),
                source,
            };
            let meta = std::fs::metadata(&d.path).map_err(missing)?;
            if !meta.is_file() {
                return Err(missing(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a regular file",
                )));
            }
            let found = meta.len();
            if found != d.bytes {
                return Err(SnapshotError::DiskResized {
                    path: d.path.clone(),
                    found,
                    want: d.bytes,
                });
            }
        }
        Ok(())
    }
}

impl Manifest {
    /// Fails unless every tap the VM attaches to by name exists (`exists` says whether an
    /// interface does). A restore attaches to each by name, fd-passed ones too (the
    /// snapshot's configuration names the tap their descriptor was attached to), unless it
    /// was given a tap fd of its own for the net (`net_fds`).
    pub fn check_taps(&self, exists: impl Fn(&str) -> bool) -> Result<(), SnapshotError> {
        let mut by_name = self.config.nets.iter().filter(|n| n.fd.is_none());
        match by_name.find(|n| !exists(&n.tap)) {
            Some(n) => Err(SnapshotError::TapMissing {
                name: n.tap.clone(),
            }),
            None => Ok(()),
        }
    }
}

/// `cfg` as a snapshot's manifest records it: a net given as a descriptor is recorded by the
/// name of its tap, to which a restore attaches (no other process has the descriptor).
pub fn recorded_config(cfg: &VmConfig) -> VmConfig {
    let mut cfg = cfg.clone();
    for net in &mut cfg.nets {
        net.fd = None;
    }
    cfg
}

/// The disks of `cfg` as a snapshot records them.
pub fn disk_records(cfg: &VmConfig) -> Result<Vec<DiskRecord>, SnapshotError> {
    cfg.disks
        .iter()
        .map(|d| {
            let bytes = std::fs::metadata(&d.path)
                .map_err(|source| SnapshotError::DiskMissing {
                    path: d.path.clone(),
                    source,
                })?
                .len();
            Ok(DiskRecord {
                path: d.path.clone(),
                bytes,
            })
        })
        .collect()
}

/// The file name of vCPU `index`'s state.
pub fn vcpu_file_name(index: usize) -> String {
    format!("vcpu-{index}.json")
}
