//! `lull bench`: experiments that run lull (and QEMU, where it is installed) side by side on
//! this host and report tables, JSON and an SVG plot. This crate needs nothing of the VMM:
//! `lull bench` only hands it its flags ([`BenchArgs`]) and calls [`main`].
//!
//! Every VM is a child process (`lull run ...` or `qemu-system-x86_64 ...`) booting a guest of
//! the kit (found by the `kit` crate, as `lull run` finds it); the numbers come from the
//! guests' own reports on their serial console, lull's `--metrics` JSON and `/proc`. The JSON
//! schemas are documented in `docs/bench/README.md`.
//!
//! ```text
//! density:      for N in --vms, for mode in --modes: start N VMs of --cpus vCPUs of idle-sim
//!               for --duration, sample /proc of every VMM, keep the window where all N run,
//!               parse the guests' histograms and lull's metrics -> one row per (mode, N)
//! wakeup:       for mode in --modes, for delay in --delays: one 2-vCPU VM of wake-ipi -> a row
//! timer-modes:  per rep, per mode: lapic-timer at two lengths -> costs per timer event (median)
//! idle-manager: spin under idle injection and under CPU quota -> idle shares, throughput
//! boot:         hello and the kit's Linux, lull and QEMU alternating -> boot times, lull's RSS
//! latency:      per rep, per pattern (halt, busy), per PV, per mode: idle-sim re-arming a
//!               short TSC deadline from its handler -> lateness p50/p99 vs kernel, CPU/event
//! snapshot:     per mode: pause-timers paused and resumed --reps times, snapshotted, run to
//!               its end; restored --restores times (API, --restore --resume) -> latencies,
//!               snapshot time and size, restore-to-running
//! clones:       per mode: the kit's Linux booted to its idle workload and snapshotted; restores
//!               to running (mapped, copied); fleets of --clones restored from the snapshot ->
//!               PSS, private and shared memory, MemAvailable and CPU per clone
//! global-timers: per case (all vCPUs idle, one busy), per timer model: idle-sim with a
//!               global-timer load -> global fires, who woke for them, empty wake-ups
//! ```

#![deny(unsafe_code)]

mod api_client;
mod boot;
mod children;
mod clones;
mod clones_report;
mod common;
mod density;
mod density_power;
mod density_power_row;
mod density_slack;
mod error;
mod fleet;
mod global_timers;
mod guest_output;
mod host;
mod idle_manager;
mod idle_manager_power;
mod latency;
mod latency_report;
mod linux_density;
mod linux_max_vms;
mod linux_snapshot;
mod lull_metrics;
mod max_vms;
mod max_vms_plot;
mod max_vms_report;
mod plot;
pub mod power;
mod power_args;
mod proc_sample;
mod progress;
mod qemu;
mod report;
mod single_run;
mod slo;
mod snapshot;
mod snapshot_log;
mod snapshot_report;
mod spread;
mod timer_modes;
mod units;
mod wakeup;
mod window;
mod workload_output;
mod workload_rates;

use std::process::ExitCode;

use clap::{Args, Subcommand};

pub use boot::{BootArgs, BootReport, BOOT_SCHEMA};
pub use clones::{ClonesArgs, MemoryMode};
pub use clones_report::{ClonesReport, CLONES_SCHEMA};
pub use common::CommonArgs;
pub use density::{DensityArgs, Mode};
pub use error::{BenchError, EXIT_BAD_INPUT, EXIT_OK, EXIT_STOPPED, EXIT_VM_FAILED};
pub use global_timers::{GlobalTimersArgs, GlobalTimersReport, GLOBAL_TIMERS_SCHEMA};
pub use idle_manager::{IdleManagerArgs, IdleManagerReport, IDLE_MANAGER_SCHEMA};
pub use latency::{LatencyArgs, Pattern, Pv};
pub use latency_report::{LatencyReport, LatencyRow, LATENCY_SCHEMA};
pub use power_args::{BaselineLength, PowerArgs};
pub use report::{
    DensityReport, DensityRow, TimerModesReport, TimerModesRow, WakeupReport, WakeupRow,
    DENSITY_SCHEMA, TIMER_MODES_SCHEMA, WAKEUP_SCHEMA,
};
pub use snapshot::SnapshotArgs;
pub use snapshot_report::{SnapshotReport, SnapshotRow, SNAPSHOT_SCHEMA};
pub use timer_modes::TimerModesArgs;
pub use wakeup::{WakeMode, WakeupArgs};

