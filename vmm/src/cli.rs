//! The `lull` command line (clap), mapped onto [`VmConfig`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{
    ConfigError, DeviceTimerMode, DiskConfig, IrqchipMode, NetConfig, SerialMode, Switch,
    TimerModelKind, VmConfig,
};
use crate::idle::advance::TimerAdvanceMode;
use crate::idle::global_load::GlobalTimersConfig;
use crate::idle::halt_poll::HaltPollMode;
use crate::idle::inject::IdleInjectConfig;
use crate::idle::placement::WakePlacementMode;
use crate::idle::quota::CpuQuotaConfig;
use crate::size::ByteSize;

const EXIT_CODES_HELP: &str = "\
Exit status:
  0        the guest reset or powered off the machine
  odd      the guest wrote v to the test-exit port 0xf4: status ((v << 1) | 1) & 0xff
  2        bad command line
  4        bad input: kernel, initramfs, config file, memory size, CPU count, API socket
           path, disk image (or one another lull holds), tap device, contradictory flags,
           an output path that is an input, a serial file that cannot be written, or the
           host out of file descriptors or memory (the message says what to raise)
  6        KVM unavailable: no /dev/kvm, no permission, or a missing capability
  8        lull failed while running the guest
  10       the guest crashed (triple fault, KVM internal error or entry failure)
  12       stopped by the user (Ctrl-A x on the console, SIGINT or SIGTERM)
  14       stopped through the management API (vm.shutdown, or vmm.shutdown of a running VM)
With --api-socket, lull exits with the status of its VM's run; if none ran, 0 after
vmm.shutdown and 12 after SIGINT or SIGTERM.";

/// lull: a KVM virtual machine monitor whose speciality is vCPU timers and idle.
#[derive(Debug, Parser)]
#[command(name = "lull", version, about, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// lull's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Boot a guest and run it until it resets, powers off or exits through the test port.
    ///
    /// Without --kernel, lull boots the default guest of the built kit (`make guests linux`):
    /// the tiny Linux kernel with its initramfs. The console is the terminal; press Ctrl-A then
    /// x to stop the VM.
    #[command(after_help = EXIT_CODES_HELP)]
    Run(RunArgs),
    /// Measure lull against the alternatives on this host: `density` (many idle VMs per mode:
    /// host CPU, wake-ups, exits, guest timer lateness, RSS), `wakeup` (IPI wake-up latency of a
    /// halted vCPU per halt-polling mode), `timer-modes` (cost per guest timer event),
    /// `idle-manager` (idle injection, CPU quota) and `boot` (boot time vs QEMU, lull's RSS).
    /// Tables on stdout, progress on stderr.
    Bench(bench::BenchArgs),
}

/// Flags of `lull run`. Each one overrides the same field of `--config`.
#[derive(Debug, Args, Default)]
pub struct RunArgs {
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
    pub cpus: Option<u32>,

    /// Guest RAM with an optional K, M or G suffix (32M to 64G), a multiple of 4K (guest
    /// memory is mapped in whole pages; another size is refused with status 4). Default: 256M.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<ByteSize>,

    /// Interrupt controller model. `kernel`: KVM's in-kernel LAPIC/IOAPIC/PIC with KVM's halt
    /// polling, the industry baseline. `user`: lull emulates every vCPU's LAPIC and the IOAPIC
    /// and handles HLT itself, so a halted vCPU thread sleeps until its own timer, an interrupt
    /// aimed at it, or VM control. Default: user.
    #[arg(long, value_enum, value_name = "MODE")]
    pub irqchip: Option<IrqchipMode>,

