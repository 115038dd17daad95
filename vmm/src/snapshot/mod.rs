//! Snapshots of a paused VM (`vm.snapshot {"destination_url": "file:///DIR"}`): a directory
//! lull writes and reads back, versioned, checked on the way in.
//!
//! ```text
//!  DIR/manifest.json         format version, lull's version, the host's CPU vendor, the VM's
//!                            configuration, its disks by path and size (images are not
//!                            copied), the name of every other file of the snapshot, the
//!                            memory file's regions and size, each state file's size and
//!                            FNV-1a checksum
//!  DIR/memory.TOKEN          guest memory, region after region, sparse: a page of zeros is a
//!                            hole; a restore maps it copy-on-write ([`mapped`]) or copies it in
//!  DIR/vcpu-N.TOKEN.json     vCPU N's KVM state (`vcpu::state::VcpuKvmState`; KVM's LAPIC too
//!                            with `--irqchip kernel`, lull's LAPIC and PV EOI / PV deadline
//!                            registrations with `--irqchip user`: `irqchip::user::saved`)
//!  DIR/kvm-vm.TOKEN.json     the VM's KVM state ([`kvm_vm::KvmVmState`]: PICs, IOAPIC and PIT
//!                            with `--irqchip kernel`, lull's IOAPIC with `--irqchip user`,
//!                            kvmclock at the pause)
//!  DIR/devices.TOKEN.json    the devices' state ([`devices::DevicesState`]: the serial port's
//!                            registers and unread input; each virtio-mmio device's registers,
//!                            queues with their next available and used index, InterruptStatus
//!                            and rate-limiter buckets)
//! ```
//!
//! TOKEN is new for every snapshot, so writing one never opens an existing file: the new files
//! are created beside the old snapshot's, synced, and the new manifest renamed over the old one
//! (`commit`); a crash leaves the old snapshot or the new one, never a mix.
//!
//! The reader ([`read`]) takes every file name from the manifest and refuses a name that is
//! not a plain name in the directory; it opens every file without following a link and
//! without blocking (a FIFO, a device or a directory is refused, never waited on: see
//! `host::files`). It refuses, with an error that says what to do, a manifest of another
//! format or lull version, a snapshot from a CPU of another vendor or with a CPU feature this
//! host lacks, memory regions that are not the layout of the VM's memory size, a memory file
//! whose size is not the manifest's (truncated or replaced), a disk missing or resized since,
//! a tap missing, a vCPU or device file whose checksum or content is wrong,
//! and files too large to be a manifest or a vCPU's state; it never panics on what it reads
//! (the `snapshot` fuzz target feeds [`parse_manifest`], [`parse_vcpu`] and
//! [`parse_devices`], and restores what the last accepts onto a virtio device). A tap the VM
//! attaches to by name must exist on this host (a restore never creates one): the
//! snapshot's, or the one the caller gives a clone's net instead ([`read_with_taps`],
//! `config::restore_nets`); a net given a tap fd needs no name.
//!
//! What a restore trusts: a snapshot is guest state, not an instruction to the host. The
//! outputs its configuration names (the saving run's `--metrics` and `--serial file=`) are
//! that run's and are dropped by [`read`]; a restore writes only where its own caller says.
//!
//! lull's LAPIC timers are held in guest time (a count's time left, a TSC deadline's value):
//! the timer queues and hierarchy are not saved but rebuilt, each vCPU arming its restored
//! LAPIC timer through the normal path. A saved LAPIC or IOAPIC is checked field by field when
//! it is restored (`devices::lapic::LapicState`, `devices::ioapic::IoApicState`), and the
//! fuzz target feeds those checks too. The manifest lists what a snapshot holds in `contents`.

pub mod commit;
pub mod devices;
mod error;
pub mod kvm_vm;
pub mod manifest;
pub mod mapped;
pub mod memory;

use std::io::Read;
use std::path::{Path, PathBuf};

pub use error::SnapshotError;
pub use manifest::{Manifest, VcpuFile, FORMAT_VERSION, LULL_VERSION};

use crate::config::NetConfig;
use crate::vcpu::state::VcpuKvmState;

pub use error::MAX_SMALL_FILE;
pub use manifest::{MANIFEST, MEMORY};