/// Flags of `lull bench`.
#[derive(Debug)]
pub struct BenchArgs {
    /// The experiment to run.
    pub experiment: Experiment,
}

/// The experiments' flags are added only when `lull bench` is what runs (`Command::defer`):
/// `lull run` neither builds them nor pages their code in.
impl Args for BenchArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.defer(|cmd| {
            let experiments = keep_about(cmd, Experiment::augment_subcommands);
            experiments
                .subcommand_required(true)
                .arg_required_else_help(true)
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd.defer(|cmd| keep_about(cmd, Experiment::augment_subcommands_for_update))
    }
}

/// `augment(cmd)` with `cmd`'s own description (`lull bench --help` says what `lull --help`
/// says of it, not the doc comment of [`Experiment`]).
fn keep_about(cmd: clap::Command, augment: fn(clap::Command) -> clap::Command) -> clap::Command {
    let about = cmd.get_about().cloned();
    let long_about = cmd.get_long_about().cloned();
    let mut cmd = augment(cmd);
    if let Some(about) = about {
        cmd = cmd.about(about);
    }
    if let Some(long_about) = long_about {
        cmd = cmd.long_about(long_about);
    }
    cmd
}

impl clap::FromArgMatches for BenchArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self {
            experiment: Experiment::from_arg_matches(m)?,
        })
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.experiment.update_from_arg_matches(m)
    }
}

/// The experiments of `lull bench`.
#[derive(Debug, Subcommand)]
pub enum Experiment {
    /// Many idle VMs at once: host CPU, wake-ups, exits, guest timer lateness and RSS per mode.
    Density(Box<DensityArgs>),
    /// Wake-up latency of a halted vCPU to an IPI, per halt-polling mode.
    Wakeup(WakeupArgs),
    /// Cost of one guest timer event per irqchip and timer model: exits, host wake-ups and CPU
    /// per event (differential over two run lengths), TSC-deadline lateness.
    TimerModes(TimerModesArgs),
    /// What idle injection and the CPU quota take from a CPU-bound guest: achieved idle share,
    /// throughput, and how often quota-throttled VMs are all throttled at once.
    IdleManager(IdleManagerArgs),
    /// Boot time of lull against QEMU (the `hello` guest and the kit's Linux) and lull's own
    /// memory beside a Linux guest.
    Boot(BootArgs),
    /// Who wakes for global timers in each timer model, every vCPU idle and one busy: global
    /// fires, wake-ups of blocked vCPUs per expiry, empty wake-ups, host wake-ups.
    GlobalTimers(GlobalTimersArgs),
    /// Lateness of short TSC deadlines the guest re-arms from its timer interrupt handler,
    /// halted or busy in between, per mode, with and without PV EOI: p50/p99 and host CPU per
    /// event against `--irqchip kernel`.
    Latency(LatencyArgs),
    /// Pause and resume latency, snapshot time and size, and restore-to-running time (API and
    /// `--restore --resume`) of a VM whose vCPUs keep timers armed, per irqchip mode.
    Snapshot(SnapshotArgs),
    /// Fleets of the kit's Linux restored from one snapshot per mode: restore-to-running
    /// (mapped and copied memory), memory per clone as the host sees it (PSS, private, shared,
    /// MemAvailable) and CPU per clone.
    Clones(ClonesArgs),
}

