//! The VM configuration: one schema for the command line and for `--config FILE` (JSON).
//!
//! Precedence: built-in defaults, then the config file, then flags given on the command line.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use devices::rate_limiter::{RateLimit, RateLimitError};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::idle::advance::TimerAdvanceMode;
use crate::idle::global_load::GlobalTimersConfig;
use crate::idle::halt_poll::HaltPollMode;
use crate::idle::inject::IdleInjectConfig;
use crate::idle::placement::WakePlacementMode;
use crate::idle::quota::CpuQuotaConfig;
use crate::size::ByteSize;

mod file;
mod net;
mod validate;

pub use file::MAX_CONFIG_BYTES;
pub use net::{MacAddr, MacAddrError, NetConfig, NetConfigError, TAP_NAME_MAX};

/// Smallest guest memory lull accepts.
pub const MIN_MEMORY: ByteSize = ByteSize::mib(32);
/// Largest guest memory lull accepts.
pub const MAX_MEMORY: ByteSize = ByteSize(64 << 30);
/// Largest vCPU count: APIC IDs 0..N-1 plus the IOAPIC's ID N must fit below the broadcast ID.
pub const MAX_CPUS: u32 = 254;

/// Which interrupt controller model the VM uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum IrqchipMode {
    /// KVM's in-kernel LAPIC, IOAPIC and PIC with KVM's halt polling: the industry baseline.
    Kernel,
    /// lull's own LAPIC and IOAPIC, HLT handled in user space, timers in `--timer-model`.
    User,
}

impl IrqchipMode {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::User => "user",
        }
    }
}

/// How guest timers are expired with `--irqchip user`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TimerModelKind {
    /// Timers queue on the arming vCPU; a halted vCPU's global timers are pulled by running
    /// vCPUs through a hierarchy (Linux's timer-migration model). One host timer per vCPU.
    Pull,
    /// Every vCPU arms a host timer for every timer on its base, global ones included.
    Push,
    /// One VMM timer thread expires all timers and kicks the vCPUs (QEMU-style).
    Central,
}

impl TimerModelKind {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pull => "pull",
            Self::Push => "push",
            Self::Central => "central",
        }
    }
}

/// What expires the refill timers of rate-limited devices (`--device-timers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DeviceTimerMode {
    /// Global timers in the user irqchip's timer model, armed on the base of the vCPU that
    /// ran the request and expired by whichever thread the model says (a running vCPU in
    /// `pull`). Needs `--irqchip user`.
    Hierarchy,
    /// One timerfd per device on the VMM thread's event loop (Firecracker's way).
    Timerfd,
}

impl DeviceTimerMode {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hierarchy => "hierarchy",
            Self::Timerfd => "timerfd",
        }
    }
}

/// Where the guest's serial console goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SerialMode {
    /// lull's standard input and output.
    Stdio,
    /// Nowhere (output dropped, no input).
    Off,
    /// Appended to a file (no input).
    File(PathBuf),
}

/// A `--serial` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{0}' is not a serial mode: use stdio, off or file=PATH")]
pub struct SerialModeError(String);

impl FromStr for SerialMode {
    type Err = SerialModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stdio" => Ok(Self::Stdio),
            "off" => Ok(Self::Off),
            _ => match s.strip_prefix("file=") {
                Some(path) if !path.is_empty() => Ok(Self::File(PathBuf::from(path))),
                _ => Err(SerialModeError(s.to_string())),
            },
        }
    }
}

impl fmt::Display for SerialMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stdio => f.write_str("stdio"),
            Self::Off => f.write_str("off"),
            Self::File(p) => write!(f, "file={}", p.display()),
        }
    }
}

impl Serialize for SerialMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for SerialMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A feature that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Switch {
    /// Enabled.
    #[default]
    On,
    /// Disabled.
    Off,
}

impl Switch {
    /// True for [`Switch::On`].
    pub fn is_on(self) -> bool {
        self == Self::On
    }
}

