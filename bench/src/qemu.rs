//! QEMU as the bench runs it beside lull: KVM, the host CPU with an invariant TSC whose
//! frequency the guest can read (as lull tells it), no display, network or monitor, and the
//! `isa-debug-exit` port the test guests write their exit code to (QEMU exits with
//! `code * 2 + 1`, so a guest's 0 is status 1, as with lull).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// qboot, QEMU's minimal firmware: one MP-table entry per vCPU, as lull writes (SeaBIOS lists
/// one per socket, and the kit's Linux then brings up one CPU). Used where installed.
pub const QBOOT: &str = "/usr/share/qemu/qboot.rom";
/// How long the trial VM of [`can_run`] may take.
const TRIAL_TIMEOUT: Duration = Duration::from_secs(60);

/// Why QEMU cannot take part here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QemuUnusable {
    /// `qemu --version` does not run.
    #[error("{0} is not installed")]
    NotInstalled(String),
    /// A trial VM of a test guest did not end as the guest asked.
    #[error("{qemu} cannot run a guest here ({status}): {why}")]
    Fails {
        /// The QEMU binary.
        qemu: String,
        /// How it ended: `exit status N`, `killed by signal N`, `no exit`.
        status: String,
        /// Its first error line on stderr, if any.
        why: String,
    },
}

/// Whether `qemu --version` runs.
pub fn installed(qemu: &str) -> bool {
    crate::children::guard(&mut Command::new(qemu))
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether `qemu` can run VMs here: it is installed and boots `guest` (a kit test guest that
/// exits through the test port, e.g. `hello`) to its exit with status 1. On this project's
/// PVM hosts QEMU 7.2 aborts at start (`failed to set MSR 0x10a`).
pub fn can_run(qemu: &str, guest: &Path) -> Result<(), QemuUnusable> {
    if !installed(qemu) {
        return Err(QemuUnusable::NotInstalled(qemu.to_string()));
    }
    let fails = |status: String, why: String| QemuUnusable::Fails {
        qemu: qemu.to_string(),
        status,
        why,
    };
    let mut probe = command(qemu, 1, 64);
    let mut child = crate::children::guard(&mut probe)
        .args(["-serial", "null", "-kernel"])
        .arg(guest)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fails("not started".into(), e.to_string()))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < TRIAL_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fails(
                    "no exit".into(),
                    format!("still running after {TRIAL_TIMEOUT:?}"),
                ));
            }
        }
    };
    if status.code() == Some(1) {
        return Ok(());
    }
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
    }
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    };
    Err(fails(how, first_error(&stderr)))
}

/// The first line of QEMU's stderr that says what went wrong (`...: error: ...`), else the
/// first line.
fn first_error(stderr: &str) -> String {
    let lines = || stderr.lines().map(str::trim).filter(|l| !l.is_empty());
    lines()
        .find(|l| l.contains("error"))
        .or_else(|| lines().next())
        .unwrap_or("no message")
        .to_string()
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
        assert_eq!(
            can_run("/nonexistent/qemu", Path::new("/nonexistent/hello.elf")),
            Err(QemuUnusable::NotInstalled("/nonexistent/qemu".into()))
        );
    }

    #[test]
    fn the_abort_names_its_reason() {
        // QEMU 7.2's stderr on this project's PVM host (status 134, SIGABRT).
        let stderr = "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69\n\
            qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion `ret == cpu->kvm_msr_buf->nmsrs' failed.\n";
        assert_eq!(
            first_error(stderr),
            "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69"
        );
        assert_eq!(first_error("\nwarning: x\n"), "warning: x");
        assert_eq!(first_error(""), "no message");
    }
}
