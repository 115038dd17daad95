//! Running a VM (from the command line, a snapshot, or behind the API socket) and turning its
//! outcome into lull's exit status: what `lull run` and `cloud-hypervisor` share.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Instant;

use tracing_subscriber::EnvFilter;
use vmm::api::InitialVm;
use vmm::config::NetConfig;
use vmm::exit_code;
use vmm::snapshot::ReadError;
use vmm::vm::inputs::OtherPaths;
use vmm::vm::VmError;

use crate::cli::RunArgs;

/// Logs to stderr, or appended to `file` (Cloud Hypervisor's `--log-file`).
pub(crate) fn init_logging(verbose: u8, file: Option<&std::path::Path>) -> std::io::Result<()> {
    let default = match verbose {
        0 => "warn,vmm=info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let logger = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match file {
        Some(path) => {
            let file = vmm::vm::paths::open_log_file(path)?;
            logger
                .with_writer(std::sync::Mutex::new(file))
                .with_ansi(false)
                .init();
        }
        None => logger
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
    }
    Ok(())
}

/// `e` and its causes, each said once: lull's messages already name their direct cause, so a
/// source whose text is already in the message is not repeated.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

pub(crate) fn status(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}

/// Says why the VM could not be built or run, with what to raise if the host ran out of
/// something; returns the status.
pub(crate) fn vm_failed(e: &VmError) -> ExitCode {
    eprintln!("lull: {}", error_chain(e));
    if let Some(hint) = exit_code::exhausted_resource(e) {
        eprintln!("lull: {hint}");
    }
    status(exit_code::for_vm_error(e))
}

/// `lull run --api-socket PATH`: the management API until `vmm.shutdown` or a signal.
pub(crate) fn serve_api(args: &RunArgs, socket: &std::path::Path) -> ExitCode {
    let initial = if args.vm.describes_vm() {
        match args.vm.to_config() {
            Ok(cfg) => InitialVm::Created {
                cfg: Box::new(cfg),
                boot: false,
            },
            Err(e) => {
                eprintln!("lull: {e}");
                return status(exit_code::for_config_error(&e));
            }
        }
    } else {
        InitialVm::None
    };
    serve(
        Socket::Path(socket),
        initial,
        args.vm.config.as_deref(),
        vmm::api::EventMonitor::none(),
        Vec::new(),
    )
}

/// Where the API socket comes from.
#[derive(Clone, Copy)]
pub(crate) enum Socket<'a> {
    /// Created at this path.
    Path(&'a std::path::Path),
    /// Inherited, listening (`cloud-hypervisor --api-socket fd=N`).
    Fd(std::os::fd::RawFd),
}

/// Serves the API on `socket`, starting with `initial`; `ch_knobs`: `lull ch --lull` values for
/// the VMs `vm.create` makes from Cloud Hypervisor's `VmConfig`.
pub(crate) fn serve(
    socket: Socket<'_>,
    initial: InitialVm,
    config_file: Option<&std::path::Path>,
    events: vmm::api::EventMonitor,
    ch_knobs: Vec<String>,
) -> ExitCode {
    if let InitialVm::Created { cfg, .. } = &initial {
        let other = OtherPaths {
            config: config_file,
            api_socket: match socket {
                Socket::Path(path) => Some(path),
                Socket::Fd(_) => None,
            },
            ..Default::default()
        };
        if let Err(e) = vmm::vm::inputs::check(cfg, other) {
            return vm_failed(&e);
        }
    }
    let bound = match socket {
        Socket::Path(path) => vmm::api::ApiSocket::bind(path),
        Socket::Fd(fd) => vmm::api::ApiSocket::inherit(fd),
    };
    let served = bound.and_then(|socket| vmm::api::serve_on(socket, initial, events, ch_knobs));
    match served {
        Ok(code) => status(code),
        Err(e) => {
            eprintln!("lull: {}", error_chain(&e));
            if let Some(hint) = exit_code::exhausted_resource(&e) {
                eprintln!("lull: {hint}");
                return status(exit_code::BAD_INPUT);
            }
            status(e.exit_status())
        }
    }
}

/// Runs the VM of `cfg` to its end; lull's exit status.
pub(crate) fn run_vm(cfg: &vmm::config::VmConfig, other: OtherPaths, started: Instant) -> ExitCode {
    finish_run(cfg, vmm::vm::run(cfg, other, started))
}

/// `lull run --restore DIR --resume [--metrics PATH] [--serial MODE] [--net tap=NAME ...]`:
/// the snapshot's VM, its nets on the taps `taps` gives them, resumed at once, run to its
/// end, its report written to `metrics` and its console where `serial` says (never the
/// snapshot's own console file unless given again).
pub(crate) fn restore(
    dir: &std::path::Path,
    resume: bool,
    memory: vmm::config::MemoryRestore,
    metrics: Option<std::path::PathBuf>,
    serial: Option<vmm::config::SerialMode>,
    taps: impl FnOnce(&[NetConfig]) -> Result<Vec<NetConfig>, String>,
    started: Instant,
) -> ExitCode {
    if !resume {
        eprintln!(
            "lull: a restored VM starts paused: give --resume, or restore it with vm.restore \
             on an --api-socket to resume it later"
        );
        return status(exit_code::BAD_INPUT);
    }
    let mut snapshot = match vmm::snapshot::read_with_taps(dir, taps) {
        Ok(s) => s,
        Err(ReadError::Snapshot(e)) => return vm_failed(&vmm::vm::VmError::Snapshot(e)),
        Err(ReadError::Taps(e)) => {
            eprintln!("lull: {e}");
            return status(exit_code::BAD_INPUT);
        }
    };
    snapshot.manifest.config.metrics = metrics;
    if let Some(serial) = serial {
        snapshot.manifest.config.serial = serial;
    }
    let cfg = snapshot.manifest.config.clone();
    let result = vmm::vm::restore_observed(&snapshot, memory, started, |live| {
        if let Err(e) = live.resume() {
            tracing::error!("cannot resume the restored VM: {e}");
        }
    });
    finish_run(&cfg, result)
}

/// lull's exit after a run of the VM of `cfg`: its status, the stop said, `--metrics` written.
pub(crate) fn finish_run(
    cfg: &vmm::config::VmConfig,
    result: Result<vmm::vm::RunOutcome, vmm::vm::VmError>,
) -> ExitCode {
    match result {
        Ok(mut outcome) => {
            let code = exit_code::for_stop(&outcome.reason);
            outcome.report.exit_status = code;
            if !matches!(
                outcome.reason,
                vmm::state::StopReason::Reset
                    | vmm::state::StopReason::PowerOff
                    | vmm::state::StopReason::TestExit(_)
            ) {
                eprintln!("lull: {}", outcome.reason);
            }
            if let Some(path) = &cfg.metrics {
                if let Err(e) = vmm::vm::report::write_json(&outcome.report, path) {
                    eprintln!("lull: cannot write metrics to {}: {e}", path.display());
                }
            }
            status(code)
        }
        Err(e) => vm_failed(&e),
    }
}