/// A snapshot read back and checked.
///
/// Its configuration is the saved VM's, but for its outputs: where the saving run wrote its
/// report (`metrics`) and its console (`serial`, a file) are that run's outputs, not part of
/// the VM, so [`read`] clears the report and turns a console file off; a restore writes them
/// only where its own caller says (`lull run --restore DIR --metrics PATH --serial file=PATH`,
/// `vm.restore`'s `serial`).
#[derive(Debug)]
pub struct Snapshot {
    /// The directory it was read from.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Each vCPU's KVM state, in vCPU order.
    pub vcpus: Vec<VcpuKvmState>,
    /// The VM's KVM state.
    pub kvm_vm: kvm_vm::KvmVmState,
    /// The devices' state.
    pub devices: devices::DevicesState,
    /// The memory file.
    pub memory: PathBuf,
}

impl Snapshot {
    /// The files of the snapshot that a restore reads: no output of the restored run may be
    /// one of them (a `--metrics` written over `memory` would destroy the snapshot).
    pub fn files(&self) -> Vec<PathBuf> {
        let state = self
            .manifest
            .vcpus
            .iter()
            .chain([&self.manifest.kvm_vm, &self.manifest.devices])
            .map(|entry| self.dir.join(&entry.file));
        [self.dir.join(MANIFEST), self.memory.clone()]
            .into_iter()
            .chain(state)
            .collect()
    }
}

/// 64-bit FNV-1a of `bytes`: a check against corruption, not against tampering.
pub fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The value of the first `key` line of /proc/cpuinfo (`vendor_id`, `flags`).
fn cpuinfo(key: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
}

/// The host CPU's vendor (`vendor_id` of /proc/cpuinfo), or "unknown".
pub fn host_cpu_vendor() -> String {
    cpuinfo("vendor_id").unwrap_or_else(|| "unknown".to_string())
}

/// The host CPU's feature flags (`flags` of /proc/cpuinfo), sorted.
pub fn host_cpu_flags() -> Vec<String> {
    let mut flags: Vec<String> = cpuinfo("flags")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    flags.sort();
    flags
}