/// Runs `lull bench ...`; the return value is the process exit status.
pub fn main(args: &BenchArgs) -> ExitCode {
    if let Err(e) = children::forward_stop_signals() {
        eprintln!("lull bench: cannot handle SIGINT/SIGTERM: {e}");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let result = match &args.experiment {
        // The kit's Linux has a density experiment of its own; `--from-json` replots either.
        Experiment::Density(a) if a.is_linux() && a.from_json.is_none() => match a.max_vms {
            Some(cap) => linux_max_vms::run(a, cap),
            None => linux_density::run(a),
        },
        Experiment::Density(a) => match (a.max_vms, &a.from_json) {
            (Some(cap), None) => max_vms::run(a, cap),
            _ => density::run(a),
        },
        Experiment::Wakeup(a) => wakeup::run(a),
        Experiment::TimerModes(a) => timer_modes::run(a),
        Experiment::IdleManager(a) => idle_manager::run(a),
        Experiment::Boot(a) => boot::run(a),
        Experiment::GlobalTimers(a) => global_timers::run(a),
        Experiment::Latency(a) => latency::run(a),
        Experiment::Snapshot(a) => snapshot::run(a),
        Experiment::Clones(a) => clones::run(a),
    };
    match result {
        Ok(true) => ExitCode::from(EXIT_OK),
        Ok(false) => {
            eprintln!("bench: some VMs failed; their rows say why (logs kept in the work dir)");
            ExitCode::from(EXIT_VM_FAILED)
        }
        Err(e) => {
            let mut msg = format!("lull bench: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("{msg}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::{CommandFactory, Parser, Subcommand};
    use timer::ModelKind;

    use super::*;

    /// A command line that holds `lull bench` as `lull`'s does.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(Debug, Subcommand)]
    enum Top {
        /// What lull's help says of the bench.
        Bench(BenchArgs),
    }

    fn parse(args: &[&str]) -> Result<Experiment, clap::Error> {
        let Top::Bench(b) = Cli::try_parse_from(args)?.command;
        Ok(b.experiment)
    }

    #[test]
    fn deferred_experiments_parse_their_flags() {
        let Experiment::Density(d) = parse(&[
            "lull",
            "bench",
            "density",
            "--vms",
            "1,8",
            "--duration",
            "3s",
        ])
        .unwrap() else {
            panic!("not density");
        };
        assert_eq!(d.vms, vec![1, 8]);
        assert_eq!(d.duration, std::time::Duration::from_secs(3));
        assert_eq!(d.memory_bytes(), 64 << 20);
        assert!(matches!(
            parse(&["lull", "bench", "timer-modes", "--kit", "/k"]).unwrap(),
            Experiment::TimerModes(t) if t.common.kit == Some(PathBuf::from("/k")) && t.count == 200
        ));
        assert!(parse(&["lull", "bench", "timer-modes", "--count", "5"]).is_err());
        assert!(matches!(
            parse(&["lull", "bench", "latency", "--duration", "1s", "--modes", "kernel,pull",
                    "--pv", "eoi"]).unwrap(),
            Experiment::Latency(l) if l.duration == std::time::Duration::from_secs(1)
                && l.modes == vec![Mode::Kernel, Mode::User(ModelKind::Pull)] && l.pv == vec![Pv::Eoi]
                && l.delta == 200_000 && l.patterns.len() == 2 && l.tail == 1
        ));
        assert!(parse(&["lull", "bench", "latency", "--tail", "2"]).is_err());
        assert!(matches!(
            parse(&["lull", "bench", "snapshot", "--modes", "kernel", "--reps", "5"]).unwrap(),
            Experiment::Snapshot(s) if s.modes == vec![Mode::Kernel] && s.reps == 5
                && s.cpus == 2 && s.memory == 256 << 20 && s.restores == 3
        ));
        assert!(parse(&["lull", "bench", "latency", "--delta", "10"]).is_err());
        assert!(parse(&["lull", "bench", "density", "--duration", "10"]).is_err());
        assert!(parse(&["lull", "bench"]).is_err());
    }

    #[test]
    fn the_bench_keeps_the_description_its_parent_gives_it() {
        let mut cli = Cli::command();
        let bench = cli.find_subcommand_mut("bench").unwrap();
        let help = bench.render_help().to_string();
        assert!(
            help.starts_with("What lull's help says of the bench\n"),
            "{help}"
        );
        for experiment in [
            "density",
            "wakeup",
            "timer-modes",
            "idle-manager",
            "boot",
            "latency",
            "snapshot",
        ] {
            assert!(help.contains(experiment), "{help}");
        }
    }
}
