//! Cloud Hypervisor's command line (lull invoked as `cloud-hypervisor`, or `lull ch ...`)
//! onto lull's [`VmConfig`] and the few things lull itself needs (the API socket, the log).
//!
//! Flags take their value as the next argument or after `=`; `--disk` and `--net` take one or
//! more values (Cloud Hypervisor's form, `--disk path=a path=b`) and may repeat. A flag lull
//! does not have is refused by name. lull's own knobs come as `--lull KEY=VALUE[,KEY=VALUE]`,
//! with the names of `lull run`'s flags (`--lull timer-model=push,halt-poll=50us`); a value may
//! hold commas (`--lull idle-inject=percent=25,period=100`): a new pair starts only at one of
//! lull's flag names.

use std::path::PathBuf;

use clap::{Args, Command, FromArgMatches};

use super::options::{self, TapSource};
use super::restore::{self, ChRestore};
use super::ChError;
use crate::config::{SerialMode, VmConfig};
use crate::host::seccomp::SeccompMode;
use crate::size::ByteSize;

/// Where the API socket comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiSocketArg {
    /// Created at this path.
    Path(PathBuf),
    /// An inherited listening socket.
    Fd(i32),
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ChCommand {
    /// `--version`/`-V`: say the version.
    Version,
    /// `--help`/`-h`.
    Help,
    /// Run a VM, or serve the API.
    Launch(Box<ChLaunch>),
}

/// A VM to run (or to create, with the API socket).
#[derive(Debug, Clone, PartialEq)]
pub struct ChLaunch {
    /// The VM (Cloud Hypervisor's defaults: 1 vCPU, 512 MiB, the serial port to nowhere).
    pub config: VmConfig,
    /// A kernel was given: the VM boots at once (with the API socket too, as Cloud
    /// Hypervisor does).
    pub boots: bool,
    /// `--api-socket`.
    pub api_socket: Option<ApiSocketArg>,
    /// `--log-file`.
    pub log_file: Option<PathBuf>,
    /// `-v` count.
    pub verbose: u8,
    /// Tap fds given with `--net fd=N` (and their MACs), in order after the named taps.
    pub net_fds: Vec<options::ChNet>,
    /// `--restore`: the snapshot to restore instead of a VM to boot (no VM flag with it).
    pub restore: Option<ChRestore>,
    /// What was accepted without effect, said with `-v`.
    pub notes: Vec<String>,
}

/// The flags that set something of the VM (refused with `--restore`, whose VM is the
/// snapshot's; `--console` and `--rng`, accepted without effect anyway, may come with it).
const VM_FLAGS: [&str; 10] = [
    "--kernel",
    "--initramfs",
    "--cmdline",
    "--cpus",
    "--memory",
    "--disk",
    "--net",
    "--serial",
    "--seccomp",
    "--lull",
];

/// Cloud Hypervisor's flags that lull does not have, with the reason.
const REFUSED_FLAGS: [(&str, &str); 21] = [
    ("--firmware", "lull boots a kernel directly (--kernel)"),
    ("--fs", "lull has no virtio-fs"),
    ("--pmem", "lull has no virtio-pmem"),
    ("--vsock", "lull has no virtio-vsock"),
    ("--device", "lull has no VFIO passthrough"),
    ("--user-device", "lull has no vfio-user"),
    ("--vdpa", "lull has no vDPA"),
    ("--numa", "lull has no NUMA topology"),
    ("--balloon", "lull has no balloon"),
    ("--watchdog", "lull has no watchdog"),
    ("--memory-zone", "lull has no memory zones"),
    ("--tpm", "lull has no TPM"),
    ("--sgx-epc", "lull has no SGX"),
    ("--landlock", "lull uses seccomp, not landlock"),
    ("--landlock-rules", "lull uses seccomp, not landlock"),
    ("--pci-segment", "lull's devices are on virtio-mmio"),
    ("--event-monitor", "lull has no event monitor"),
    ("--gdb", "lull has no gdb stub"),
    ("--igvm", "lull boots a kernel directly (--kernel)"),
    (
        "--rate-limit-group",
        "lull's rate limits are per device (--lull disk=...)",
    ),
    ("--pvpanic", "lull has no pvpanic device"),
];

