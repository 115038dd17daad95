//! `vm.snapshot` of a paused VM: every vCPU hands its KVM state over from its thread (the
//! pause gate's `save_all`), the devices hand over theirs (quiesced since the pause: see
//! `snapshot::devices`), guest memory goes to a sparse file, each under a new name, and the
//! manifest last, renamed over the old one (`snapshot::commit`: a crash leaves the old
//! snapshot or the new one). The format is `crate::snapshot`'s.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use timer::lock;

use super::live::LiveVm;
use super::pause_resume::PAUSE_TIMEOUT;
use crate::config::VmConfig;
use crate::snapshot::commit::NewSnapshot;
use crate::snapshot::devices::DevicesState;
use crate::snapshot::kvm_vm::{self, KvmVmState};
use crate::snapshot::manifest::{disk_records, recorded_config, CONTENTS};
use crate::snapshot::{self, fnv64, Manifest, SnapshotError, VcpuFile, FORMAT_VERSION};
use crate::state::pause_gate::PauseWaitError;

/// Why a snapshot was not taken.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    /// The VM runs: snapshots are of paused VMs.
    #[error("The VM is not paused: pause it (vm.pause) before vm.snapshot")]
    NotPaused,
    /// The vCPUs did not all hand over their state.
    #[error("Cannot collect the vCPUs' state: {0}")]
    Wait(#[from] PauseWaitError),
    /// Writing the snapshot failed.
    #[error(transparent)]
    Write(#[from] SnapshotError),
}

impl LiveVm {
    /// Writes a snapshot of the paused VM, configured by `cfg` (and created with `given`, if
    /// in another shape: kept for `vm.info` after a restore), into the existing directory
    /// `dir`; how long it took.
    pub fn snapshot(
        &self,
        cfg: &VmConfig,
        given: Option<&serde_json::Value>,
        dir: &Path,
    ) -> Result<Duration, TakeError> {
        let started = Instant::now();
        if !self.is_paused() {
            return Err(TakeError::NotPaused);
        }
        let mut new = NewSnapshot::begin(dir)?;
        let mut vcpus = Vec::new();
        for (index, (id, state)) in self
            .shared
            .pause
            .save_all(PAUSE_TIMEOUT)?
            .into_iter()
            .enumerate()
        {
            let bytes = state.map_err(|why| SnapshotError::Save { id, why })?;
            let file = new.name(&format!("vcpu-{index}"), "json");
            new.write(&file, &bytes)?;
            vcpus.push(VcpuFile {
                file,
                bytes: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
                fnv64: fnv64(&bytes),
            });
        }
        let mut kvm_vm = KvmVmState::capture(&self.vm, self.kvm_clock_at_pause());
        kvm_vm.user_ioapic = self.chip.save_ioapic();
        let kvm_vm = write_state(&mut new, kvm_vm::FILE, &kvm_vm)?;
        let devices =
            DevicesState::capture(lock(&self.console).save(), &self.virtio, self.restores);
        let devices = write_state(&mut new, snapshot::devices::FILE, &devices)?;
        let memory_file = new.name(snapshot::MEMORY, "");
        let (path, file) = new.create(&memory_file)?;
        let (regions, memory_bytes) = snapshot::memory::write(&self.mem, &file, &path)?;
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            lull_version: snapshot::LULL_VERSION.to_string(),
            cpu_vendor: snapshot::host_cpu_vendor(),
            cpu_flags: snapshot::host_cpu_flags(),
            contents: CONTENTS.iter().map(|c| c.to_string()).collect(),
            config: recorded_config(cfg),
            given_config: given.cloned(),
            memory_file,
            memory_bytes,
            regions,
            vcpus,
            disks: disk_records(cfg)?,
            kvm_vm,
            devices,
        };
        let text = serde_json::to_vec_pretty(&manifest).map_err(SnapshotError::ManifestJson)?;
        new.commit(&text, &super::paths::identities(&own_files(cfg)))?;
        let took = started.elapsed();
        tracing::info!(
            "snapshot of {} MiB and {} vCPU(s) written to {} in {} ms",
            memory_bytes >> 20,
            manifest.vcpus.len(),
            dir.display(),
            took.as_millis()
        );
        Ok(took)
    }
}

/// Writes `state` as JSON to the new snapshot's file for `file` (`kvm-vm.json`:
/// `kvm-vm.TOKEN.json`); its manifest entry.
fn write_state(
    new: &mut NewSnapshot,
    file: &str,
    state: &impl serde::Serialize,
) -> Result<VcpuFile, SnapshotError> {
    let bytes = serde_json::to_vec(state).map_err(SnapshotError::ManifestJson)?;
    let (stem, extension) = file.rsplit_once('.').unwrap_or((file, ""));
    let file = new.name(stem, extension);
    new.write(&file, &bytes)?;
    Ok(VcpuFile {
        file,
        bytes: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
        fnv64: fnv64(&bytes),
    })
}

/// The VM's own files (its inputs and outputs): a snapshot never removes one, whatever an old
/// manifest in its directory names.
fn own_files(cfg: &VmConfig) -> Vec<PathBuf> {
    let image = super::guest::resolve(cfg).ok();
    let mut files: Vec<PathBuf> = image
        .iter()
        .flat_map(|i| std::iter::once(i.kernel.clone()).chain(i.initramfs.clone()))
        .chain(cfg.kernel.clone())
        .chain(cfg.initramfs.clone())
        .chain(cfg.disks.iter().map(|d| d.path.clone()))
        .chain(cfg.metrics.clone())
        .collect();
    if let crate::config::SerialMode::File(p) = &cfg.serial {
        files.push(p.clone());
    }
    files.extend(super::paths::process_outputs());
    files
}
