//! Which kernel, initramfs and command line a VM boots: the user's, or the kit's default
//! guest with the command line this host needs.

use std::path::PathBuf;

use crate::config::VmConfig;
use crate::kit::{self, KitError};
use crate::setup::boot::{self, BootError};

/// What to boot.
#[derive(Debug, Clone)]
pub struct GuestImage {
    /// The kernel.
    pub kernel: PathBuf,
    /// The initramfs, if any.
    pub initramfs: Option<PathBuf>,
    /// The kernel command line.
    pub cmdline: String,
}

/// Why the guest cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The kit is missing.
    #[error(transparent)]
    Kit(#[from] KitError),
    /// The kernel or initramfs cannot be used.
    #[error(transparent)]
    Boot(#[from] BootError),
}

/// The kernel, initramfs and command line to boot for `cfg`.
pub fn resolve(cfg: &VmConfig) -> Result<GuestImage, GuestError> {
    let pvm = kit::host_is_pvm();
    let (kernel, kit_initramfs, kit_cmdline, kit_pvm) = match &cfg.kernel {
        Some(k) => (k.clone(), None, None, None),
        None => {
            let g = kit::default_guest()?;
            (g.kernel, g.initramfs, g.cmdline, g.cmdline_pvm)
        }
    };
    let initramfs = cfg.initramfs.clone().or(kit_initramfs);
    let format = boot::probe(&kernel, initramfs.as_deref())?;
    let cmdline = match &cfg.cmdline {
        Some(c) => {
            if pvm && c.contains("console=") && !c.contains("clearcpuid") {
                tracing::warn!(
                    "this host's KVM is PVM-based; a Linux guest needs `{}` on its command line",
                    kit::PVM_CMDLINE
                );
            }
            c.clone()
        }
        // A multiboot test image gets what QEMU's -kernel gives it without -append: no
        // arguments (kvm-unit-tests take their argv as test names).
        None if format == boot::KernelFormat::Multiboot => String::new(),
        None => kit::default_cmdline(kit_cmdline.as_deref(), kit_pvm.as_deref(), pvm),
    };
    // Linux (and lull's PVH test guests) find virtio-mmio devices on the command line (the
    // disks, then the nets); a multiboot image's command line is its argv, left as given.
    let cmdline = match (
        format,
        super::disks::cmdline_params(cfg.disks.len() + cfg.nets.len()),
    ) {
        (boot::KernelFormat::Multiboot, _) => cmdline,
        (_, params) if params.is_empty() => cmdline,
        (_, params) if cmdline.is_empty() => params,
        (_, params) => format!("{cmdline} {params}"),
    };
    Ok(GuestImage {
        kernel,
        initramfs,
        cmdline,
    })
}
