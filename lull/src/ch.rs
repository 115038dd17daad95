//! lull as `cloud-hypervisor`: invoked through a symlink of that name (`ln -s lull
//! cloud-hypervisor`) or as `lull ch ...`, it reads Cloud Hypervisor's command line
//! (`vmm::config::ch::cli`) and runs the VM, or serves the API, as `lull run` does.
//!
//! Exit status: as `lull run`'s, and 2 for an option lull cannot honour (the message names
//! it).

use std::process::ExitCode;
use std::time::Instant;

use vmm::api::{EventMonitor, InitialVm};
use vmm::config::ch::cli::{self, ApiSocketArg, ChCommand, ChLaunch};
use vmm::config::ch::options::{self, TapSource};
use vmm::config::ch::{ChError, CH_VERSION};
use vmm::exit_code;
use vmm::host::sys::tap::Tap;
use vmm::vm::inputs::OtherPaths;

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
        Ok(ChCommand::Help(help)) => {
            print!("{help}");
            return ExitCode::SUCCESS;
        }
        Ok(ChCommand::Launch(launch)) => *launch,
        Err(e) => return refused(&e),
    };
    match prepare(launch) {
        Ok(launch) => launch_vm(launch, started),
        Err(status) => status,
    }
}

/// Checks the inherited tap fds and the configuration, installs the stop signals' handlers
/// and starts logging: the launch ready to run, or lull's exit status.
fn prepare(mut launch: ChLaunch) -> Result<ChLaunch, ExitCode> {
    add_inherited_taps(&mut launch)?;
    if let Err(e) = launch.config.validate() {
        eprintln!("lull: {e}");
        return Err(crate::run::status(exit_code::for_config_error(&e)));
    }
    if let Err(e) = vmm::host::sys::stop_signals::install_early() {
        eprintln!("lull: cannot install the SIGINT/SIGTERM handlers: {e}");
        return Err(crate::run::status(exit_code::VMM_FAILURE));
    }
    let restore_dir = launch.restore.as_ref().map(|r| r.dir.as_path());
    let log_file = launch.log_file.as_deref();
    if let Err(e) = vmm::vm::inputs::check_log_file(&launch.config, log_file, restore_dir) {
        return Err(crate::run::vm_failed(&e));
    }
    if let Err(e) = crate::run::init_logging(launch.verbose, launch.log_file.as_deref()) {
        eprintln!("lull: cannot open the log file: {e}");
        return Err(crate::run::status(exit_code::BAD_INPUT));
    }
    for note in &launch.notes {
        tracing::info!("accepted without effect: {note}");
    }
    Ok(launch)
}

/// `--net fd=N`: the tap behind each inherited fd, checked now, after the named taps.
fn add_inherited_taps(launch: &mut ChLaunch) -> Result<(), ExitCode> {
    for net in &launch.net_fds {
        let TapSource::Fd(fd) = net.source else {
            continue;
        };
        let tap = Tap::from_fd(fd).map_err(|e| {
            eprintln!("lull: --net fd={fd}: {e}");
            crate::run::status(exit_code::BAD_INPUT)
        })?;
        let device = options::fd_net(fd, tap.name(), net.mac).map_err(|e| refused(&e))?;
        launch.config.nets.push(device);
    }
    Ok(())
}

/// Serves the API, restores or runs the VM, as the flags say.
fn launch_vm(launch: ChLaunch, started: Instant) -> ExitCode {
    let ChLaunch {
        config,
        boots,
        api_socket,
        restore,
        event_monitor,
        lull_knobs,
        ..
    } = launch;
    if event_monitor.is_some() && api_socket.is_none() {
        return refused(&ChError::Missing(
            "--api-socket with --event-monitor (lull writes its events from the API's thread)",
        ));
    }
    match (api_socket, restore) {
        (Some(socket), restore) => {
            // A FIFO waits here for its reader (libvirt opens it once lull runs).
            let events = match event_monitor.as_ref().map(EventMonitor::open) {
                None => EventMonitor::none(),
                Some(Ok(events)) => events,
                Some(Err(e)) => {
                    eprintln!("lull: {e}");
                    tracing::error!("{e}");
                    return crate::run::status(exit_code::BAD_INPUT);
                }
            };
            let initial = match restore {
                Some(restore) => InitialVm::Restored(restore),
                None if boots => InitialVm::Created {
                    cfg: Box::new(config),
                    boot: true,
                },
                None => InitialVm::None,
            };
            let socket = match &socket {
                ApiSocketArg::Path(path) => crate::run::Socket::Path(path),
                ApiSocketArg::Fd(fd) => crate::run::Socket::Fd(*fd),
            };
            crate::run::serve(socket, initial, None, events, lull_knobs)
        }
        // Without the API nobody could resume a VM restored paused.
        (None, Some(restore)) if restore.resume => {
            let taps = |snapshot: &[vmm::config::NetConfig]| {
                let sent = vmm::host::sys::scm::SentFds::default();
                vmm::api::restore_taps::resolve(snapshot, &restore.nets, sent)
                    .map(|taps| taps.nets)
                    .map_err(|e| e.messages().join(": "))
            };
            let serial = restore.serial.clone();
            crate::run::restore(
                &restore.dir,
                true,
                restore.memory,
                None,
                serial,
                taps,
                started,
            )
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
        (None, None) => crate::run::run_vm(&config, OtherPaths::default(), started),
    }
}
