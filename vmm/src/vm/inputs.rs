//! What a VM configuration names on the host, checked and opened before KVM is touched, by
//! one function for `lull run` and for the API's `vm.create` ([`check`]):
//!
//! ```text
//!  guest::resolve (kernel and initramfs: regular files, a format lull boots)
//!    ─► paths::refuse_clashes (no output is an input, by device and inode)
//!    ─► disks::open (regular images, whole sectors, flock'd) ─► nets::open (taps attached)
//! ```
//! `lull run` keeps what this opens for the VM's life (the disks' locks with it); `vm.create`
//! drops it at once, so that a VM that cannot be built is refused with the reason before it is
//! created, not when it boots.

use std::path::{Path, PathBuf};

use super::disks::{self, OpenDisks};
use super::error::VmError;
use super::guest::{self, GuestImage};
pub use super::input_error::InputError;
use super::nets::{self, OpenNets};
use super::paths::{self, NamedPath};
use crate::config::{SerialMode, VmConfig};

/// The checked inputs of a VM, open.
pub struct Inputs {
    /// What to boot.
    pub image: GuestImage,
    /// The disk images, locked.
    pub disks: OpenDisks,
    /// The taps, attached.
    pub nets: OpenNets,
}

/// Paths lull uses besides the configuration's own: its `--config` file, API socket and the
/// snapshot it restores.
#[derive(Debug, Default, Clone, Copy)]
pub struct OtherPaths<'a> {
    /// `--config FILE` (an input).
    pub config: Option<&'a Path>,
    /// `--api-socket PATH` (an output).
    pub api_socket: Option<&'a Path>,
    /// The files of the snapshot being restored (inputs: `crate::snapshot::Snapshot::files`).
    pub snapshot: &'a [PathBuf],
}

/// Resolves, checks and opens every input of `cfg`; refuses an output that is an input.
pub fn check(cfg: &VmConfig, other: OtherPaths<'_>) -> Result<Inputs, VmError> {
    // The configuration's own images first, by `stat` (which never waits): resolving reads
    // the kernel, and reading a FIFO (which a snapshot's configuration may name) would wait
    // for a writer forever.
    refuse_non_files([
        ("--kernel", "kernel", cfg.kernel.as_ref()),
        ("--initramfs", "initramfs", cfg.initramfs.as_ref()),
    ])?;
    let image = guest::resolve(cfg)?;
    refuse_non_files([
        ("--kernel", "kernel", Some(&image.kernel)),
        ("--initramfs", "initramfs", image.initramfs.as_ref()),
    ])?;
    refuse_clashes(cfg, &image, other)?;
    let disks = disks::open(&cfg.disks)?;
    let nets = nets::open(&cfg.nets)?;
    Ok(Inputs { image, disks, nets })
}

/// Refuses the first of `images` (flag, what it names, path) that is not a regular file.
fn refuse_non_files(
    images: [(&'static str, &'static str, Option<&PathBuf>); 2],
) -> Result<(), VmError> {
    for (role, what, path) in images {
        if let Some(path) = path.filter(|p| !p.is_file()) {
            return Err(InputError::NotAFile {
                role,
                what,
                path: path.clone(),
            }
            .into());
        }
    }
    Ok(())
}

/// Refuses `cfg` if an output it names (metrics, serial file, API socket) is one of its
/// inputs (kernel, initramfs, config file, disk images, the snapshot it restores) or another
/// output.
pub fn refuse_clashes(
    cfg: &VmConfig,
    image: &GuestImage,
    other: OtherPaths<'_>,
) -> Result<(), VmError> {
    let mut inputs = vec![NamedPath::new("--kernel", &image.kernel)];
    if let Some(p) = &image.initramfs {
        inputs.push(NamedPath::new("--initramfs", p));
    }
    if let Some(p) = other.config {
        inputs.push(NamedPath::new("--config", p));
    }
    inputs.extend(cfg.disks.iter().map(|d| NamedPath::new("--disk", &d.path)));
    inputs.extend(
        other
            .snapshot
            .iter()
            .map(|p| NamedPath::new("--restore", p)),
    );
    let mut outputs = Vec::new();
    if let Some(p) = cfg.metrics.as_deref().filter(|p| p.as_os_str() != "-") {
        outputs.push(NamedPath::new("--metrics", p));
    }
    if let SerialMode::File(p) = &cfg.serial {
        outputs.push(NamedPath::new("--serial", p));
    }
    if let Some(p) = other.api_socket {
        outputs.push(NamedPath::new("--api-socket", p));
    }
    let log = paths::process_outputs();
    if let Some(p) = &log {
        outputs.push(NamedPath::new("--log-file", p));
    }
    paths::refuse_clashes(&inputs, &outputs).map_err(|e| VmError::Input(e.into()))
}

/// Refuses the log file `log` (`lull ch --log-file`) if it is one of the files `cfg` names
/// (kernel, initramfs, disks, metrics, serial file) or of the snapshot in `restore`: checked
/// before the log is opened, so that nothing is appended to an input.
pub fn check_log_file(
    cfg: &VmConfig,
    log: Option<&Path>,
    restore: Option<&Path>,
) -> Result<(), VmError> {
    let Some(log) = log else {
        return Ok(());
    };
    let mut inputs = Vec::new();
    if let Some(p) = &cfg.kernel {
        inputs.push(NamedPath::new("--kernel", p));
    }
    if let Some(p) = &cfg.initramfs {
        inputs.push(NamedPath::new("--initramfs", p));
    }
    inputs.extend(cfg.disks.iter().map(|d| NamedPath::new("--disk", &d.path)));
    let snapshot_files: Vec<PathBuf> = restore
        .map(|dir| match crate::snapshot::read(dir) {
            Ok(s) => s.files(),
            Err(_) => vec![dir.join(crate::snapshot::MANIFEST)],
        })
        .unwrap_or_default();
    inputs.extend(
        snapshot_files
            .iter()
            .map(|p| NamedPath::new("--restore", p)),
    );
    let mut outputs = Vec::new();
    if let Some(p) = cfg.metrics.as_deref().filter(|p| p.as_os_str() != "-") {
        outputs.push(NamedPath::new("--metrics", p));
    }
    if let SerialMode::File(p) = &cfg.serial {
        outputs.push(NamedPath::new("--serial", p));
    }
    outputs.push(NamedPath::new("--log-file", log));
    paths::refuse_clashes(&inputs, &outputs).map_err(|e| VmError::Input(e.into()))
}