/// Reads a small file (a manifest, a vCPU's state), refusing one over [`MAX_SMALL_FILE`].
fn read_small(path: &Path) -> Result<Vec<u8>, SnapshotError> {
    let io = |what| {
        move |source| SnapshotError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    let file = crate::host::files::open_input(path).map_err(io("open"))?;
    let mut bytes = Vec::new();
    file.take(MAX_SMALL_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(io("read"))?;
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if len > MAX_SMALL_FILE {
        return Err(SnapshotError::TooLarge {
            path: path.to_path_buf(),
            bytes: len,
        });
    }
    Ok(bytes)
}

/// Checks a state file's bytes against its manifest entry and parses them.
fn parse_state<T: serde::de::DeserializeOwned>(
    entry: &VcpuFile,
    path: &Path,
    bytes: &[u8],
) -> Result<T, SnapshotError> {
    if u64::try_from(bytes.len()).ok() != Some(entry.bytes) || fnv64(bytes) != entry.fnv64 {
        return Err(SnapshotError::VcpuChecksum {
            path: path.to_path_buf(),
        });
    }
    serde_json::from_slice(bytes).map_err(|source| SnapshotError::VcpuJson {
        path: path.to_path_buf(),
        source,
    })
}

/// Checks the VM state file's bytes against the manifest's entry and parses them.
pub fn parse_kvm_vm(
    entry: &VcpuFile,
    path: &Path,
    bytes: &[u8],
) -> Result<kvm_vm::KvmVmState, SnapshotError> {
    parse_state(entry, path, bytes)
}

/// Checks the devices' state file's bytes against the manifest's entry and parses them,
/// refusing a state that does not list one virtio device per disk and net of `cfg`.
pub fn parse_devices(
    entry: &VcpuFile,
    path: &Path,
    bytes: &[u8],
    cfg: &crate::config::VmConfig,
) -> Result<devices::DevicesState, SnapshotError> {
    let state: devices::DevicesState = parse_state(entry, path, bytes)?;
    state.check_count(cfg)?;
    Ok(state)
}

/// Checks one vCPU file's bytes against the manifest's entry `index` and parses them.
pub fn parse_vcpu(
    index: usize,
    entry: &VcpuFile,
    path: &Path,
    bytes: &[u8],
) -> Result<VcpuKvmState, SnapshotError> {
    let state: VcpuKvmState = parse_state(entry, path, bytes)?;
    if usize::try_from(state.id).ok() != Some(index) {
        return Err(SnapshotError::VcpuId {
            index,
            found: state.id,
        });
    }
    Ok(state)
}

/// Parses and checks a manifest (versions first, so that another format gets that error).
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest, SnapshotError> {
    Manifest::parse(bytes, &host_cpu_vendor())
}

/// Why [`read_with_taps`] failed.
#[derive(Debug)]
pub enum ReadError<E> {
    /// The snapshot is refused.
    Snapshot(SnapshotError),
    /// The caller's taps for its nets are.
    Taps(E),
}

/// Reads the snapshot in `dir` and checks every file against its manifest; drops the saving
/// run's outputs (see [`Snapshot`]).
pub fn read(dir: &Path) -> Result<Snapshot, SnapshotError> {
    read_with_taps(dir, |nets| Ok::<_, std::convert::Infallible>(nets.to_vec())).map_err(
        |e| match e {
            ReadError::Snapshot(e) => e,
            ReadError::Taps(never) => match never {},
        },
    )
}

/// [`read`], the VM's nets given the host taps `taps` returns for them (a clone's own:
/// `config::restore_nets`) before the taps are checked to exist.
pub fn read_with_taps<E>(
    dir: &Path,
    taps: impl FnOnce(&[NetConfig]) -> Result<Vec<NetConfig>, E>,
) -> Result<Snapshot, ReadError<E>> {
    let mut manifest = read_manifest(dir).map_err(ReadError::Snapshot)?;
    manifest.config.nets = taps(&manifest.config.nets).map_err(ReadError::Taps)?;
    read_rest(dir, manifest).map_err(ReadError::Snapshot)
}

/// The manifest in `dir`, checked against the memory file, the host's CPU and the disks.
fn read_manifest(dir: &Path) -> Result<Manifest, SnapshotError> {
    let mut manifest = parse_manifest(&read_small(&dir.join(MANIFEST))?)?;
    manifest.config.metrics = None;
    if matches!(manifest.config.serial, crate::config::SerialMode::File(_)) {
        manifest.config.serial = crate::config::SerialMode::Off;
    }
    let memory = dir.join(&manifest.memory_file);
    let found = crate::host::files::open_input(&memory)
        .and_then(|file| file.metadata())
        .map_err(|source| SnapshotError::Io {
            what: "open",
            path: memory.clone(),
            source,
        })?
        .len();
    if found != manifest.memory_bytes {
        return Err(SnapshotError::MemorySize {
            path: memory,
            found,
            want: manifest.memory_bytes,
        });
    }
    manifest.check_cpu_flags(&host_cpu_flags())?;
    manifest.check_disks()?;
    Ok(manifest)
}

/// The rest of the snapshot in `dir` of `manifest`, its taps checked first.
fn read_rest(dir: &Path, manifest: Manifest) -> Result<Snapshot, SnapshotError> {
    manifest.check_taps(crate::host::sys::tap::interface_exists)?;
    let memory = dir.join(&manifest.memory_file);
    let mut vcpus = Vec::new();
    for (index, entry) in manifest.vcpus.iter().enumerate() {
        let path = dir.join(&entry.file);
        vcpus.push(parse_vcpu(index, entry, &path, &read_small(&path)?)?);
    }
    let path = dir.join(&manifest.kvm_vm.file);
    let kvm_vm = parse_kvm_vm(&manifest.kvm_vm, &path, &read_small(&path)?)?;
    let path = dir.join(&manifest.devices.file);
    let devices = parse_devices(
        &manifest.devices,
        &path,
        &read_small(&path)?,
        &manifest.config,
    )?;
    Ok(Snapshot {
        dir: dir.to_path_buf(),
        manifest,
        vcpus,
        kvm_vm,
        devices,
        memory,
    })
}

#[cfg(test)]
mod tests;
