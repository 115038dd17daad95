//! QEMU as the bench runs it beside lull: KVM, the host CPU with an invariant TSC whose
//! frequency the guest can read (as lull tells it), no display, network or monitor, and the
//! `isa-debug-exit` port the test guests write their exit code to (QEMU exits with
//! `code * 2 + 1`, so a guest's 0 is status 1, as with lull).

use std::process::Command;

/// Whether `qemu --version` runs.
pub fn installed(qemu: &str) -> bool {
    Command::new(qemu)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `qemu` with the flags every bench VM shares, for `cpus` vCPUs and `mib` MiB of RAM.
pub fn command(qemu: &str, cpus: u32, mib: u64) -> Command {
    let mut c = Command::new(qemu);
    c.args(["-enable-kvm", "-cpu", "host,+invtsc,vmware-cpuid-freq=on"])
        .args(["-smp", &cpus.to_string(), "-m", &mib.to_string()])
        .args(["-display", "none", "-monitor", "none", "-net", "none"])
        .arg("-no-reboot")
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"]);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_flags_size_the_vm() {
        let c = command("qemu-system-x86_64", 2, 128);
        let args: Vec<_> = c.get_args().map(|a| a.to_string_lossy()).collect();
        let after = |flag: &str| {
            let i = args.iter().position(|a| a == flag).unwrap();
            args[i + 1].to_string()
        };
        assert_eq!((after("-smp"), after("-m")), ("2".into(), "128".into()));
        assert_eq!(after("-device"), "isa-debug-exit,iobase=0xf4,iosize=4");
        assert!(!installed("/nonexistent/qemu"));
    }
}