/// Reads `args` (without the program name, or after `ch`).
pub fn parse(args: &[String]) -> Result<ChCommand, ChError> {
    let mut notes = Vec::new();
    let mut cfg = VmConfig {
        memory: ByteSize::mib(512),
        serial: SerialMode::Off,
        ..VmConfig::default()
    };
    let mut launch = ChLaunch {
        config: VmConfig::default(),
        boots: false,
        api_socket: None,
        log_file: None,
        verbose: 0,
        net_fds: Vec::new(),
        restore: None,
        notes: Vec::new(),
    };
    // The flags given that describe the VM: none may come with `--restore`.
    let mut vm_flags: Vec<String> = Vec::new();
    let mut lull_knobs = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        i += 1;
        if arg.starts_with('-') && !arg.starts_with("--") && arg.len() > 1 {
            match arg {
                "-h" => return Ok(ChCommand::Help),
                "-V" => return Ok(ChCommand::Version),
                _ if arg[1..].bytes().all(|b| b == b'v') => {
                    let n = u8::try_from(arg.len() - 1).unwrap_or(u8::MAX);
                    launch.verbose = launch.verbose.saturating_add(n);
                    continue;
                }
                _ => return Err(unknown(arg)),
            }
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg, None),
        };
        // The flag's values: the inline one, or the next argument(s).
        let mut values = |many: bool| -> Result<Vec<String>, ChError> {
            let mut out: Vec<String> = inline.iter().cloned().collect();
            // A first value may start with one dash (`--cmdline -x`); more values may not.
            while i < args.len()
                && !args[i].starts_with("--")
                && (out.is_empty() || (many && !args[i].starts_with('-')))
            {
                out.push(args[i].clone());
                i += 1;
            }
            if out.is_empty() {
                return Err(ChError::NoValue(flag.to_string()));
            }
            Ok(out)
        };
        if VM_FLAGS.contains(&flag) && !vm_flags.iter().any(|f| f == flag) {
            vm_flags.push(flag.to_string());
        }
        match flag {
            "--help" => return Ok(ChCommand::Help),
            "--version" => return Ok(ChCommand::Version),
            "--kernel" => {
                cfg.kernel = Some(one(values(false)?).into());
                launch.boots = true;
            }
            "--initramfs" => cfg.initramfs = Some(one(values(false)?).into()),
            "--cmdline" => cfg.cmdline = Some(one(values(false)?)),
            "--cpus" => {
                cfg.cpus = options::cpus(&options::split(flag, &one(values(false)?)), &mut notes)?
            }
            "--memory" => {
                cfg.memory =
                    options::memory(&options::split(flag, &one(values(false)?)), &mut notes)?
            }
            "--disk" => {
                for v in values(true)? {
                    cfg.disks
                        .push(options::disk(&options::split(flag, &v), &mut notes)?);
                }
            }
            "--net" => {
                for v in values(true)? {
                    let net = options::net(&options::split(flag, &v), &mut notes)?;
                    match net.source {
                        TapSource::Name(_) => cfg.nets.push(net.to_config()?),
                        TapSource::Fd(_) => launch.net_fds.push(net),
                    }
                }
            }
            "--serial" => {
                let v = one(values(false)?);
                let (mode, file) = match v.split_once('=') {
                    Some((mode, file)) => (mode.to_string(), Some(file.to_string())),
                    None => (v, None),
                };
                cfg.serial = options::serial(flag, &mode, file.as_deref())?;
            }
            "--console" | "--debug-console" => options::console(flag, &one(values(false)?))?,
            "--rng" => options::rng(&options::split(flag, &one(values(false)?)), &mut notes)?,
            "--api-socket" => launch.api_socket = Some(api_socket(&one(values(false)?))?),
            "--log-file" => launch.log_file = Some(one(values(false)?).into()),
            "--seccomp" => {
                cfg.seccomp = match one(values(false)?).as_str() {
                    "true" => SeccompMode::On,
                    "false" => SeccompMode::Off,
                    "log" => SeccompMode::Log,
                    other => {
                        return Err(ChError::BadValue {
                            option: flag.into(),
                            value: other.into(),
                            expected: "true, false or log",
                        })
                    }
                }
            }
            "--platform" => notes.push(format!(
                "--platform {}: lull has no PCI segments, UUID or OEM strings",
                one(values(false)?)
            )),
            "--lull" => lull_knobs.extend(values(false)?),
            "--restore" => {
                let opts = options::split(flag, &one(values(false)?));
                launch.restore = Some(restore::restore(&opts, &mut notes)?);
            }
            _ => {
                let why = REFUSED_FLAGS
                    .iter()
                    .find(|(f, _)| *f == flag)
                    .map_or("not a Cloud Hypervisor flag lull knows", |(_, why)| *why);
                return Err(ChError::Refused {
                    option: flag.to_string(),
                    why,
                });
            }
        }
    }
    if launch.restore.is_some() && !vm_flags.is_empty() {
        return Err(ChError::Refused {
            option: format!("--restore with {}", vm_flags.join(", ")),
            why: "the restored VM is the snapshot's, as it was saved: give --restore alone \
                  (with --api-socket, --log-file, -v, --console, --rng)",
        });
    }
    for knobs in &lull_knobs {
        apply_lull_knobs(&mut cfg, knobs)?;
    }
    cfg.validate()?;
    launch.config = cfg;
    launch.notes = notes;
    Ok(ChCommand::Launch(Box::new(launch)))
}

