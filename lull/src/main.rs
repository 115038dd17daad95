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
    // First of all, before any thread: a stop signal from now on waits for its handler
    // (`install_early` below, or `ch::main`'s) instead of killing lull unheard.
    if let Err(e) = vmm::host::sys::stop_signals::block_early() {
        eprintln!("lull: cannot block the stop signals until their handlers are in place: {e}");
        return status(exit_code::VMM_FAILURE);
    }
    let started = Instant::now();
    if let Some(args) = ch::invoked_as_cloud_hypervisor() {
        return ch::main(&args, started);
    }
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Run(args) => args,
        Command::Bench(args) => {
            // lull bench takes SIGINT/SIGTERM its own way; SIGHUP keeps its default action.
            if let Err(e) = vmm::host::sys::stop_signals::unblock() {
                eprintln!("lull: cannot unblock the stop signals: {e}");
                return status(exit_code::VMM_FAILURE);
            }
            return bench::main(&args);
        }
    };
    // Before anything that takes time: a SIGINT, SIGTERM or SIGHUP (one pending since
    // `block_early` too) ends the run as a stop (status 12).
    if let Err(e) = vmm::host::sys::stop_signals::install_early() {
        eprintln!("lull: cannot install the SIGINT/SIGTERM/SIGHUP handlers: {e}");
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
                let vmm::config::RestoreFlags {
                    metrics,
                    serial,
                    nets,
                } = flags;
                let taps = |snapshot: &[vmm::config::NetConfig]| {
                    vmm::config::restore_nets::on_named_taps(snapshot, &nets)
                        .map_err(|e| e.to_string())
                };
                restore(dir, args.resume, memory, metrics, serial, taps, started)
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
