//! The VM configuration: one schema for the command line, `--config FILE` and `vm.create`
//! (JSON).
//!
//! Precedence: built-in defaults, then the config file, then flags given on the command line
//! (see `args`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use timer::ModelKind;

use crate::config::knobs::{
    CpuQuotaConfig, GlobalTimersConfig, HaltPollMode, IdleInjectConfig, TimerAdvanceMode,
    TimerSlack, WakePlacementMode,
};
use crate::size::ByteSize;

mod args;
pub mod ch;
mod disk;
mod error;
mod file;
pub mod knob;
pub mod knobs;
mod limits;
mod memory_restore;
mod net;
pub mod restore_nets;
mod serial;
mod snapshot_url;
mod validate;

pub use args::{RestoreFlags, VmArgs};
pub use disk::{DiskConfig, DiskConfigError};
pub use error::ConfigError;
pub use limits::{
    MAX_CONFIG_BYTES, MAX_CPUS, MAX_DISKS, MAX_MEMORY, MAX_TIMER_SLACK_NS, MAX_VIRTIO_DEVICES,
    MIN_MEMORY,
};
pub use memory_restore::{MemoryRestore, MemoryRestoreMode};
pub use net::{MacAddr, MacAddrError, NetConfig, NetConfigError, TAP_NAME_MAX};
pub use serial::{SerialMode, SerialModeError};
pub use snapshot_url::{dir_of_url, SnapshotUrlError};

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

/// Everything lull needs to build and run one VM.
///
/// One declaration for the three ways in: each field is a flag of `lull run` (clap, its doc
/// comment the `--help` text), a field of `--config FILE` and the body of `vm.create` (serde).
/// The flags are taken through [`VmArgs`], which applies the ones given over the file.
// `remote = "Self"`: the derived code becomes `VmConfig::serialize`/`deserialize`, and the
// traits (in `file`) take a JSON object only. No field has a clap default: a flag's absence
// must leave the file's value (see `args`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default, remote = "Self")]
pub struct VmConfig {
    /// Guest kernel: an ELF with a PVH entry note (e.g. vmlinux, lull's test guests), a bzImage,
    /// or a multiboot (v1) ELF32 image (e.g. kvm-unit-tests' x86 tests).
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,

    /// Initial ramdisk (cpio, optionally compressed) handed to the kernel.
    #[arg(long, value_name = "PATH")]
    pub initramfs: Option<PathBuf>,

    /// Kernel command line. Default: `console=ttyS0 reboot=k panic=-1`, plus the workarounds
    /// a PVM-based host needs (see docs/GUEST-ABI.md).
    #[arg(long, value_name = "STR")]
    pub cmdline: Option<String>,

    /// Number of vCPUs (1 to 254). Default: 1.
    #[arg(long, value_name = "N")]
    pub cpus: u32,

    /// Guest RAM with an optional K, M or G suffix (32M to 64G), a multiple of 4K (guest
    /// memory is mapped in whole pages; another size is refused with status 4). Default: 256M.
    #[arg(long, value_name = "SIZE")]
    pub memory: ByteSize,

    /// Interrupt controller model. `kernel`: KVM's in-kernel LAPIC/IOAPIC/PIC with KVM's halt
    /// polling, the industry baseline. `user`: lull emulates every vCPU's LAPIC and the IOAPIC
    /// and handles HLT itself, so a halted vCPU thread sleeps until its own timer, an interrupt
    /// aimed at it, or VM control. Default: user.
    #[arg(long, value_enum, value_name = "MODE")]
    pub irqchip: IrqchipMode,

    /// How guest timers are expired with `--irqchip user`. `pull`: on the vCPU that armed
    /// them, a halted vCPU's global timers pulled by running vCPUs (Linux timer-migration
    /// model); `push`: every vCPU arms a host timer for each of its timers; `central`: one
    /// timer thread expires everything and kicks vCPUs (QEMU-style). Default: pull. With
    /// `--irqchip kernel`, KVM expires the guest's timers: `push` and `central` are refused
    /// (status 4) and `pull` has no effect.
    #[arg(long, value_enum, value_name = "MODEL")]
    pub timer_model: ModelKind,