fn one(mut values: Vec<String>) -> String {
    values.swap_remove(0)
}

fn unknown(flag: &str) -> ChError {
    ChError::Refused {
        option: flag.to_string(),
        why: "not a Cloud Hypervisor flag lull knows",
    }
}

/// `path=P`, `fd=N` or a bare path.
fn api_socket(value: &str) -> Result<ApiSocketArg, ChError> {
    if let Some(path) = value.strip_prefix("path=") {
        return Ok(ApiSocketArg::Path(path.into()));
    }
    if let Some(fd) = value.strip_prefix("fd=") {
        return fd
            .parse()
            .map(ApiSocketArg::Fd)
            .map_err(|_| ChError::BadValue {
                option: "--api-socket fd".into(),
                value: fd.into(),
                expected: "a file descriptor number",
            });
    }
    Ok(ApiSocketArg::Path(value.into()))
}

/// Applies `--lull KEY=VALUE[,KEY=VALUE]` with the parser of `lull run`'s flags.
fn apply_lull_knobs(cfg: &mut VmConfig, text: &str) -> Result<(), ChError> {
    let flags = VmConfig::augment_args_for_update(Command::new("lull").no_binary_name(true));
    let names: Vec<String> = flags
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    let mut argv: Vec<String> = Vec::new();
    for part in text.split(',') {
        let key = part.split_once('=').map_or(part, |(k, _)| k);
        if names.iter().any(|n| n == key) {
            let value = part.split_once('=').map_or("", |(_, v)| v);
            argv.push(format!("--{key}"));
            argv.push(value.to_string());
        } else if let Some(value) = argv.last_mut() {
            value.push(',');
            value.push_str(part);
        } else {
            return Err(ChError::Lull(format!("'{key}' is not one of lull's flags")));
        }
    }
    let matches = flags
        .try_get_matches_from(&argv)
        .map_err(|e| ChError::Lull(e.to_string().lines().next().unwrap_or("").to_string()))?;
    cfg.update_from_arg_matches(&matches)
        .map_err(|e| ChError::Lull(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{IrqchipMode, TimerModelKind};

    fn launch(args: &str) -> Result<ChLaunch, ChError> {
        let args: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        match parse(&args)? {
            ChCommand::Launch(l) => Ok(*l),
            other => panic!("{other:?}"),
        }
    }

    /// The first Nomad driver's command line (see docs/ORCHESTRATION.md).
    #[test]
    fn a_driver_s_command_line_maps_onto_lull_s_config() {
        let l = launch(
            "--api-socket path=/run/ch.sock --kernel /k --initramfs /i --cmdline console=ttyS0 \
             --cpus boot=2 --memory size=268435456 --disk path=/a.img,readonly=on path=/b.img \
             --net tap=tap0,mac=52:54:00:00:00:01 --serial tty --console off -vv \
             --log-file /l --seccomp log --rng src=/dev/urandom",
        )
        .unwrap();
        let cfg = &l.config;
        assert!(l.boots);
        assert_eq!(
            l.api_socket,
            Some(ApiSocketArg::Path("/run/ch.sock".into()))
        );
        assert_eq!((cfg.cpus, cfg.memory), (2, ByteSize::mib(256)));
        assert_eq!(cfg.cmdline.as_deref(), Some("console=ttyS0"));
        assert_eq!(cfg.disks.len(), 2);
        assert!(cfg.disks[0].readonly && !cfg.disks[1].readonly);
        assert_eq!(cfg.nets[0].tap, "tap0");
        assert_eq!(cfg.serial, SerialMode::Stdio);
        assert_eq!(cfg.seccomp, SeccompMode::Log);
        assert_eq!((l.verbose, l.log_file.as_deref()), (2, Some("/l".as_ref())));
        assert_eq!(l.notes.len(), 1, "{:?}", l.notes);
    }

    #[test]
    fn flintlock_s_forms_and_other_spellings() {
        let l = launch(
            "--api-socket=/s --memory size=512M,shared=on --net fd=3,mac=52:54:00:00:00:09 -v",
        )
        .unwrap();
        assert!(!l.boots);
        assert_eq!(l.config.memory, ByteSize::mib(512));
        assert_eq!(l.net_fds.len(), 1);
        assert_eq!(l.net_fds[0].source, TapSource::Fd(3));
        assert_eq!(
            launch("--api-socket fd=5").unwrap().api_socket,
            Some(ApiSocketArg::Fd(5))
        );
        assert_eq!(
            launch("--api-socket /x").unwrap().api_socket,
            Some(ApiSocketArg::Path("/x".into()))
        );
        assert_eq!(
            launch("--serial file=/s.log").unwrap().config.serial,
            SerialMode::File("/s.log".into())
        );
        assert_eq!(
            launch("--seccomp false").unwrap().config.seccomp,
            SeccompMode::Off
        );
        assert_eq!(parse(&["--version".into()]), Ok(ChCommand::Version));
        assert_eq!(parse(&["-V".into()]), Ok(ChCommand::Version));
    }

    #[test]
    fn what_lull_cannot_honour_is_refused_by_name() {
        for (args, named) in [
            ("--kernel /k --fs tag=x,socket=/s", "--fs"),
            ("--pmem file=/p", "--pmem"),
            ("--vsock cid=3,socket=/v", "--vsock"),
            ("--cpus boot=1,max=2", "--cpus max=2"),
            ("--memory size=1G,hugepages=on", "--memory hugepages=on"),
            ("--console tty", "--console tty"),
            ("--disk path=/a,vhost_user=on", "--disk vhost_user=on"),
            ("--frobnicate", "--frobnicate"),
            ("-x", "-x"),
        ] {
            let err = launch(args).unwrap_err();
            assert!(err.to_string().contains(named), "{args}: {err}");
        }
        assert_eq!(launch("--kernel"), Err(ChError::NoValue("--kernel".into())));
    }

    #[test]
    fn restore_comes_without_vm_flags() {
        let l = launch("--api-socket /s --restore source_url=file:///snap,prefault=on -v").unwrap();
        let paused = ChRestore {
            dir: "/snap".into(),
            resume: false,
            serial: None,
        };
        assert_eq!(l.restore, Some(paused));
        assert!(!l.boots);
        let l = launch("--restore source_url=file:///snap,resume=true --console off").unwrap();
        assert!(l.restore.is_some_and(|r| r.resume));
        for (args, named) in [
            (
                "--restore source_url=file:///s --kernel /k --cpus boot=2 --kernel /k",
                "--restore with --kernel, --cpus:",
            ),
            (
                "--serial tty --restore source_url=file:///s",
                "with --serial",
            ),
            ("--restore prefault=on", "source_url"),
            (
                "--restore source_url=file:///s,memory_restore_mode=ondemand",
                "memory_restore_mode=ondemand",
            ),
        ] {
            let err = launch(args).unwrap_err().to_string();
            assert!(err.contains(named), "{args}: {err}");
        }
    }

    #[test]
    fn lull_s_own_knobs_come_with_dash_dash_lull() {
        let l = launch(
            "--lull timer-model=push,halt-poll=50us --lull idle-inject=percent=25,period=100",
        )
        .unwrap();
        assert_eq!(l.config.timer_model, TimerModelKind::Push);
        assert_eq!(l.config.idle_inject.map(|c| c.percent), Some(25));
        assert_eq!(l.config.irqchip, IrqchipMode::User);
        let err = launch("--lull bogus=1").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        assert!(launch("--lull cpus=x").is_err());
        // lull's own rules still hold.
        assert!(launch("--lull irqchip=kernel,timer-model=push").is_err());
    }
}
