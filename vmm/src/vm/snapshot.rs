//! `vm.snapshot` of a paused VM: every vCPU hands its KVM state over from its thread (the
//! pause gate's `save_all`), the devices hand over theirs (quiesced since the pause: see
//! `snapshot::devices`), guest memory goes to a sparse file, the manifest last (a directory
//! without one is no snapshot). The format is `crate::snapshot`'s.

use std::path::Path;
use std::time::{Duration, Instant};

use super::live::LiveVm;
use super::pause::PAUSE_TIMEOUT;
use crate::config::VmConfig;
use crate::snapshot::devices::DevicesState;
use crate::snapshot::kvm_vm::{self, KvmVmState};
use crate::snapshot::manifest::{disk_records, recorded_config, vcpu_file_name, CONTENTS};
use crate::snapshot::{self, fnv64, Manifest, SnapshotError, VcpuFile, FORMAT_VERSION};
use crate::state::pause::PauseWaitError;

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
    /// Writes a snapshot of the paused VM, configured by `cfg`, into the existing directory
    /// `dir`; how long it took.
    pub fn snapshot(&self, cfg: &VmConfig, dir: &Path) -> Result<Duration, TakeError> {
        let started = Instant::now();
        if !self.is_paused() {
            return Err(TakeError::NotPaused);
        }
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| SnapshotError::Io { what, path, source }
        };
        let mut vcpus = Vec::new();
        for (index, (id, state)) in self
            .shared
            .pause
            .save_all(PAUSE_TIMEOUT)?
            .into_iter()
            .enumerate()
        {
            let bytes = state.map_err(|why| SnapshotError::Save { id, why })?;
            let file = vcpu_file_name(index);
            let path = dir.join(&file);
            std::fs::write(&path, &bytes).map_err(io("write", &path))?;
            vcpus.push(VcpuFile {
                file,
                bytes: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
                fnv64: fnv64(&bytes),
            });
        }
        let mut kvm_vm = KvmVmState::capture(&self.vm, self.kvm_clock_at_pause());
        kvm_vm.user_ioapic = self.chip.save_ioapic();
        let kvm_vm = write_state(dir, kvm_vm::FILE, &kvm_vm)?;
        let devices = DevicesState::capture(&self.console, &self.buses.mmio);
        let devices = write_state(dir, snapshot::devices::FILE, &devices)?;
        let (regions, memory_bytes) =
            snapshot::memory::write(&self.mem, &dir.join(snapshot::MEMORY))?;
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            lull_version: snapshot::LULL_VERSION.to_string(),
            cpu_vendor: snapshot::host_cpu_vendor(),
            cpu_flags: snapshot::host_cpu_flags(),
            contents: CONTENTS.iter().map(|c| c.to_string()).collect(),
            config: recorded_config(cfg),
            memory_bytes,
            regions,
            vcpus,
            disks: disk_records(cfg)?,
            kvm_vm,
            devices,
        };
        let path = dir.join(snapshot::MANIFEST);
        let text = serde_json::to_vec_pretty(&manifest).map_err(SnapshotError::ManifestJson)?;
        std::fs::write(&path, text).map_err(io("write", &path))?;
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

/// Writes `state` as JSON to `dir/file`; its manifest entry.
fn write_state(
    dir: &Path,
    file: &str,
    state: &impl serde::Serialize,
) -> Result<VcpuFile, SnapshotError> {
    let bytes = serde_json::to_vec(state).map_err(SnapshotError::ManifestJson)?;
    let path = dir.join(file);
    std::fs::write(&path, &bytes).map_err(|source| SnapshotError::Io {
        what: "write",
        path,
        source,
    })?;
    Ok(VcpuFile {
        file: file.to_string(),
        bytes: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
        fnv64: fnv64(&bytes),
    })
}