/// Most disks one VM takes (one MMIO window and one IOAPIC line each, see `layout`).
pub const MAX_DISKS: usize = crate::setup::layout::VIRTIO_MMIO_IRQS.len();
/// Most virtio devices (disks and network devices together) one VM takes: they share the
/// windows and lines.
pub const MAX_VIRTIO_DEVICES: usize = crate::setup::layout::VIRTIO_MMIO_IRQS.len();

/// One `--disk`: a raw image file behind a virtio-blk device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    /// The image file (its size a non-zero multiple of 512 bytes).
    pub path: PathBuf,
    /// The guest may not write (the device offers VIRTIO_BLK_F_RO, writes fail).
    pub readonly: bool,
    /// Rate limit of the device's requests (`bandwidth=`, `ops=`, `burst=`, `refill=`).
    pub rate: RateLimit,
}

/// A `--disk` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiskConfigError {
    /// No `path=`.
    #[error("'{0}' is not a disk: use path=FILE[,readonly=on|off][,bandwidth=BYTES][,ops=N]")]
    NoPath(String),
    /// An option lull does not know.
    #[error(
        "Unknown --disk option '{0}': the options are path=FILE, readonly=on|off, \
         bandwidth=BYTES (a second), ops=N (a second), burst=BYTES and refill=DURATION"
    )]
    UnknownOption(String),
    /// A rate option with a bad value.
    #[error("--disk: {0}")]
    Rate(#[from] RateLimitError),
    /// `readonly=` with a value other than on or off.
    #[error("--disk readonly={0} is neither on nor off")]
    BadReadonly(String),
}

impl FromStr for DiskConfig {
    type Err = DiskConfigError;

    /// `path=FILE[,readonly=on|off][,bandwidth=BYTES][,ops=N][,burst=BYTES][,refill=DURATION]`;
    /// the options may come in any order.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut path = None;
        let mut readonly = false;
        let mut rate = RateLimit::default();
        for option in s.split(',') {
            let (key, value) = option.split_once('=').unwrap_or((option, ""));
            if rate.apply_option(key, value)? {
                continue;
            }
            if let Some(p) = option.strip_prefix("path=").filter(|p| !p.is_empty()) {
                path = Some(PathBuf::from(p));
            } else if let Some(v) = option.strip_prefix("readonly=") {
                readonly = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(DiskConfigError::BadReadonly(v.to_string())),
                };
            } else if !option.starts_with("path=") {
                return Err(DiskConfigError::UnknownOption(option.to_string()));
            }
        }
        match path {
            Some(path) => Ok(Self {
                path,
                readonly,
                rate,
            }),
            None => Err(DiskConfigError::NoPath(s.to_string())),
        }
    }
}

impl fmt::Display for DiskConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "path={}", self.path.display())?;
        if self.readonly {
            f.write_str(",readonly=on")?;
        }
        write!(f, "{}", self.rate)
    }
}

crate::string_serde!(DiskConfig);