    /// Halt polling with `--irqchip user`: `off`, a window with its unit such as `50us` (ns,
    /// us, ms, s; a bare number is refused), or `adaptive`
    /// (grows and shrinks like KVM's halt_poll_ns, but never polls past the vCPU's next timer,
    /// skips polling when only its own timer has been waking it, and learns halts with a timer
    /// armed apart from halts without one). Default: adaptive.
    #[arg(long, value_name = "off|DURATION|adaptive")]
    pub halt_poll: Option<HaltPollMode>,

    /// Timer advance with `--irqchip user`, after KVM's lapic_timer_advance: a vCPU's host
    /// timer for its LAPIC deadline fires early by the wake-up latency it has been seeing, and
    /// the vCPU waits (spins) until the deadline before the interrupt is made pending, never
    /// delivering it early. `off`, `adaptive` (learned per vCPU, at most 100us), `adaptive=MAX`,
    /// or a fixed duration such as `20us`. Default: adaptive. Refused with `--irqchip kernel`
    /// (KVM has its own, `lapic_timer_advance_ns`), as are --halt-poll, --wake-placement,
    /// --idle-inject, --cpu-quota and --global-timers.
    #[arg(long, value_name = "off|adaptive[=MAX]|DURATION")]
    pub timer_advance: Option<TimerAdvanceMode>,

    /// Timer slack with `--irqchip user`: a halted vCPU's wake-up for its next timer may come
    /// anywhere in `[deadline - advance, deadline - advance + SLACK]` instead of as close to
    /// the deadline as the host allows, so the host kernel serves the wake-ups of vCPUs (of
    /// this VM and of others on the same host CPU) that fall within SLACK of each other with
    /// one CPU wake-up: fewer idle exits, less power, for timers up to SLACK late. Never early:
    /// an interrupt is injected at or after its deadline. `off`: hard wake-ups (an absolute
    /// timerfd, 1 ns thread slack), today's behaviour. At most 10ms. Default: off. With
    /// `--irqchip kernel` KVM's hrtimers wake vCPUs: a slack is refused (status 4), `off` is
    /// accepted and changes nothing.
    #[arg(long, value_name = "off|DURATION")]
    pub timer_slack: Option<TimerSlack>,

    /// Timer-aware wake placement with `--irqchip user`. `cache-hot`: a vCPU that blocks
    /// for a short sleep (its next own deadline at most MAX away, default 2ms) is bound to
    /// the host CPU it blocked on until it wakes, so it wakes where its caches are warm; long
    /// sleeps never bind, and a bound wake-up that comes late (its CPU was busy) stops the
    /// binding for 100ms. `off`: the host scheduler places every wake-up. Default: off,
    /// because on the 2-core hosts it was measured on, Linux already woke 99.5% of 1ms
    /// sleepers on their previous CPU: binding cut the rest by a third to a half, gained no
    /// wake-up latency (p50), and its two syscalls per sleep cost more than the cache refill
    /// it saves (docs/PERFORMANCE.md, "Wake placement").
    #[arg(long, value_name = "off|cache-hot[=MAX]")]
    pub wake_placement: Option<WakePlacementMode>,

    /// Synchronized idle injection with `--irqchip user`: the first PERCENT of every period
    /// (ms) holds all vCPUs idle together; interrupts and timers in the window wait for its
    /// end. Example: percent=25,period=100.
    #[arg(long, value_name = "percent=P,period=MS")]
    pub idle_inject: Option<IdleInjectConfig>,

