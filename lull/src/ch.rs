//! lull as `cloud-hypervisor`: invoked through a symlink of that name (`ln -s lull
//! cloud-hypervisor`) or as `lull ch ...`, it reads Cloud Hypervisor's command line
//! (`vmm::config::ch::cli`) and runs the VM, or serves the API, as `lull run` does.
//!
//! Exit status: as `lull run`'s, and 2 for an option lull cannot honour (the message names
//! it).

use std::process::ExitCode;
use std::time::Instant;

use vmm::api::InitialVm;
use vmm::config::ch::cli::{self, ApiSocketArg, ChCommand};
use vmm::config::ch::options::{self, TapSource};
use vmm::config::ch::{ChError, CH_VERSION};
use vmm::exit_code;
use vmm::host::sys::tap::Tap;
use vmm::vm::inputs::OtherPaths;

const HELP: &str = "\
lull, invoked as cloud-hypervisor: Cloud Hypervisor's command line for what lull has.

  --api-socket path=P|fd=N|P   serve the API (a subset of Cloud Hypervisor's)
  --kernel P  --initramfs P  --cmdline S
  --cpus boot=N[,max=N]        max must equal boot
  --memory size=N[K|M|G][,shared=on|off]
  --disk path=P[,readonly=on][,serial=S] ...   raw images on virtio-blk
  --net tap=NAME|fd=N[,mac=M][,ip=A,mask=M] ... existing taps (or an inherited tap
                               fd: IFF_TAP|IFF_NO_PI, no IFF_VNET_HDR) on virtio-net
  --serial off|null|tty|file=P  --console off|null  --rng src=P
  --log-file P  -v  --seccomp true|false|log  --version
  --lull KEY=VALUE[,KEY=VALUE]  lull's own flags (`lull run --help`), e.g.
                               --lull timer-model=pull,halt-poll=adaptive
  --restore source_url=file:///DIR[,resume=true][,prefault=on]
                               the snapshot's VM instead (with no VM flag): paused
                               for vm.resume on --api-socket, or run at once with
                               resume=true

Anything else is refused (exit status 2) with the reason. See docs/ORCHESTRATION.md.";

/// The arguments after the program name if lull runs as `cloud-hypervisor` (its file name)
/// or as `lull ch`; `None` otherwise.
pub fn invoked_as_cloud_hypervisor() -> Option<Vec<String>> {
    let mut args = std::env::args();
    let program = args.next()?;
    let name = std::path::Path::new(&program)
        .file_name()?
        .to_str()?
        .to_string();
    let rest: Vec<String> = args.collect();
    if name == "cloud-hypervisor" {
        return Some(rest);
    }
    match rest.split_first() {
        Some((first, tail)) if first == "ch" => Some(tail.to_vec()),
        _ => None,
    }
}

/// The exit status of a command line lull refuses.
fn refused(e: &ChError) -> ExitCode {
    eprintln!("lull: {e}");
    crate::run::status(match e {
        ChError::Config(c) => exit_code::for_config_error(&c.0),
        _ => exit_code::USAGE,
    })
}

/// Runs Cloud Hypervisor's command line `args`.
pub fn main(args: &[String], started: Instant) -> ExitCode {
    let launch = match cli::parse(args) {
        Ok(ChCommand::Version) => {
            println!(
                "cloud-hypervisor v{CH_VERSION} (lull {})",
                env!("CARGO_PKG_VERSION")
            );
            return ExitCode::SUCCESS;
        }
        Ok(ChCommand::Help) => {
            println!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Ok(ChCommand::Launch(launch)) => launch,
        Err(e) => return refused(&e),
    };
    let cli::ChLaunch {
        config: mut cfg,
        boots,
        api_socket,
        log_file,
        verbose,
        net_fds,
        restore,
        notes,
    } = *launch;
    // `--net fd=N`: the tap behind each inherited fd, checked now, after the named taps.
    for net in &net_fds {
        let TapSource::Fd(fd) = net.source else {
            continue;
        };
        let tap = match Tap::from_fd(fd) {
            Ok(tap) => tap,
            Err(e) => {
                eprintln!("lull: --net fd={fd}: {e}");
                return crate::run::status(exit_code::BAD_INPUT);
            }
        };
        match options::fd_net(fd, tap.name(), net.mac) {
            Ok(device) => cfg.nets.push(device),
            Err(e) => return refused(&e),
        }
    }
    if let Err(e) = cfg.validate() {
        eprintln!("lull: {e}");
        return crate::run::status(exit_code::for_config_error(&e));
    }
    if let Err(e) = vmm::host::sys::stop_signals::install_early() {
        eprintln!("lull: cannot install the SIGINT/SIGTERM handlers: {e}");
        return crate::run::status(exit_code::VMM_FAILURE);
    }
    let restore_dir = restore.as_ref().map(|r| r.dir.as_path());
    if let Err(e) = vmm::vm::inputs::check_log_file(&cfg, log_file.as_deref(), restore_dir) {
        return crate::run::vm_failed(&e);
    }
    if let Err(e) = crate::run::init_logging(verbose, log_file.as_deref()) {
        eprintln!("lull: cannot open the log file: {e}");
        return crate::run::status(exit_code::BAD_INPUT);
    }
    for note in &notes {
        tracing::info!("accepted without effect: {note}");
    }
    match (api_socket, restore) {
        (Some(socket), restore) => {
            let initial = match restore {
                Some(restore) => InitialVm::Restored(restore),
                None if boots => InitialVm::Created {
                    cfg: Box::new(cfg),
                    boot: true,
                },
                None => InitialVm::None,
            };
            let socket = match &socket {
                ApiSocketArg::Path(path) => crate::run::Socket::Path(path),
                ApiSocketArg::Fd(fd) => crate::run::Socket::Fd(*fd),
            };
            crate::run::serve(socket, initial, None)
        }
        // Without the API nobody could resume a VM restored paused.
        (None, Some(restore)) if restore.resume => {
            let outputs = vmm::config::RestoreOutputs {
                metrics: None,
                serial: restore.serial.clone(),
            };
            crate::run::restore(&restore.dir, true, outputs, started)
        }
        (None, Some(_)) => refused(&ChError::Missing(
            "resume=true in --restore, or --api-socket to resume the VM with vm.resume (a \
             restored VM starts paused)",
        )),
        // As Cloud Hypervisor: with neither, there is nothing to run (`lull run` would boot
        // the kit's guest, which a caller of `cloud-hypervisor` never asked for).
        (None, None) if !boots => refused(&ChError::Missing(
            "--kernel (the VM to run) or --api-socket (to create it through the API)",
        )),
        (None, None) => crate::run::run_vm(&cfg, OtherPaths::default(), started),
    }
}
