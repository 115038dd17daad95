//! The `lull` command: parse the command line, run the VM, turn the outcome into an exit status.

#![deny(unsafe_code)]

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use cli::{Cli, Command};
use run::{init_logging, restore, run_vm, serve_api, status};
use vmm::config::Switch;
use vmm::exit_code;
use vmm::vm::inputs::OtherPaths;

mod ch;
mod cli;
mod run;

fn main() -> ExitCode {
    let started = Instant::now();
    if let Some(args) = ch::invoked_as_cloud_hypervisor() {
        return ch::main(&args, started);
    }
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Run(args) => args,
        Command::Bench(args) => return bench::main(&args),
    };
    // First, so that a SIGINT or SIGTERM from now on ends the run as a stop (status 12).
    if let Err(e) = vmm::host::sys::stop_signals::install_early() {
        eprintln!("lull: cannot install the SIGINT/SIGTERM handlers: {e}");
        return status(exit_code::VMM_FAILURE);
    }
    // Before anything starts a thread (see `move_own_text_to_huge_pages`).
    let huge_text = (args.huge_text == Some(Switch::On))
        .then(vmm::host::sys::huge_text::move_own_text_to_huge_pages);
    if let Err(e) = init_logging(args.verbose, None) {
        eprintln!("lull: cannot start logging: {e}");
    }
    match huge_text {
        Some(Ok(bytes)) => tracing::debug!("lull's text: {} KiB on 2 MiB pages", bytes >> 10),
        Some(Err(e)) => tracing::warn!("--huge-text on: lull's text stays on small pages: {e}"),
        None => {}
    }
    if let Some(socket) = &args.api_socket {
        return serve_api(&args, socket);
    }
    if let Some(dir) = &args.restore {
        return match args.vm.for_restore() {
            Ok(flags) => {
                let memory = vmm::config::MemoryRestore {
                    mode: args.memory_restore.unwrap_or_default(),
                    prefault: false,
                };
                let taps = |snapshot: &[vmm::config::NetConfig]| {
                    vmm::config::restore_nets::on_named_taps(snapshot, &flags.nets)
                        .map_err(|e| e.to_string())
                };
                restore(dir, args.resume, memory, flags.metrics, taps, started)
            }
            Err(e) => {
                eprintln!("lull: {e}");
                status(exit_code::for_config_error(&e))
            }
        };
    }
    let cfg = match args.vm.to_config() {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("lull: {e}");
            return status(exit_code::for_config_error(&e));
        }
    };
    let other = OtherPaths {
        config: args.vm.config.as_deref(),
        ..Default::default()
    };
    run_vm(&cfg, other, started)
}