    /// How guest timers are expired with `--irqchip user`. `pull`: on the vCPU that armed
    /// them, a halted vCPU's global timers pulled by running vCPUs (Linux timer-migration
    /// model); `push`: every vCPU arms a host timer for each of its timers; `central`: one
    /// timer thread expires everything and kicks vCPUs (QEMU-style). Default: pull. With
    /// `--irqchip kernel`, KVM expires the guest's timers: `push` and `central` are refused
    /// (status 4) and `pull` has no effect.
    #[arg(long, value_enum, value_name = "MODEL")]
    pub timer_model: Option<TimerModelKind>,

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
    pub serial: Option<SerialMode>,

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
    pub seccomp: Option<crate::host::seccomp::SeccompMode>,

    /// KVM's paravirtual EOI with `--irqchip user`: lull advertises it in CPUID and the guest
    /// ends an interrupt by clearing a flag in its memory instead of writing the EOI register
    /// (one exit less per interrupt; Linux uses it by itself). Default: on.
    #[arg(long, value_enum, value_name = "on|off")]
    pub pv_eoi: Option<Switch>,

    /// lull's paravirtual TSC deadline with `--irqchip user`: lull advertises it in its own
    /// CPUID leaves (0x40000100, after KVM's) and a guest that enables it arms its next LAPIC
    /// timer deadline with a store to its memory, which lull reads at the next exit, instead
    /// of a WRMSR: a timer event of a vCPU that arms and halts then costs one exit, not two.
    /// Only guests written for it use it (the kit's `idle-sim` with `pv_deadline=1`); see
    /// docs/GUEST-ABI.md. Default: on.
    #[arg(long, value_enum, value_name = "on|off")]
    pub pv_deadline: Option<Switch>,

    /// x2APIC for the guest: `off` clears CPUID.1:ECX[21], and the LAPIC (lull's or KVM's)
    /// then refuses x2APIC mode (setting IA32_APIC_BASE.EXTD and the x2APIC MSRs #GP), so the
    /// guest stays in xAPIC mode. Default: on.
    #[arg(long, value_enum, value_name = "on|off")]
    pub x2apic: Option<Switch>,

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

    /// Read the VM configuration from a JSON file with the same fields as these flags
    /// (kernel, initramfs, cmdline, cpus, memory, irqchip, timer_model, halt_poll, timer_advance,
    /// wake_placement, idle_inject, cpu_quota, global_timers, serial, metrics, seccomp, pv_eoi,
    /// pv_deadline, x2apic, disks: a list of `--disk` values, nets: a list of `--net` values,
    /// and device_timers); flags win (`--disk` and `--net` replace the file's lists). The file
    /// must be a regular file of at most 1 MiB holding a JSON object (not an array; a device
    /// such as /dev/zero is refused before it is read).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Serve the management API (a subset of Cloud Hypervisor's REST API: vmm.ping,
    /// vm.create, vm.boot, vm.info, vm.counters, vm.shutdown, vmm.shutdown) on a Unix socket
    /// created at PATH with owner-only permissions, instead of booting at once. VM flags or
    /// --config given with it form the created VM (boot it with vm.boot); without them, the
    /// VM comes from vm.create, which checks the kernel, initramfs, disks, taps and output
    /// paths as `lull run` does and answers 400 with the reason; a VM whose vm.boot failed may
    /// be created again. lull runs until vmm.shutdown or SIGINT/SIGTERM. See docs/API.md.
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,

    /// lull's own machine code on 2 MiB pages: `on` copies lull's text into transparent huge
    /// pages at start-up, which cuts the TLB misses of a vCPU thread waking from a long sleep:
    /// 2-3 us less of lull's handling per timer event on our hosts, 1-4% of an event's CPU,
    /// too little to show in `lull bench density` (see docs/PERFORMANCE.md). It costs each
    /// lull process ~2 MiB more resident memory (a private copy instead of the shared page
    /// cache), and `perf` then cannot name lull's functions. Where the host cannot give huge
    /// pages, lull warns and runs from its file pages. Default: off.
    #[arg(long, value_enum, value_name = "on|off")]
    pub huge_text: Option<Switch>,

