//! Finding the guest kit (`make guests linux`) and the default guest, kernel command line
//! included.

use std::path::{Path, PathBuf};

/// Command line used when the user gives none.
pub const BASE_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1";
/// What a Linux guest needs on a host whose KVM is PVM-based (software virtualization with
/// guest kernel code emulated): CPU features the emulator lacks but CPUID leaks from the host.
/// `tsc=reliable` spares Linux's clocksource watchdog, which emulated CPL0 code makes flag the
/// TSC as unstable; `rcupdate.rcu_cpu_stall_suppress=1` keeps RCU from reporting the long
/// emulated stretches as stalls (its NMI backtraces crashed a 2-vCPU boot under load).
pub const PVM_CMDLINE: &str = "noxsave clearcpuid=cx16,popcnt,rdtscp,smap,xsave mitigations=off \
     tsc=reliable rcupdate.rcu_cpu_stall_suppress=1";

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

/// The kit's default guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultGuest {
    /// The kernel (`linux/vmlinux`).
    pub kernel: PathBuf,
    /// Its initramfs, if built.
    pub initramfs: Option<PathBuf>,
    /// Its base command line (`linux/cmdline`), if the kit has one.
    pub cmdline: Option<String>,
    /// Its PVM-host workarounds (`linux/cmdline.pvm`), if the kit has them.
    pub cmdline_pvm: Option<String>,
}

/// The default guest: the kit's Linux kernel, its initramfs and its command line.
pub fn default_guest() -> Result<DefaultGuest, KitError> {
    default_guest_in(&kit_dir())
}

/// The default guest of the kit in `kit`.
pub fn default_guest_in(kit: &Path) -> Result<DefaultGuest, KitError> {
    let linux = kit.join("linux");
    let kernel = linux.join("vmlinux");
    if !kernel.is_file() {
        return Err(KitError::NoDefaultGuest(kernel));
    }
    // The uncompressed archive first: inflating gzip is minutes of emulated CPL0 on PVM hosts.
    let initramfs = ["initramfs.cpio", "initramfs.cpio.gz"]
        .iter()
        .map(|name| linux.join(name))
        .find(|p| p.is_file());
    let read = |name: &str| {
        std::fs::read_to_string(linux.join(name))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    Ok(DefaultGuest {
        kernel,
        initramfs,
        cmdline: read("cmdline"),
        cmdline_pvm: read("cmdline.pvm"),
    })
}

/// The command line for a guest when the user gave none: `base` (or [`BASE_CMDLINE`]) plus,
/// on a PVM host, `pvm_extra` (or [`PVM_CMDLINE`]).
pub fn default_cmdline(base: Option<&str>, pvm_extra: Option<&str>, pvm: bool) -> String {
    let base = base.unwrap_or(BASE_CMDLINE);
    if pvm {
        format!("{base} {}", pvm_extra.unwrap_or(PVM_CMDLINE))
    } else {
        base.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kit_without_linux_has_no_default_guest() {
        let dir = std::env::temp_dir().join(format!("kit-test-{}", std::process::id()));
        let linux = dir.join("linux");
        std::fs::create_dir_all(&linux).unwrap();
        assert!(matches!(
            default_guest_in(&dir),
            Err(KitError::NoDefaultGuest(p)) if p == linux.join("vmlinux")
        ));
        std::fs::write(linux.join("vmlinux"), b"elf").unwrap();
        std::fs::write(linux.join("initramfs.cpio.gz"), b"gz").unwrap();
        std::fs::write(linux.join("initramfs.cpio"), b"cpio").unwrap();
        std::fs::write(linux.join("cmdline"), "console=ttyS0\n").unwrap();
        let g = default_guest_in(&dir).unwrap();
        // The uncompressed initramfs wins; a missing cmdline.pvm is None.
        assert_eq!(g.initramfs, Some(linux.join("initramfs.cpio")));
        assert_eq!(g.cmdline.as_deref(), Some("console=ttyS0"));
        assert_eq!(g.cmdline_pvm, None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pvm_adds_workarounds() {
        assert_eq!(default_cmdline(None, None, false), BASE_CMDLINE);
        assert!(default_cmdline(None, None, true).ends_with(PVM_CMDLINE));
        assert_eq!(
            default_cmdline(Some("console=ttyS0 x"), Some("y"), false),
            "console=ttyS0 x"
        );
        assert_eq!(default_cmdline(Some("a"), Some("y"), true), "a y");
    }
}
