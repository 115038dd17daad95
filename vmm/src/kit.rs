//! Finding the guest kit (`make guests linux`) and the default guest, kernel command line
//! included.

use std::path::{Path, PathBuf};

/// Command line used when the user gives none.
pub const BASE_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1";
/// What a Linux guest needs on a host whose KVM is PVM-based (software virtualization with
/// guest kernel code emulated): CPU features the emulator lacks but CPUID leaks from the host.
pub const PVM_CMDLINE: &str = "noxsave clearcpuid=cx16,popcnt,rdtscp,smap,xsave mitigations=off";

/// The kit or the default guest is missing.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    /// No `--kernel` and no built kit.
    #[error("No --kernel given and the default guest is not built (looked for {0}): run `make linux`, or pass --kernel PATH")]
    NoDefaultGuest(PathBuf),
}

/// True when the host's KVM is the PVM module (all guest kernel code is emulated).
pub fn host_is_pvm() -> bool {
    Path::new("/sys/module/kvm_pvm").exists()
}

/// The kit directory: `$LULL_KIT`, else `kit/` next to the directory holding the lull binary
/// (`target/kit` for `target/debug/lull`).
pub fn kit_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LULL_KIT") {
        return PathBuf::from(dir);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().and_then(Path::parent).map(|p| p.join("kit")))
        .unwrap_or_else(|| PathBuf::from("target/kit"))
}

/// The default guest: the kit's Linux kernel and its initramfs.
pub fn default_guest() -> Result<(PathBuf, Option<PathBuf>), KitError> {
    let linux = kit_dir().join("linux");
    let kernel = linux.join("vmlinux");
    if !kernel.is_file() {
        return Err(KitError::NoDefaultGuest(kernel));
    }
    let initramfs = linux.join("initramfs.cpio.gz");
    Ok((kernel, initramfs.is_file().then_some(initramfs)))
}

/// The command line for a guest when the user gave none.
pub fn default_cmdline(pvm: bool) -> String {
    if pvm {
        format!("{BASE_CMDLINE} {PVM_CMDLINE}")
    } else {
        BASE_CMDLINE.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pvm_adds_workarounds() {
        assert_eq!(default_cmdline(false), BASE_CMDLINE);
        assert!(default_cmdline(true).ends_with(PVM_CMDLINE));
    }
}