    /// Per-VM CPU quota with `--irqchip user`: QUOTA ms of guest run time per PERIOD ms, all
    /// vCPUs together; vCPUs are parked until the next period once it is used. Periods start
    /// at a random phase (default), so VMs started together interleave, or `aligned` to the
    /// host clock (every VM's periods at the same instants). Example: quota=50,period=100.
    /// A quota of at least `--cpus` x period could never park a vCPU and is refused (status
    /// 4); a quota above the period is meaningful with several vCPUs.
    #[arg(long, value_name = "quota=MS,period=MS[,phase=random|aligned]")]
    pub cpu_quota: Option<CpuQuotaConfig>,

    /// Synthetic device/housekeeping load with `--irqchip user`: each vCPU keeps COUNT global
    /// timers armed, re-armed every ~PERIOD ms (jittered), to exercise the timer models.
    #[arg(long, value_name = "COUNT[,period=MS]")]
    pub global_timers: Option<GlobalTimersConfig>,

    /// Serial console: `stdio` (the terminal), `off`, or `file=PATH` (appended). Default: stdio.
    /// The file must not be one of the VM's inputs (kernel, initramfs, config, disk: compared
    /// by device and inode, refused with status 4 before anything is written); if a write to
    /// it fails (a full disk, /dev/full), lull stops the VM at once and says so (status 4)
    /// rather than lose the guest's output.
    #[arg(long, value_name = "MODE")]
    pub serial: SerialMode,

    /// Write run metrics (exits by reason, halts, wake-ups by cause, timer expiries, lateness
    /// histogram, run and boot time) as JSON to this file at exit; `-` for stderr. The file
    /// must not be one of the VM's inputs or the serial file (refused with status 4 before
    /// anything is written). Written also when SIGINT or SIGTERM stops the run, however early.
    #[arg(long, value_name = "PATH")]
    pub metrics: Option<PathBuf>,

    /// Seccomp filters on the vCPU, timer and VMM threads, installed before they run guest-
    /// driven code. `on`: a syscall outside each thread's allow-list kills lull (SIGSYS);
    /// `log`: it is allowed and logged by the kernel (find what a new path needs); `off`: no
    /// filter. Default: on.
    #[arg(long, value_enum, value_name = "MODE")]
    pub seccomp: crate::config::knobs::SeccompMode,

    /// KVM's paravirtual EOI with `--irqchip user`: lull advertises it in CPUID and the guest
    /// ends an interrupt by clearing a flag in its memory instead of writing the EOI register
    /// (one exit less per interrupt; Linux uses it by itself). Default: on.
    #[arg(long, value_enum, value_name = "on|off")]
    pub pv_eoi: Switch,

    /// lull's paravirtual TSC deadline with `--irqchip user`: lull advertises it in its own
    /// CPUID leaves (0x40000100, after KVM's) and a guest that enables it arms its next LAPIC
    /// timer deadline with a store to its memory, which lull reads at the next exit, instead
    /// of a WRMSR: a timer event of a vCPU that arms and halts then costs one exit, not two.
    /// Only guests written for it use it (the kit's `idle-sim` with `pv_deadline=1`); see
    /// docs/GUEST-ABI.md. Default: on.
    #[arg(long, value_enum, value_name = "on|off")]
    pub pv_deadline: Switch,

    /// x2APIC for the guest: `off` clears CPUID.1:ECX[21], and the LAPIC (lull's or KVM's)
    /// then refuses x2APIC mode (setting IA32_APIC_BASE.EXTD and the x2APIC MSRs #GP), so the
    /// guest stays in xAPIC mode. Default: on.
    #[arg(long, value_enum, value_name = "on|off")]
    pub x2apic: Switch,