/// Everything lull needs to build and run one VM.
// `remote = "Self"`: the derived code becomes `VmConfig::serialize`/`deserialize`, and the
// traits (in `file`) take a JSON object only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, remote = "Self")]
pub struct VmConfig {
    /// Guest kernel: PVH ELF (e.g. `vmlinux`) or bzImage. `None`: the kit's default guest.
    pub kernel: Option<PathBuf>,
    /// Initial ramdisk.
    pub initramfs: Option<PathBuf>,
    /// Kernel command line. `None`: lull's default for the host.
    pub cmdline: Option<String>,
    /// Number of vCPUs.
    pub cpus: u32,
    /// Guest RAM.
    pub memory: ByteSize,
    /// Interrupt controller model.
    pub irqchip: IrqchipMode,
    /// Timer model (with the user irqchip).
    pub timer_model: TimerModelKind,
    /// Halt polling (user irqchip; `None`: adaptive).
    pub halt_poll: Option<HaltPollMode>,
    /// Timer advance (user irqchip; `None`: adaptive).
    pub timer_advance: Option<TimerAdvanceMode>,
    /// Wake placement (user irqchip; `None`: off).
    pub wake_placement: Option<WakePlacementMode>,
    /// Synchronized idle injection (user irqchip).
    pub idle_inject: Option<IdleInjectConfig>,
    /// Per-VM CPU quota (user irqchip).
    pub cpu_quota: Option<CpuQuotaConfig>,
    /// Synthetic global-timer load (user irqchip).
    pub global_timers: Option<GlobalTimersConfig>,
    /// Serial console sink.
    pub serial: SerialMode,
    /// Write run metrics as JSON to this file at exit.
    pub metrics: Option<PathBuf>,
    /// Seccomp filters on lull's threads (`on`: a syscall outside the allow-list kills lull).
    pub seccomp: crate::host::seccomp::SeccompMode,
    /// Offer KVM's paravirtual EOI to the guest (user irqchip).
    pub pv_eoi: Switch,
    /// Offer lull's paravirtual TSC deadline to the guest (user irqchip).
    pub pv_deadline: Switch,
    /// Offer x2APIC to the guest (CPUID.1:ECX[21]); off: the LAPIC refuses x2APIC mode.
    pub x2apic: Switch,
    /// virtio-blk disks, in the order the guest finds them.
    pub disks: Vec<DiskConfig>,
    /// virtio-net devices on host taps, found by the guest after the disks.
    pub nets: Vec<NetConfig>,
    /// What expires device timers (`None`: hierarchy with the user irqchip, else timerfd).
    pub device_timers: Option<DeviceTimerMode>,
}

impl Default for VmConfig {
    fn default() -> Self {
        Self {
            kernel: None,
            initramfs: None,
            cmdline: None,
            cpus: 1,
            memory: ByteSize::mib(256),
            irqchip: IrqchipMode::User,
            timer_model: TimerModelKind::Pull,
            halt_poll: None,
            timer_advance: None,
            wake_placement: None,
            idle_inject: None,
            cpu_quota: None,
            global_timers: None,
            serial: SerialMode::Stdio,
            metrics: None,
            seccomp: crate::host::seccomp::SeccompMode::On,
            pv_eoi: Switch::On,
            pv_deadline: Switch::On,
            x2apic: Switch::On,
            disks: Vec::new(),
            nets: Vec::new(),
            device_timers: None,
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file cannot be read.
    #[error("Cannot read config file {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is a device, FIFO or directory: lull reads regular files only.
    #[error(
        "Config file {0} is not a regular file: give a JSON file (at most 1 MiB), not a \
         device, FIFO or directory"
    )]
    NotAFile(PathBuf),
    /// The config file exceeds [`MAX_CONFIG_BYTES`].
    #[error("Config file {0} is larger than 1 MiB: a VM configuration is a small JSON object")]
    FileTooLarge(PathBuf),
    /// The config file is not valid JSON for this schema.
    #[error("Config file {path} is not valid: {source} (see `lull run --help` for the fields)")]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// `--cpus` out of range.
    #[error("--cpus {0} is out of range: use 1 to {MAX_CPUS}")]
    Cpus(u32),
    /// `--memory` out of range.
    #[error("--memory {0} is out of range: use {MIN_MEMORY} to {MAX_MEMORY}")]
    Memory(ByteSize),
    /// `--memory` not a whole number of 4 KiB pages.
    #[error(
        "--memory {0} is not a multiple of 4 KiB: guest memory is mapped in whole 4 KiB pages; \
         give a multiple of 4K (e.g. 32M, 256M, 1G)"
    )]
    MemoryAlignment(ByteSize),
    /// A `--cpu-quota` that can never park a vCPU.
    #[error(
        "--cpu-quota quota={quota_ms}ms per period={period_ms}ms is at least what {cpus} vCPU(s) \
         can run in a period ({cpus} x period), so it would never apply: give a quota below \
         {cpus} x period, or no --cpu-quota"
    )]
    QuotaNeverApplies {
        /// The quota, ms.
        quota_ms: u64,
        /// The period, ms.
        period_ms: u64,
        /// vCPUs.
        cpus: u32,
    },
    /// More disks than lull has MMIO windows and interrupt lines for.
    #[error("{0} disks given; lull takes at most {MAX_DISKS}")]
    TooManyDisks(usize),
    /// More disks and network devices together than lull has MMIO windows and lines for.
    #[error(
        "{disks} disks and {nets} network devices given; lull takes at most \
         {MAX_VIRTIO_DEVICES} of them together"
    )]
    TooManyDevices {
        /// `--disk`s.
        disks: usize,
        /// `--net`s.
        nets: usize,
    },
    /// Two `--net`s on one tap.
    #[error("Tap {0} is given to two --net devices; give each its own tap")]
    DuplicateTap(String),
    /// An idle-manager knob was given without the user irqchip.
    #[error("{0} needs --irqchip user (with --irqchip kernel, KVM decides when vCPUs run)")]
    NeedsUserIrqchip(&'static str),
}

