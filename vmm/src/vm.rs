//! Building a VM from a [`VmConfig`] and running it: vCPU threads plus the VMM thread's event
//! loop (console input, stop requests, signals).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use devices::cmos::{Cmos, CMOS_PORT, CMOS_PORT_COUNT};
use devices::i8042::{self, I8042};
use devices::pio::{IgnoredPorts, PioBus, PioBusError};
use devices::serial::{SerialPort, Trigger, COM1_IRQ, COM1_PORT, COM_PORT_COUNT};
use devices::test_exit::{
    BootMarker, TestExit, BOOT_MARKER_PORT, TEST_EXIT_PORT, TEST_EXIT_PORT_COUNT,
};
use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use kvm_bindings::{kvm_regs, kvm_sregs, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::VcpuFd;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::boot::{self, BootError, BootSpec};
use crate::config::{IrqchipMode, SerialMode, VmConfig};
use crate::console::{ConsoleSink, EscapeFilter, RawTerminal};
use crate::irqchip::router::IoapicEdgeTrigger;
use crate::irqchip::setup::UserIrqchip;
use crate::kit::{self, KitError};
use crate::kvm_vm::{self, ioctl_err, KvmError};
use crate::metrics::{GuestNoise, LapicNoise, RunReport, VcpuCounters};
use crate::test_devices;
use crate::vcpu::{self, exit::StopReason};
use crate::vmm_loop::{install_signal_handlers, VmmEvents};

/// Why a VM could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The kit is missing.
    #[error(transparent)]
    Kit(#[from] KitError),
    /// KVM refused.
    #[error(transparent)]
    Kvm(#[from] KvmError),
    /// The guest could not be loaded.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// The console file cannot be opened.
    #[error("Cannot open serial output file {path}: {source}")]
    SerialFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A device could not be placed on the port bus (a lull bug).
    #[error("Device layout: {0}")]
    Bus(#[from] PioBusError),
    /// An event-loop or eventfd operation failed.
    #[error("Event loop: {0}")]
    EventLoop(String),
    /// A thread could not be started.
    #[error("Cannot start vCPU thread: {0}")]
    Thread(std::io::Error),
}

/// The first stop request wins; the VMM thread waits on its eventfd.
pub struct StopSignal {
    reason: Mutex<Option<StopReason>>,
    event: EventFd,
}

impl StopSignal {
    fn new() -> Result<Self, VmError> {
        let event = EventFd::new(EFD_NONBLOCK).map_err(|e| VmError::EventLoop(e.to_string()))?;
        Ok(Self {
            reason: Mutex::new(None),
            event,
        })
    }

    /// Asks the VM to stop; later requests are ignored.
    pub fn request(&self, reason: StopReason) {
        let mut guard = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(reason);
            // A failed wake-up write leaves the flag set; the loop also checks it.
            let _ = self.event.write(1);
        }
    }

    /// The eventfd written on the first request.
    pub fn event(&self) -> &EventFd {
        &self.event
    }

    /// True once a stop was requested.
    pub fn is_requested(&self) -> bool {
        self.reason().is_some()
    }

    /// The stop reason, if any.
    pub fn reason(&self) -> Option<StopReason> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// What every vCPU thread and the VMM thread share.
pub struct VmShared {
    /// Port I/O devices.
    pub pio: PioBus,
    /// Ignored guest accesses.
    pub noise: GuestNoise,
    /// One set of exit counters per vCPU.
    pub vcpu_counters: Vec<VcpuCounters>,
    /// Stop requests.
    pub stop: StopSignal,
    /// When lull started.
    pub started: Instant,
    /// When the guest wrote its boot-complete marker (time since `started`).
    pub booted: OnceLock<Duration>,
    /// KVM's binary statistics of each vCPU.
    pub kvm_stats: Vec<std::fs::File>,
    /// Statistics of threads that have ended (recorded by each thread on its way out).
    pub ended_threads: Mutex<Vec<crate::host_stats::ThreadStat>>,
}

impl VmShared {
    /// Records the calling thread's statistics and asks the VM to stop.
    pub fn stop_from_thread(&self, reason: StopReason) {
        lock(&self.ended_threads).push(crate::host_stats::current_thread_stat());
        self.stop.request(reason);
    }

    /// KVM's counters summed over all vCPUs, if KVM offers binary statistics.
    pub fn kvm_counters(&self) -> Option<std::collections::BTreeMap<String, u64>> {
        if self.kvm_stats.is_empty() {
            return None;
        }
        let mut out = std::collections::BTreeMap::new();
        for fd in &self.kvm_stats {
            crate::host_stats::read_kvm_stats(fd, &mut out).ok()?;
        }
        Some(out)
    }

    /// Records the guest's boot-complete marker.
    pub fn mark_booted(&self) {
        let since = self.started.elapsed();
        if self.booted.set(since).is_ok() {
            tracing::info!(
                "guest boot complete {} ms after lull started",
                since.as_millis()
            );
        }
    }
}

/// The serial port's interrupt: an irqfd (kernel irqchip) or an IOAPIC pin (user irqchip).
pub enum ConsoleIrq {
    /// KVM irqfd on the serial GSI.
    Irqfd(EventFd),
    /// An edge on lull's IOAPIC.
    Ioapic(IoapicEdgeTrigger),
}

impl Trigger for ConsoleIrq {
    type E = std::io::Error;
    fn trigger(&self) -> Result<(), Self::E> {
        match self {
            Self::Irqfd(evt) => evt.write(1),
            Self::Ioapic(t) => {
                let Ok(()) = t.trigger();
                Ok(())
            }
        }
    }
}

/// The serial console device.
pub type Console = SerialPort<ConsoleIrq, ConsoleSink>;

/// How a run ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// Why.
    pub reason: StopReason,
    /// The report written to `--metrics`.
    pub report: RunReport,
}

/// The kernel, initramfs and command line to boot.
fn resolve_guest(cfg: &VmConfig) -> Result<(PathBuf, Option<PathBuf>, String), VmError> {
    let pvm = kit::host_is_pvm();
    let (kernel, kit_initramfs, kit_cmdline, kit_pvm) = match &cfg.kernel {
        Some(k) => (k.clone(), None, None, None),
        None => {
            let g = kit::default_guest()?;
            (g.kernel, g.initramfs, g.cmdline, g.cmdline_pvm)
        }
    };
    let initramfs = cfg.initramfs.clone().or(kit_initramfs);
    let format = boot::probe(&kernel, initramfs.as_deref())?;
    let cmdline = match &cfg.cmdline {
        Some(c) => {
            if pvm && c.contains("console=") && !c.contains("clearcpuid") {
                tracing::warn!(
                    "this host's KVM is PVM-based; a Linux guest needs `{}` on its command line",
                    kit::PVM_CMDLINE
                );
            }
            c.clone()
        }
        // A multiboot test image gets what QEMU's -kernel gives it without -append: no
        // arguments (kvm-unit-tests take their argv as test names).
        None if format == boot::KernelFormat::Multiboot => String::new(),
        None => kit::default_cmdline(kit_cmdline.as_deref(), kit_pvm.as_deref(), pvm),
    };
    Ok((kernel, initramfs, cmdline))
}

fn build_pio_bus(console: Arc<Mutex<Console>>) -> Result<PioBus, VmError> {
    let mut bus = PioBus::new();
    bus.insert(COM1_PORT, COM_PORT_COUNT, console)?;
    bus.insert(0x60, i8042::PORT_COUNT, Arc::new(Mutex::new(I8042)))?;
    bus.insert(
        TEST_EXIT_PORT,
        TEST_EXIT_PORT_COUNT,
        Arc::new(Mutex::new(TestExit)),
    )?;
    bus.insert(BOOT_MARKER_PORT, 1, Arc::new(Mutex::new(BootMarker)))?;
    bus.insert(
        CMOS_PORT,
        CMOS_PORT_COUNT,
        Arc::new(Mutex::new(Cmos::with_host_clock())),
    )?;
    let ignored = Arc::new(Mutex::new(IgnoredPorts));
    bus.insert(0x40, 4, ignored.clone())?; // PIT: Linux stops it; lull has none
    bus.insert(0x80, 1, ignored.clone())?; // POST code / I/O delay
                                           // No 8259 PIC: its mask registers read 0, so Linux's probe finds no PIC and uses the
                                           // IOAPIC alone (with --irqchip kernel, KVM's PIC answers these ports before lull).
    bus.insert(0x20, 2, ignored.clone())?;
    bus.insert(0xa0, 2, ignored.clone())?;
    bus.insert(0x4d0, 2, ignored)?; // ELCR
    Ok(bus)
}

/// A created vCPU with its architectural reset state (for INIT in user mode).
pub struct CreatedVcpu {
    /// The fd.
    pub fd: VcpuFd,
    /// Registers at reset.
    pub reset_regs: kvm_regs,
    /// Special registers at reset.
    pub reset_sregs: kvm_sregs,
}

fn evt() -> Result<EventFd, VmError> {
    EventFd::new(EFD_NONBLOCK).map_err(|e| VmError::EventLoop(e.to_string()))
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Builds the VM described by `cfg` and runs it to the end.
pub fn run(cfg: &VmConfig, started: Instant) -> Result<RunOutcome, VmError> {
    let (kernel, initramfs, cmdline) = resolve_guest(cfg)?;
    let user = cfg.irqchip == IrqchipMode::User;
    let kvm = kvm_vm::open_kvm(cfg.cpus)?;
    let mem = kvm_vm::create_guest_memory(cfg.memory.0)?;
    let vm = Arc::new(kvm_vm::create_vm(&kvm, &mem, !user)?);
    if user {
        kvm_vm::enable_user_msr_exits(&kvm, &vm)?;
    }
    let entry = boot::load(
        &mem,
        &BootSpec {
            kernel: &kernel,
            initramfs: initramfs.as_deref(),
            cmdline: &cmdline,
            cpus: cfg.cpus,
            memory: cfg.memory.0,
        },
    )?;
    tracing::debug!(?kernel, ?initramfs, cmdline, ?entry, "guest loaded");

    // vCPUs: create all, read the TSC frequency, then configure.
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(ioctl_err("KVM_GET_SUPPORTED_CPUID"))?;
    let mut vcpus = Vec::new();
    for id in 0..cfg.cpus {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(ioctl_err("KVM_CREATE_VCPU"))?;
        let reset_regs = fd.get_regs().map_err(ioctl_err("KVM_GET_REGS"))?;
        let reset_sregs = fd.get_sregs().map_err(ioctl_err("KVM_GET_SREGS"))?;
        vcpus.push(CreatedVcpu {
            fd,
            reset_regs,
            reset_sregs,
        });
    }
    let bsp = vcpus
        .first()
        .ok_or(KvmError::TooManyCpus { asked: 0, max: 0 })?;
    let tsc_khz = bsp.fd.get_tsc_khz().map_err(ioctl_err("KVM_GET_TSC_KHZ"))?;
    for (id, v) in (0u32..).zip(&vcpus) {
        let boot_entry = (id == 0).then_some(entry);
        vcpu::configure(
            &v.fd,
            id,
            supported.as_slice(),
            cfg.cpus,
            tsc_khz,
            user,
            boot_entry,
        )?;
    }

    // Interrupt plumbing and the console.
    let lapic_noise = Arc::new(LapicNoise::default());
    let irqchip = if user {
        Some(UserIrqchip::new(cfg, &vcpus, tsc_khz, lapic_noise.clone())?)
    } else {
        None
    };
    let irq = match &irqchip {
        Some(chip) => ConsoleIrq::Ioapic(chip.serial_trigger()),
        None => {
            let irq = evt()?;
            vm.register_irqfd(&irq, COM1_IRQ)
                .map_err(ioctl_err("KVM_IRQFD"))?;
            ConsoleIrq::Irqfd(irq)
        }
    };
    let sink = match &cfg.serial {
        SerialMode::Stdio => ConsoleSink::Stdout(std::io::stdout()),
        SerialMode::Off => ConsoleSink::Null,
        SerialMode::File(path) => {
            ConsoleSink::file(path).map_err(|source| VmError::SerialFile {
                path: path.clone(),
                source,
            })?
        }
    };
    let console = Arc::new(Mutex::new(SerialPort::new(irq, sink)));
    let drained = Arc::new(evt()?);
    {
        let drained = drained.clone();
        lock(&console).set_input_drained_hook(Box::new(move || {
            let _ = drained.write(1);
        }));
    }
    let serial_counters = lock(&console).counters();

    let shared = Arc::new(VmShared {
        pio: {
            let mut bus = build_pio_bus(console.clone())?;
            let lines: Arc<dyn devices::testdev::IrqLines> = match &irqchip {
                Some(chip) => Arc::new(test_devices::UserIrqLines(chip.router.clone())),
                None => Arc::new(test_devices::KvmIrqLines::new(vm.clone())),
            };
            test_devices::add_to_bus(&mut bus, cfg.cpus, cfg.memory.0, lines)?;
            bus
        },
        noise: GuestNoise::default(),
        vcpu_counters: (0..cfg.cpus).map(|_| VcpuCounters::default()).collect(),
        stop: StopSignal::new()?,
        started,
        booted: OnceLock::new(),
        kvm_stats: vcpus
            .iter()
            .filter_map(|v| kvm_vm::stats_fd(&v.fd))
            .collect(),
        ended_threads: Mutex::new(Vec::new()),
    });

    let signal = install_signal_handlers()?;
    crate::seccomp::prepare(cfg.seccomp).map_err(|e| VmError::EventLoop(e.to_string()))?;
    let stdin_is_console = cfg.serial == SerialMode::Stdio;
    let raw_terminal = if stdin_is_console {
        RawTerminal::enable()
    } else {
        None
    };

    match &irqchip {
        Some(chip) => chip.start(vcpus, shared.clone())?,
        None => {
            for (id, v) in (0u32..).zip(vcpus) {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("vcpu{id}"))
                    .spawn(move || vcpu::run_loop(v.fd, id, shared))
                    .map_err(VmError::Thread)?;
            }
        }
    }

    let mut manager: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>> =
        EventManager::new().map_err(|e| VmError::EventLoop(format!("{e:?}")))?;
    manager.add_subscriber(Arc::new(Mutex::new(VmmEvents {
        shared: shared.clone(),
        console: console.clone(),
        signal,
        drained,
        stdin_open: stdin_is_console,
        filter: EscapeFilter::default(),
        pending: Vec::new(),
    })));
    crate::seccomp::apply(crate::seccomp::ThreadKind::Vmm)
        .map_err(|e| VmError::EventLoop(e.to_string()))?;
    let reason = loop {
        if let Some(reason) = shared.stop.reason() {
            break reason;
        }
        if let Err(e) = manager.run() {
            break StopReason::VmmError(format!("event loop: {e:?}"));
        }
    };
    // Read the host's view while every thread is still there.
    let threads = crate::host_stats::thread_stats(&lock(&shared.ended_threads));
    let kvm_counters = shared.kvm_counters();
    let stopped_at = irqchip.as_ref().map_or(0, |c| c.now());
    if let Some(chip) = &irqchip {
        chip.stop_all();
    }
    drop(raw_terminal);
    let _ = lock(&console).flush();

    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let router = irqchip.as_ref().map(|c| &c.router.counters);
    let rc = |f: fn(&crate::irqchip::router::RouterCounters) -> &std::sync::atomic::AtomicU64| {
        router.map_or(0, |r| f(r).load(Ordering::Relaxed))
    };
    let report = RunReport {
        exit_status: 0,
        stop_reason: reason.to_string(),
        run_time_ms: ms(started.elapsed()),
        boot_time_ms: shared.booted.get().map(|d| ms(*d)),
        serial_bytes_out: serial_counters.bytes_out.load(Ordering::Relaxed),
        unknown_port_accesses: shared.noise.unknown_port.count(),
        unknown_mmio_accesses: shared.noise.unknown_mmio.count(),
        unknown_msr_accesses: irqchip.as_ref().map_or(0, |c| c.unknown_msr.count()),
        lapic_invalid_accesses: lapic_noise.invalid_access.count(),
        lapic_timer_clamps: lapic_noise.timer_clamped.count(),
        ipis: rc(|r| &r.ipis),
        device_interrupts: rc(|r| &r.device_interrupts),
        irqchip: cfg.irqchip.name().to_string(),
        timer_model: user.then(|| cfg.timer_model.name().to_string()),
        timers: irqchip.as_ref().map(|c| c.model.metrics()),
        halt_poll: irqchip.as_ref().map(|c| c.idle.halt_poll.to_string()),
        idle_inject: irqchip
            .as_ref()
            .and_then(|c| c.idle.inject.as_ref())
            .map(|inj| crate::metrics::IdleInjectReport {
                config: inj.config().to_string(),
                all_idle_together_ns: inj.all_idle_together_ns(stopped_at),
            }),
        cpu_quota: irqchip
            .as_ref()
            .and_then(|c| c.idle.quota.as_ref())
            .map(|q| q.report()),
        global_timers: irqchip
            .as_ref()
            .and_then(|c| c.idle.global.as_ref())
            .map(|g| crate::metrics::GlobalTimersReport {
                config: g.config().to_string(),
                timer_thread_fires: g.timer_thread_fires.load(Ordering::Relaxed),
            }),
        vcpus: (0u32..)
            .zip(&shared.vcpu_counters)
            .map(|(i, c)| c.snapshot(i))
            .collect(),
        threads,
        kvm: kvm_counters,
    };
    Ok(RunOutcome { reason, report })
}