    /// A virtio-blk disk backed by a raw image FILE (its size a non-zero multiple of 512
    /// bytes), repeatable (at most 8). `readonly=on`: the guest sees a read-only disk and its
    /// writes fail. The guest finds disk n's virtio-mmio registers at 0xd0000000 + n * 4K on
    /// IOAPIC line 5, 6, 7, 9, 10, 11, 14, 15; a Linux (or PVH) guest is told on its command
    /// line (`virtio_mmio.device=4K@0xd0000000:5`). Requests run on the vCPU that notified;
    /// FLUSH is an fdatasync, and lull syncs every disk when the VM stops (also on SIGTERM).
    /// Rate limits (token buckets, as Firecracker's): `bandwidth=BYTES` a second (K, M, G
    /// binary suffixes), `ops=N` requests a second, `burst=BYTES` a one-time extra, and
    /// `refill=DURATION` the buckets' depth in time (default 100ms: a bucket holds 100 ms of
    /// its rate). A request that does not fit waits in its queue until a refill timer (see
    /// --device-timers) fires at the instant it will. lull holds an flock on each image for
    /// the VM's life: exclusive for a writable disk, shared for `readonly=on`, so an image
    /// given twice as writable, to this lull or to another, is refused (status 4, naming the
    /// holder). If the image shrinks under the VM, a request past its new end fails with
    /// VIRTIO_BLK_S_IOERR (the guest sees an I/O error, the file is not re-grown) and is
    /// counted in the metrics (`disk_shrunk_image_errors`).
    #[arg(
        long = "disk",
        value_name = "path=FILE[,readonly=on][,bandwidth=BYTES][,ops=N][,burst=BYTES][,refill=D]"
    )]
    pub disks: Vec<DiskConfig>,

    /// A virtio-net device on the host tap device NAME, repeatable (disks and nets together
    /// at most 8). lull attaches to the tap (/dev/net/tun, IFF_TAP|IFF_NO_PI) and never
    /// creates one: it must exist, be free and belong to lull's user (or lull needs
    /// CAP_NET_ADMIN), e.g. `ip tuntap add dev lulltap0 mode tap user USER; ip link set
    /// lulltap0 up`; a tap lull cannot attach to stops it before the guest runs (exit
    /// status 4). The guest finds the nets after the disks: the next virtio-mmio
    /// windows and IOAPIC lines, on the Linux command line after the disks' entries.
    /// `mac=`: the device's address (default 52:54:00 and three bytes hashed from NAME, the
    /// same on every run). Frames the guest sends go to the tap on the notifying vCPU; frames
    /// from the tap reach the guest from lull's VMM thread, only into buffers the guest has
    /// posted (until then they wait in the tap's queue). Rate limits of the frames the guest
    /// sends: as for --disk (a frame is one operation).
    #[arg(
        long = "net",
        value_name = "tap=NAME[,mac=XX:XX:XX:XX:XX:XX][,bandwidth=BYTES][,ops=N]"
    )]
    pub nets: Vec<NetConfig>,

    /// What expires the refill timers of rate-limited disks and nets. `hierarchy` (the default with
    /// --irqchip user): global timers in the --timer-model, armed on the vCPU that ran the
    /// request; in `pull` a running vCPU expires them and a halted one is never woken for
    /// them while another runs; no extra thread or host timer. `timerfd` (the only choice
    /// with --irqchip kernel): one timerfd per device on the VMM thread's event loop, which
    /// wakes that thread at each refill (Firecracker's way; the baseline to compare with).
    #[arg(long, value_enum, value_name = "hierarchy|timerfd")]
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
            timer_model: ModelKind::Pull,
            halt_poll: None,
            timer_advance: None,
            timer_slack: None,
            wake_placement: None,
            idle_inject: None,
            cpu_quota: None,
            global_timers: None,
            serial: SerialMode::Stdio,
            metrics: None,
            seccomp: crate::config::knobs::SeccompMode::On,
            pv_eoi: Switch::On,
            pv_deadline: Switch::On,
            x2apic: Switch::On,
            disks: Vec::new(),
            nets: Vec::new(),
            device_timers: None,
        }
    }
}

impl VmConfig {
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
    use devices::rate_limiter::RateLimit;

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
