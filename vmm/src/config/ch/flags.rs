//! Cloud Hypervisor's flags, each defined once in [`FLAGS`]: its name, how it takes its values,
//! its help line, and what it does to lull's configuration (or why lull refuses it). The clap
//! command that reads them ([`command`]) and the help it prints are built from that table,
//! so a flag cannot be accepted, helped and refused in three places that disagree.
//!
//! Values come as Cloud Hypervisor's clap command takes them: after the flag or after `=`;
//! `--disk` and `--net` take one or more values (`--disk path=a path=b`) and may repeat;
//! `--lull` may repeat; every other flag comes at most once (Cloud Hypervisor refuses a second
//! `--api-socket`, and so does lull, instead of keeping the last).

use clap::{Arg, ArgAction, Command};

use super::launch::{ApiSocketArg, ChLaunch, EventMonitorArg};
use super::options::{self, TapSource};
use super::restore;
use super::{ChError, CH_VERSION};
use crate::config::knobs::SeccompMode;
use crate::config::{SerialMode, VmConfig};
use crate::size::ByteSize;

/// How a flag takes its values.
#[derive(Debug, Clone, Copy)]
pub(super) enum Takes {
    /// One value, and the flag at most once (the value's name in the help).
    One(&'static str),
    /// One value that may start with a dash (`--cmdline -x`), at most once.
    OneHyphen(&'static str),
    /// One or more values, and the flag may repeat (`--disk path=a path=b --disk path=c`).
    Many(&'static str),
    /// One value each time, and the flag may repeat.
    EachOne(&'static str),
    /// No value; counted (`-vv`).
    Count,
    /// `--help`: clap prints the help built from this table.
    Help,
    /// `--version`.
    Version,
    /// Whatever Cloud Hypervisor's flag takes: none or more values (a refused flag's values
    /// are not looked at).
    Any,
}

/// What a flag does.
#[derive(Debug, Clone, Copy)]
pub(super) enum Effect {
    /// Sets something of the VM: refused with `--restore`, whose VM is the snapshot's.
    Vm(Setter),
    /// How lull runs, or accepted without effect: may come with `--restore`.
    Run(Setter),
    /// Cloud Hypervisor has it, lull does not: refused, with the reason.
    Refused(&'static str),
    /// Read by clap itself (`--help`, `--version`, `-v`).
    Clap,
}

/// Applies a flag's values (`name` is the flag as a message names it, `--disk`).
pub(super) type Setter = fn(&mut Parsed, &str, Vec<String>) -> Result<(), ChError>;

/// One flag of Cloud Hypervisor's command line.
#[derive(Debug)]
pub(super) struct Flag {
    /// The long name without dashes (also clap's id), or the short letter for `-v`.
    pub(super) id: &'static str,
    /// The short form, if any.
    pub(super) short: Option<char>,
    /// How it takes its values.
    pub(super) takes: Takes,
    /// What it does.
    pub(super) effect: Effect,
    /// Its line in `--help` (empty: not shown, as every refused flag).
    pub(super) help: &'static str,
}

impl Flag {
    /// The flag as a message names it.
    pub(super) fn name(&self) -> String {
        match self.short {
            Some(c) if self.id.len() == 1 => format!("-{c}"),
            _ => format!("--{}", self.id),
        }
    }

    fn arg(&self) -> Arg {
        let mut arg = Arg::new(self.id).help(self.help).hide(self.help.is_empty());
        if self.id.len() > 1 {
            arg = arg.long(self.id);
        }
        if let Some(c) = self.short {
            arg = arg.short(c);
        }
        match self.takes {
            Takes::One(v) => arg.value_name(v).num_args(1).action(ArgAction::Set),
            Takes::OneHyphen(v) => arg
                .value_name(v)
                .num_args(1)
                .allow_hyphen_values(true)
                .action(ArgAction::Set),
            Takes::Many(v) => arg.value_name(v).num_args(1..).action(ArgAction::Append),
            Takes::EachOne(v) => arg.value_name(v).num_args(1).action(ArgAction::Append),
            Takes::Count => arg.action(ArgAction::Count),
            Takes::Help => arg.action(ArgAction::Help),
            Takes::Version => arg.action(ArgAction::Version),
            Takes::Any => arg.num_args(0..).action(ArgAction::Append),
        }
    }
}

/// What the flags read so far make.
#[derive(Debug)]
pub(super) struct Parsed {
    /// The VM (Cloud Hypervisor's defaults: 1 vCPU, 512 MiB, the serial port to nowhere).
    pub(super) cfg: VmConfig,
    /// Everything else of the launch (its `config` is filled in at the end).
    pub(super) launch: ChLaunch,
    /// `--lull` values, applied after every Cloud Hypervisor flag.
    pub(super) lull_knobs: Vec<String>,
    /// `--console pty`: the serial port's pty (`options::console_pty`), applied at the end.
    pub(super) console_pty: bool,
}

impl Parsed {
    pub(super) fn new(verbose: u8) -> Self {
        Self {
            cfg: VmConfig {
                memory: ByteSize::mib(512),
                serial: SerialMode::Off,
                ..VmConfig::default()
            },
            launch: ChLaunch {
                config: VmConfig::default(),
                boots: false,
                api_socket: None,
                event_monitor: None,
                log_file: None,
                verbose,
                net_fds: Vec::new(),
                restore: None,
                notes: Vec::new(),
                lull_knobs: Vec::new(),
            },
            lull_knobs: Vec::new(),
            console_pty: false,
        }
    }
}

const fn flag(id: &'static str, takes: Takes, effect: Effect, help: &'static str) -> Flag {
    Flag {
        id,
        short: None,
        takes,
        effect,
        help,
    }
}

const fn refused(id: &'static str, why: &'static str) -> Flag {
    flag(id, Takes::Any, Effect::Refused(why), "")
}

/// Every flag: lull's part of Cloud Hypervisor's command line, then the ones it refuses.
pub(super) const FLAGS: [Flag; 41] = [
    flag(
        "api-socket",
        Takes::One("path=P|fd=N|P"),
        Effect::Run(set_api_socket),
        "Serve the API (a subset of Cloud Hypervisor's) on a socket created at P, or on the \
         inherited listening socket N",
    ),
    flag(
        "kernel",
        Takes::One("P"),
        Effect::Vm(set_kernel),
        "The kernel to boot at once",
    ),
    flag(
        "initramfs",
        Takes::One("P"),
        Effect::Vm(set_initramfs),
        "Its initramfs",
    ),
    flag(
        "cmdline",
        Takes::OneHyphen("S"),
        Effect::Vm(set_cmdline),
        "Its command line",
    ),
    flag(
        "cpus",
        Takes::One("boot=N[,max=N]"),
        Effect::Vm(set_cpus),
        "vCPUs (max must equal boot: no hotplug)",
    ),
    flag(
        "memory",
        Takes::One("size=N[K|M|G][,shared=on|off]"),
        Effect::Vm(set_memory),
        "Guest RAM",
    ),
    flag(
        "disk",
        Takes::Many("path=P[,readonly=on][,serial=S]"),
        Effect::Vm(set_disks),
        "Raw images on virtio-blk (several values, repeatable)",
    ),
    flag(
        "net",
        Takes::Many("tap=NAME|fd=N[,mac=M][,ip=A,mask=M]"),
        Effect::Vm(set_nets),
        "Existing taps, or an inherited tap fd (IFF_TAP|IFF_NO_PI, IFF_VNET_HDR or not), on \
         virtio-net (several values, repeatable)",
    ),
    flag(
        "serial",
        Takes::One("off|null|tty|pty|file=P"),
        Effect::Vm(set_serial),
        "The serial port (tty: lull's stdio; pty: a new pseudo-terminal, its path in vm.info)",
    ),
    flag(
        "console",
        Takes::One("off|null|pty"),
        Effect::Run(set_console),
        "lull has no virtio console: off, or pty (the serial port's pty; the guest's console \
         is ttyS0)",
    ),
    flag(
        "debug-console",
        Takes::One("off|null"),
        Effect::Run(set_console),
        "",
    ),
    flag(
        "rng",
        Takes::One("src=P"),
        Effect::Run(set_rng),
        "Accepted: lull has no virtio-rng",
    ),
    flag(
        "event-monitor",
        Takes::One("path=P|fd=N"),
        Effect::Run(set_event_monitor),
        "Write Cloud Hypervisor's JSON event records (booted, paused, shutdown...) to the file \
         or FIFO P, or to the inherited fd N (with --api-socket)",
    ),
    flag(
        "log-file",
        Takes::One("P"),
        Effect::Run(set_log_file),
        "The log, instead of stderr",
    ),
    Flag {
        id: "v",
        short: Some('v'),
        takes: Takes::Count,
        effect: Effect::Clap,
        help: "More log output (-vv: more still)",
    },
    flag(
        "seccomp",
        Takes::One("true|false|log"),
        Effect::Vm(set_seccomp),
        "lull's seccomp filters",
    ),
    flag(
        "platform",
        Takes::One("..."),
        Effect::Run(set_platform),
        "Accepted: lull has no PCI segments, UUID or OEM strings",
    ),
    flag(
        "lull",
        Takes::EachOne("KEY=VALUE[,KEY=VALUE]"),
        Effect::Vm(add_lull_knobs),
        "lull's own flags (`lull run --help`), e.g. --lull timer-model=pull,halt-poll=adaptive",
    ),
    flag(
        "restore",
        Takes::One("source_url=file:///DIR[,resume=true][,prefault=on]"),
        Effect::Run(set_restore),
        "The snapshot's VM instead (with no VM flag): paused for vm.resume on --api-socket, or \
         run at once with resume=true",
    ),
    Flag {
        id: "version",
        short: Some('V'),
        takes: Takes::Version,
        effect: Effect::Clap,
        help: "Say the Cloud Hypervisor version lull follows",
    },
    Flag {
        id: "help",
        short: Some('h'),
        takes: Takes::Help,
        effect: Effect::Clap,
        help: "This help",
    },
    refused("firmware", "lull boots a kernel directly (--kernel)"),
    refused("fs", "lull has no virtio-fs"),
    refused("pmem", "lull has no virtio-pmem"),
    refused("vsock", "lull has no virtio-vsock"),
    refused("device", "lull has no VFIO passthrough"),
    refused("user-device", "lull has no vfio-user"),
    refused("vdpa", "lull has no vDPA"),
    refused("numa", "lull has no NUMA topology"),
    refused("balloon", "lull has no balloon"),
    refused("watchdog", "lull has no watchdog"),
    refused("memory-zone", "lull has no memory zones"),
    refused("tpm", "lull has no TPM"),
    refused("sgx-epc", "lull has no SGX"),
    refused("landlock", "lull uses seccomp, not landlock"),
    refused("landlock-rules", "lull uses seccomp, not landlock"),
    refused("pci-segment", "lull's devices are on virtio-mmio"),
    refused("gdb", "lull has no gdb stub"),
    refused("igvm", "lull boots a kernel directly (--kernel)"),
    refused(
        "rate-limit-group",
        "lull's rate limits are per device (--lull disk=...)",
    ),
    refused("pvpanic", "lull has no pvpanic device"),
];

/// The clap command of [`FLAGS`] (no program name: it reads the arguments after it).
pub(super) fn command() -> Command {
    let cmd = Command::new("cloud-hypervisor")
        .no_binary_name(true)
        .version(CH_VERSION)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .about(
            "lull, invoked as cloud-hypervisor: Cloud Hypervisor's command line for what lull has.",
        )
        .override_usage("cloud-hypervisor [OPTIONS]")
        .after_help(refusals());
    FLAGS.iter().fold(cmd, |cmd, f| cmd.arg(f.arg()))
}

/// The help's last part: the flags lull refuses, with the reasons.
fn refusals() -> String {
    let mut text = String::from(
        "Refused (exit status 2, the reason named), as is any flag not listed here:\n",
    );
    for f in &FLAGS {
        if let Effect::Refused(why) = f.effect {
            text.push_str(&format!("  {:<20}{why}\n", f.name()));
        }
    }
    text.push_str("See docs/ORCHESTRATION.md.");
    text
}

fn one(values: Vec<String>) -> String {
    values.into_iter().next().unwrap_or_default()
}

fn set_api_socket(p: &mut Parsed, _: &str, v: Vec<String>) -> Result<(), ChError> {
    let value = one(v);
    let socket = if let Some(path) = value.strip_prefix("path=") {
        ApiSocketArg::Path(path.into())
    } else if let Some(fd) = value.strip_prefix("fd=") {
        ApiSocketArg::Fd(fd.parse().map_err(|_| ChError::BadValue {
            option: "--api-socket fd".into(),
            value: fd.into(),
            expected: "a file descriptor number",
        })?)
    } else {
        ApiSocketArg::Path(value.into())
    };
    p.launch.api_socket = Some(socket);
    Ok(())
}

fn set_event_monitor(p: &mut Parsed, name: &str, v: Vec<String>) -> Result<(), ChError> {
    let value = one(v);
    let target = if let Some(path) = value.strip_prefix("path=") {
        if path.is_empty() {
            return Err(ChError::EmptyPath(format!("{name} path=")));
        }
        EventMonitorArg::Path(path.into())
    } else if let Some(fd) = value.strip_prefix("fd=") {
        EventMonitorArg::Fd(fd.parse().map_err(|_| ChError::BadValue {
            option: format!("{name} fd"),
            value: fd.into(),
            expected: "a file descriptor number",
        })?)
    } else {
        return Err(ChError::BadValue {
            option: name.into(),
            value,
            expected: "path=P or fd=N",
        });
    };
    p.launch.event_monitor = Some(target);
    Ok(())
}

fn set_kernel(p: &mut Parsed, _: &str, v: Vec<String>) -> Result<(), ChError> {
    p.cfg.kernel = Some(one(v).into());
    p.launch.boots = true;
    Ok(())
}

fn set_initramfs(p: &mut Parsed, _: &str, v: Vec<String>) -> Result<(), ChError> {
    p.cfg.initramfs = Some(one(v).into());
    Ok(())
}

fn set_cmdline(p: &mut Parsed, _: &str, v: Vec<String>) -> Result<(), ChError> {
    p.cfg.cmdline = Some(one(v));
    Ok(())
}

fn set_cpus(p: &mut Parsed, name: &str, v: Vec<String>) -> Result<(), ChError> {
    p.cfg.cpus = options::cpus(&options::split(name, &one(v)), &mut p.launch.notes)?;
    Ok(())
}

fn set_memory(p: &mut Parsed, name: &str, v: Vec<String>) -> Result<(), ChError> {
    p.cfg.memory = options::memory(&options::split(name, &one(v)), &mut p.launch.notes)?;
    Ok(())
}

fn set_disks(p: &mut Parsed, name: &str, v: Vec<String>) -> Result<(), ChError> {
    for value in v {
        let disk = options::disk(&options::split(name, &value), &mut p.launch.notes)?;
        p.cfg.disks.push(disk);
    }
    Ok(())
}

fn set_nets(p: &mut Parsed, name: &str, v: Vec<String>) -> Result<(), ChError> {
    for value in v {
        let net = options::net(&options::split(name, &value), &mut p.launch.notes)?;
        match net.source {
            TapSource::Name(_) => p.cfg.nets.push(net.to_config()?),
            TapSource::Fd(_) => p.launch.net_fds.push(net),
        }
    }
    Ok(())
}

fn set_serial(p: &mut Parsed, name: &str, v: Vec<String>) -> Result<(), ChError> {
    let value = one(v);
    let (mode, file) = match value.split_once('=') {
        Some((mode, file)) => (mode, Some(file)),
        None => (value.as_str(), None),
    };
    p.cfg.serial = options::serial(name, mode, file)?;
    Ok(())
}

fn set_console(p: &mut Parsed, name: &str, v: Vec<String>) -> Result<(), ChError> {
    let pty = options::console(name, &one(v))?;
    if pty && name == "--debug-console" {
        return Err(ChError::Refused {
            option: format!("{name} pty"),
            why: "lull has no debug console: leave it off",
        });
    }
    p.console_pty |= pty;
    Ok(())
}

fn set_rng(p: &mut Parsed, name: &str, v: Vec<String>) -> Result<(), ChError> {
    options::rng(&options::split(name, &one(v)), &mut p.launch.notes)
}

fn set_log_file(p: &mut Parsed, _: &str, v: Vec<String>) -> Result<(), ChError> {
    p.launch.log_file = Some(one(v).into());
    Ok(())
}

fn set_seccomp(p: &mut Parsed, name: &str, v: Vec<String>) -> Result<(), ChError> {
    p.cfg.seccomp = match one(v).as_str() {
        "true" => SeccompMode::On,
        "false" => SeccompMode::Off,
        "log" => SeccompMode::Log,
        other => {
            return Err(ChError::BadValue {
                option: name.into(),
                value: other.into(),
                expected: "true, false or log",
            })
        }
    };
    Ok(())
}

fn set_platform(p: &mut Parsed, _: &str, v: Vec<String>) -> Result<(), ChError> {
    p.launch.notes.push(format!(
        "--platform {}: lull has no PCI segments, UUID or OEM strings",
        one(v)
    ));
    Ok(())
}

fn add_lull_knobs(p: &mut Parsed, _: &str, v: Vec<String>) -> Result<(), ChError> {
    p.lull_knobs.extend(v);
    Ok(())
}

fn set_restore(p: &mut Parsed, name: &str, v: Vec<String>) -> Result<(), ChError> {
    let opts = options::split(name, &one(v));
    p.launch.restore = Some(restore::restore(
        &opts,
        restore::Front::Flag,
        &mut p.launch.notes,
    )?);
    Ok(())
}
