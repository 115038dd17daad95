//! The `lull` command line: `lull run` (the VM's flags are [`VmArgs`], the rest [`RunArgs`])
//! and `lull bench`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use vmm::config::{Switch, VmArgs};

const EXIT_CODES_HELP: &str = "\
Exit status:
  0        the guest reset or powered off the machine
  odd      the guest wrote v to the test-exit port 0xf4: status ((v << 1) | 1) & 0xff
  2        bad command line
  4        bad input: kernel, initramfs, config file, memory size, CPU count, API socket
           path, disk image (or one another lull holds), tap device, contradictory flags,
           an output path that is an input, a serial file that cannot be written, or the
           host out of file descriptors or memory (the message says what to raise)
  6        KVM unavailable: no /dev/kvm, no permission, or a missing capability
  8        lull failed while running the guest
  10       the guest crashed (triple fault, KVM internal error or entry failure)
  12       stopped by the user (Ctrl-A x on the console, SIGINT, SIGTERM or SIGHUP)
  14       stopped through the management API (vm.shutdown, or vmm.shutdown of a running VM)
With --api-socket, lull exits with the status of its VM's run; if none ran, 0 after
vmm.shutdown and 12 after SIGINT, SIGTERM or SIGHUP.";

/// lull: a KVM virtual machine monitor whose speciality is vCPU timers and idle.
#[derive(Debug, Parser)]
#[command(name = "lull", version, about, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// lull's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Boot a guest and run it until it resets, powers off or exits through the test port.
    ///
    /// Without --kernel, lull boots the default guest of the built kit (`make guests linux`):
    /// the tiny Linux kernel with its initramfs. The console is the terminal; press Ctrl-A then
    /// x to stop the VM.
    #[command(after_help = EXIT_CODES_HELP)]
    Run(RunArgs),
    /// Measure lull against the alternatives on this host: `density` (many idle VMs per mode:
    /// host CPU, wake-ups, exits, guest timer lateness, RSS), `wakeup` (IPI wake-up latency of a
    /// halted vCPU per halt-polling mode), `timer-modes` (cost per guest timer event),
    /// `latency` (short deadlines re-armed from the guest's interrupt handler), `idle-manager`
    /// (idle injection, CPU quota) and `boot` (boot time vs QEMU, lull's RSS).
    /// Tables on stdout, progress on stderr.
    Bench(bench::BenchArgs),
}

/// Flags of `lull run`: the VM's ([`VmArgs`]), then how lull itself runs.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The flags that describe the VM, and `--config`.
    #[command(flatten)]
    pub vm: VmArgs,

    /// Serve the management API (a subset of Cloud Hypervisor's REST API: vmm.ping,
    /// vm.create, vm.boot, vm.info, vm.counters, vm.shutdown, vm.delete, vm.reboot,
    /// vm.add-net, vmm.shutdown; see docs/ORCHESTRATION.md for lull as `cloud-hypervisor`) on a Unix socket
    /// created at PATH with owner-only permissions, instead of booting at once. VM flags or
    /// --config given with it form the created VM (boot it with vm.boot); without them, the
    /// VM comes from vm.create, which checks the kernel, initramfs, disks, taps and output
    /// paths as `lull run` does and answers 400 with the reason; a VM whose vm.boot failed may
    /// be created again. lull runs until vmm.shutdown or SIGINT/SIGTERM/SIGHUP. See docs/API.md.
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,

    /// Build the VM from the snapshot in DIR (written by vm.snapshot, either irqchip mode)
    /// instead of booting a guest; the VM flags are the snapshot's: of them only this run's
    /// outputs go with --restore, --metrics (its report) and --serial (its console, off if
    /// not given: the saving run's paths are not reused), and --net tap=NAME (once per net of
    /// the snapshot, in its order: a host tap of the clone's own, the guest's MAC and device
    /// state kept). The
    /// restored VM starts paused: give --resume to run it (without --api-socket, lull needs
    /// it). With --api-socket, restore through vm.restore instead. See docs/API.md
    /// ("Snapshots").
    #[arg(long, value_name = "DIR", conflicts_with = "api_socket")]
    pub restore: Option<PathBuf>,

    /// With --restore: run the restored VM at once.
    #[arg(long, requires = "restore")]
    pub resume: bool,

    /// With --restore: how the VM gets the snapshot's memory. `map` (the default) maps the
    /// memory file copy-on-write: nothing is copied at restore, a page is read from the file
    /// when the guest first touches it and becomes the VM's own only when written, so VMs
    /// restored from one snapshot share what they have not written (the file must not change
    /// while they run: lull refuses to write a snapshot over it). `copy` copies the data in
    /// (Cloud Hypervisor's default): the VM owns all its memory at once.
    #[arg(long, value_enum, value_name = "map|copy", requires = "restore")]
    pub memory_restore: Option<vmm::config::MemoryRestoreMode>,

    /// lull's own machine code on 2 MiB pages: `on` copies lull's text into transparent huge
    /// pages at start-up, which cuts the TLB misses of a vCPU thread waking from a long sleep:
    /// 2-3 us less of lull's handling per timer event on our hosts, 1-4% of an event's CPU,
    /// too little to show in `lull bench density` (see docs/PERFORMANCE.md). It costs each
    /// lull process ~2 MiB more resident memory (a private copy instead of the shared page
    /// cache), and `perf` then cannot name lull's functions. Where the host cannot give huge
    /// pages, lull warns and runs from its file pages. Default: off.
    #[arg(long, value_enum, value_name = "on|off")]
    pub huge_text: Option<Switch>,

    /// More log output on stderr (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn api_socket_alone_describes_no_vm() {
        let parse = |argv: &[&str]| match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(args) => args,
            Command::Bench(_) => panic!("expected the run subcommand"),
        };
        let bare = parse(&["lull", "run", "--api-socket", "/tmp/s", "-v"]);
        assert_eq!(
            bare.api_socket.as_deref(),
            Some(std::path::Path::new("/tmp/s"))
        );
        assert!(!bare.vm.describes_vm());
        assert!(
            parse(&["lull", "run", "--api-socket", "/tmp/s", "--cpus", "2"])
                .vm
                .describes_vm()
        );
        assert!(parse(&["lull", "run", "--seccomp", "off"])
            .vm
            .describes_vm());
    }
}