impl VmConfig {
    /// Reads a JSON config file: a regular file of at most [`MAX_CONFIG_BYTES`] holding a
    /// JSON object.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        file::read(path)
    }

    /// What expires device timers: the setting, or the default of the irqchip.
    pub fn device_timer_mode(&self) -> DeviceTimerMode {
        match (self.device_timers, self.irqchip) {
            (Some(mode), _) => mode,
            (None, IrqchipMode::User) => DeviceTimerMode::Hierarchy,
            (None, IrqchipMode::Kernel) => DeviceTimerMode::Timerfd,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_modes_parse() {
        assert_eq!("stdio".parse(), Ok(SerialMode::Stdio));
        assert_eq!("off".parse(), Ok(SerialMode::Off));
        assert_eq!("file=/tmp/x".parse(), Ok(SerialMode::File("/tmp/x".into())));
        assert!("file=".parse::<SerialMode>().is_err());
        assert!("tty".parse::<SerialMode>().is_err());
    }

    #[test]
    fn json_schema_round_trips_and_rejects_unknown_fields() {
        let cfg: VmConfig = serde_json::from_str(
            r#"{"cpus": 2, "memory": "128M", "serial": "off", "irqchip": "user",
                "halt_poll": "adaptive", "idle_inject": "percent=20,period=50",
                "cpu_quota": "quota=25,period=100,phase=aligned", "global_timers": "4",
                "wake_placement": "cache-hot=1ms"}"#,
        )
        .unwrap();
        assert_eq!(cfg.halt_poll, Some(HaltPollMode::Adaptive));
        assert_eq!(
            cfg.wake_placement,
            Some(WakePlacementMode::CacheHot {
                max_sleep_ns: 1_000_000
            })
        );
        assert_eq!(cfg.idle_inject.map(|c| c.percent), Some(20));
        assert_eq!(cfg.cpus, 2);
        assert_eq!(cfg.memory, ByteSize::mib(128));
        assert_eq!(cfg.serial, SerialMode::Off);
        assert_eq!(cfg.irqchip, IrqchipMode::User);
        let back: VmConfig = serde_json::from_str(&serde_json::to_string(&cfg).unwrap()).unwrap();
        assert_eq!(back, cfg);
        assert!(serde_json::from_str::<VmConfig>(r#"{"cpu": 2}"#).is_err());
    }

    #[test]
    fn disks_parse_and_round_trip() {
        let d: DiskConfig = "path=/tmp/a.img,readonly=on".parse().unwrap();
        assert_eq!(
            d,
            DiskConfig {
                path: "/tmp/a.img".into(),
                readonly: true,
                rate: RateLimit::default()
            }
        );
        assert_eq!(d.to_string().parse::<DiskConfig>(), Ok(d));
        let limited: DiskConfig = "path=/a,bandwidth=10M,ops=1000".parse().unwrap();
        assert_eq!(limited.rate.bytes_per_sec, 10 << 20);
        assert_eq!(limited.rate.ops_per_sec, 1000);
        assert_eq!(limited.to_string().parse::<DiskConfig>(), Ok(limited));
        assert!(matches!(
            "path=/a,ops=x".parse::<DiskConfig>(),
            Err(DiskConfigError::Rate(_))
        ));
        let mut cfg = VmConfig::default();
        assert_eq!(cfg.device_timer_mode(), DeviceTimerMode::Hierarchy);
        cfg.irqchip = IrqchipMode::Kernel;
        assert_eq!(cfg.device_timer_mode(), DeviceTimerMode::Timerfd);
        assert!(cfg.validate().is_ok());
        cfg.device_timers = Some(DeviceTimerMode::Hierarchy);
        assert!(matches!(
            cfg.validate(),
            Err(ConfigError::NeedsUserIrqchip(_))
        ));
        assert!(
            !"readonly=off,path=b"
                .parse::<DiskConfig>()
                .unwrap()
                .readonly
        );
        assert_eq!(
            "readonly=on".parse::<DiskConfig>(),
            Err(DiskConfigError::NoPath("readonly=on".into()))
        );
        assert_eq!(
            "path=".parse::<DiskConfig>(),
            Err(DiskConfigError::NoPath("path=".into()))
        );
        assert_eq!(
            "path=a,cache=none".parse::<DiskConfig>(),
            Err(DiskConfigError::UnknownOption("cache=none".into()))
        );
        assert_eq!(
            "path=a,readonly=yes".parse::<DiskConfig>(),
            Err(DiskConfigError::BadReadonly("yes".into()))
        );
        let cfg: VmConfig =
            serde_json::from_str(r#"{"disks": ["path=/a", "path=/b,readonly=on"]}"#).unwrap();
        assert_eq!(cfg.disks.len(), 2);
        assert!(cfg.disks[1].readonly);
        let many = VmConfig {
            disks: vec![cfg.disks[0].clone(); MAX_DISKS + 1],
            ..VmConfig::default()
        };
        assert!(matches!(many.validate(), Err(ConfigError::TooManyDisks(_))));
    }

    #[test]
    fn nets_come_from_json_and_share_the_windows_with_disks() {
        let cfg: VmConfig = serde_json::from_str(
            r#"{"disks": ["path=/a"], "nets": ["tap=t0", "tap=t1,mac=52:54:00:00:00:02"]}"#,
        )
        .unwrap();
        assert_eq!(cfg.nets.len(), 2);
        assert_eq!(cfg.nets[1].mac(), MacAddr([0x52, 0x54, 0, 0, 0, 2]));
        assert!(cfg.validate().is_ok());
        let back: VmConfig = serde_json::from_str(&serde_json::to_string(&cfg).unwrap()).unwrap();
        assert_eq!(back, cfg);
        assert!(serde_json::from_str::<VmConfig>(r#"{"nets": ["tap="]}"#).is_err());
        let mut full = cfg.clone();
        full.disks = vec![cfg.disks[0].clone(); MAX_VIRTIO_DEVICES - 1];
        assert!(matches!(
            full.validate(),
            Err(ConfigError::TooManyDevices { disks: 7, nets: 2 })
        ));
        full.nets.pop();
        assert!(full.validate().is_ok());
        let twice = VmConfig {
            nets: vec![cfg.nets[0].clone(), cfg.nets[0].clone()],
            ..VmConfig::default()
        };
        assert!(matches!(twice.validate(), Err(ConfigError::DuplicateTap(t)) if t == "t0"));
    }
}