    /// More log output on stderr (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

impl RunArgs {
    /// True if any flag that describes the VM (or `--config`) was given.
    pub fn describes_vm(&self) -> bool {
        // Destructured in full so that a new flag must be sorted in here.
        let Self {
            kernel,
            initramfs,
            cmdline,
            cpus,
            memory,
            irqchip,
            timer_model,
            halt_poll,
            timer_advance,
            wake_placement,
            idle_inject,
            cpu_quota,
            global_timers,
            serial,
            metrics,
            seccomp,
            pv_eoi,
            pv_deadline,
            x2apic,
            disks,
            nets,
            device_timers,
            config,
            api_socket: _,
            huge_text: _,
            verbose: _,
        } = self;
        [
            kernel.is_some(),
            initramfs.is_some(),
            cmdline.is_some(),
            cpus.is_some(),
            memory.is_some(),
            irqchip.is_some(),
            timer_model.is_some(),
            halt_poll.is_some(),
            timer_advance.is_some(),
            wake_placement.is_some(),
            idle_inject.is_some(),
            cpu_quota.is_some(),
            global_timers.is_some(),
            serial.is_some(),
            metrics.is_some(),
            seccomp.is_some(),
            pv_eoi.is_some(),
            pv_deadline.is_some(),
            x2apic.is_some(),
            !disks.is_empty(),
            !nets.is_empty(),
            device_timers.is_some(),
            config.is_some(),
        ]
        .contains(&true)
    }

