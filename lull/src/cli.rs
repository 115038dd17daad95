//! The `lull` command line: `lull run` (the VM's flags are [`RunArgs`]) and `lull bench`.

use clap::{Parser, Subcommand};
use vmm::cli::RunArgs;

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
  12       stopped by the user (Ctrl-A x on the console, SIGINT or SIGTERM)
  14       stopped through the management API (vm.shutdown, or vmm.shutdown of a running VM)
With --api-socket, lull exits with the status of its VM's run; if none ran, 0 after
vmm.shutdown and 12 after SIGINT or SIGTERM.";

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
    /// `idle-manager` (idle injection, CPU quota) and `boot` (boot time vs QEMU, lull's RSS).
    /// Tables on stdout, progress on stderr.
    Bench(bench::BenchArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