    /// The configuration these flags describe: defaults, then `--config`, then flags.
    pub fn to_config(&self) -> Result<VmConfig, ConfigError> {
        let mut cfg = match &self.config {
            Some(path) => VmConfig::from_file(path)?,
            None => VmConfig::default(),
        };
        if let Some(v) = &self.kernel {
            cfg.kernel = Some(v.clone());
        }
        if let Some(v) = &self.initramfs {
            cfg.initramfs = Some(v.clone());
        }
        if let Some(v) = &self.cmdline {
            cfg.cmdline = Some(v.clone());
        }
        if let Some(v) = self.cpus {
            cfg.cpus = v;
        }
        if let Some(v) = self.memory {
            cfg.memory = v;
        }
        if let Some(v) = self.irqchip {
            cfg.irqchip = v;
        }
        if let Some(v) = self.timer_model {
            cfg.timer_model = v;
        }
        if let Some(v) = self.halt_poll {
            cfg.halt_poll = Some(v);
        }
        if let Some(v) = self.timer_advance {
            cfg.timer_advance = Some(v);
        }
        if let Some(v) = self.wake_placement {
            cfg.wake_placement = Some(v);
        }
        if let Some(v) = self.idle_inject {
            cfg.idle_inject = Some(v);
        }
        if let Some(v) = self.cpu_quota {
            cfg.cpu_quota = Some(v);
        }
        if let Some(v) = self.global_timers {
            cfg.global_timers = Some(v);
        }
        if let Some(v) = &self.serial {
            cfg.serial = v.clone();
        }
        if let Some(v) = &self.metrics {
            cfg.metrics = Some(v.clone());
        }
        if let Some(v) = self.seccomp {
            cfg.seccomp = v;
        }
        if let Some(v) = self.pv_eoi {
            cfg.pv_eoi = v;
        }
        if let Some(v) = self.pv_deadline {
            cfg.pv_deadline = v;
        }
        if let Some(v) = self.x2apic {
            cfg.x2apic = v;
        }
        if !self.disks.is_empty() {
            cfg.disks = self.disks.clone();
        }
        if !self.nets.is_empty() {
            cfg.nets = self.nets.clone();
        }
        if let Some(v) = self.device_timers {
            cfg.device_timers = Some(v);
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_override_config_file() {
        let dir = std::env::temp_dir().join(format!("lull-cli-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("vm.json");
        std::fs::write(&file, r#"{"cpus": 4, "memory": "512M", "cmdline": "a=b"}"#).unwrap();
        let cli = Cli::try_parse_from([
            "lull",
            "run",
            "--config",
            file.to_str().unwrap(),
            "--cpus",
            "2",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected the run subcommand");
        };
        let cfg = args.to_config().unwrap();
        assert_eq!(cfg.cpus, 2);
        assert_eq!(cfg.memory, ByteSize::mib(512));
        assert_eq!(cfg.cmdline.as_deref(), Some("a=b"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn api_socket_alone_describes_no_vm() {
        let parse = |argv: &[&str]| match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(args) => args,
            Command::Bench(_) => panic!("expected the run subcommand"),
        };
        let bare = parse(&["lull", "run", "--api-socket", "/tmp/s", "-v"]);
        assert_eq!(
            bare.api_socket.as_deref(),
            Some(std::path::Path::new("/tmp/s"))
        );
        assert!(!bare.describes_vm());
        assert!(parse(&["lull", "run", "--api-socket", "/tmp/s", "--cpus", "2"]).describes_vm());
        assert!(parse(&["lull", "run", "--seccomp", "off"]).describes_vm());
    }

    /// The configuration of `lull run --config FILE EXTRA...` where FILE holds `json`.
    fn config_with(name: &str, json: &str, extra: &[&str]) -> VmConfig {
        let dir = std::env::temp_dir().join(format!("lull-cli-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("vm.json");
        std::fs::write(&file, json).unwrap();
        let mut argv = vec!["lull", "run", "--config", file.to_str().unwrap()];
        argv.extend_from_slice(extra);
        let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("expected the run subcommand");
        };
        let cfg = args.to_config().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        cfg
    }

    #[test]
    fn x2apic_switch_comes_from_the_config_file_or_the_flag() {
        let parse = |extra: &[&str]| config_with("x2apic", r#"{"x2apic": "off"}"#, extra).x2apic;
        assert_eq!(parse(&[]), Switch::Off);
        assert_eq!(parse(&["--x2apic", "on"]), Switch::On);
        assert_eq!(VmConfig::default().x2apic, Switch::On);
    }

    #[test]
    fn disks_repeat_and_replace_the_config_files() {
        let json = r#"{"disks": ["path=/from/file"]}"#;
        assert_eq!(config_with("disks", json, &[]).disks.len(), 1);
        let flags = config_with(
            "disks",
            json,
            &["--disk", "path=/a", "--disk", "path=/b,readonly=on"],
        )
        .disks;
        assert_eq!(
            flags.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["path=/a", "path=/b,readonly=on"]
        );
        assert!(Cli::try_parse_from(["lull", "run", "--disk", "/a"]).is_err());
    }

    #[test]
    fn nets_repeat_and_replace_the_config_files() {
        let json = r#"{"nets": ["tap=fromfile"]}"#;
        assert_eq!(config_with("nets", json, &[]).nets[0].tap, "fromfile");
        let flags = config_with(
            "nets",
            json,
            &["--net", "tap=a", "--net", "tap=b,mac=52:54:00:00:00:0b"],
        )
        .nets;
        assert_eq!(
            flags.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["tap=a", "tap=b,mac=52:54:00:00:00:0b"]
        );
        assert!(Cli::try_parse_from(["lull", "run", "--net", "lulltap0"]).is_err());
        let cli = Cli::try_parse_from(["lull", "run", "--net", "tap=a", "--net", "tap=a"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected the run subcommand");
        };
        assert!(args.describes_vm());
        assert!(matches!(
            args.to_config(),
            Err(ConfigError::DuplicateTap(_))
        ));
    }

    #[test]
    fn bad_values_are_usage_errors() {
        assert!(Cli::try_parse_from(["lull", "run", "--memory", "lots"]).is_err());
        assert!(Cli::try_parse_from(["lull", "run", "--serial", "tty"]).is_err());
        let cli = Cli::try_parse_from(["lull", "run", "--cpus", "0"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected the run subcommand");
        };
        assert!(matches!(args.to_config(), Err(ConfigError::Cpus(0))));
    }
}
