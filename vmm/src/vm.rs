//! Building a VM from a [`VmConfig`] and running it: vCPU threads plus the VMM thread's event
//! loop (console input, stop requests, signals).

use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use devices::i8042::{self, I8042};
use devices::pio::{IgnoredPorts, PioBus, PioBusError};
use devices::serial::{SerialPort, Trigger, COM1_IRQ, COM1_PORT, COM_PORT_COUNT};
use devices::test_exit::{
    BootMarker, TestExit, BOOT_MARKER_PORT, TEST_EXIT_PORT, TEST_EXIT_PORT_COUNT,
};
use event_manager::{EventManager, EventOps, Events, MutEventSubscriber, SubscriberOps};
use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::boot::{self, BootError, BootSpec};
use crate::config::{IrqchipMode, SerialMode, VmConfig};
use crate::console::{self, ConsoleSink, EscapeFilter, RawTerminal};
use crate::kit::{self, KitError};
use crate::kvm_vm::{self, ioctl_err, KvmError};
use crate::metrics::{GuestNoise, RunReport, VcpuCounters};
use crate::vcpu::{self, exit::StopReason};

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
}

impl VmShared {
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

/// Serial interrupts through a KVM irqfd.
struct IrqfdTrigger(EventFd);

impl Trigger for IrqfdTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> Result<(), Self::E> {
        self.0.write(1)
    }
}

type Console = SerialPort<IrqfdTrigger, ConsoleSink>;

/// How a run ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// Why.
    pub reason: StopReason,
    /// The report written to `--metrics`.
    pub report: RunReport,
}

/// Eventfd the SIGINT/SIGTERM handler writes to (-1 until set).
static SIGNAL_EVENT_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_stop_signal(
    _num: libc::c_int,
    _info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    let fd = SIGNAL_EVENT_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; `fd` is an eventfd that lives for the whole
        // process (leaked on purpose), and `one` is 8 readable bytes.
        unsafe { libc::write(fd, std::ptr::addr_of!(one).cast(), 8) };
    }
}

fn install_signal_handlers() -> Result<EventFd, VmError> {
    let evt = EventFd::new(EFD_NONBLOCK).map_err(|e| VmError::EventLoop(e.to_string()))?;
    let raw = evt
        .try_clone()
        .map_err(|e| VmError::EventLoop(e.to_string()))?;
    SIGNAL_EVENT_FD.store(raw.as_raw_fd(), Ordering::Relaxed);
    std::mem::forget(raw); // the handler may run until the process exits
    for sig in [libc::SIGINT, libc::SIGTERM] {
        vmm_sys_util::signal::register_signal_handler(sig, on_stop_signal)
            .map_err(|e| VmError::EventLoop(format!("signal handler: {e}")))?;
    }
    Ok(evt)
}

/// The VMM thread's subscriber: console input, stop requests and signals.
struct VmmEvents {
    shared: Arc<VmShared>,
    console: Arc<Mutex<Console>>,
    signal: EventFd,
    drained: Arc<EventFd>,
    stdin_open: bool,
    filter: EscapeFilter,
    pending: Vec<u8>,
}

impl VmmEvents {
    fn stdin_fd() -> RawFd {
        std::io::stdin().as_raw_fd()
    }

    fn feed_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let taken = self
            .console
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .enqueue_input(&self.pending);
        self.pending.drain(..taken);
    }

    fn on_stdin(&mut self, ops: &mut EventOps) {
        let mut buf = [0u8; 64];
        match console::read_stdin(&mut buf) {
            Ok(0) | Err(_) => {
                // End of input: the guest keeps running with no more console input.
                let _ = ops.remove(Events::empty_raw(Self::stdin_fd()));
                self.stdin_open = false;
            }
            Ok(n) => {
                let out = self.filter.feed(&buf[..n]);
                self.pending.extend_from_slice(&out.to_guest);
                self.feed_pending();
                if out.quit {
                    self.shared.stop.request(StopReason::User);
                }
                if !self.pending.is_empty() {
                    // Wait for the guest to drain its FIFO before reading more.
                    let _ = ops.remove(Events::empty_raw(Self::stdin_fd()));
                }
            }
        }
    }
}

impl MutEventSubscriber for VmmEvents {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.signal.as_raw_fd() {
            let _ = self.signal.read();
            self.shared.stop.request(StopReason::User);
        } else if fd == self.shared.stop.event.as_raw_fd() {
            let _ = self.shared.stop.event.read();
        } else if fd == self.drained.as_raw_fd() {
            let _ = self.drained.read();
            let was_blocked = !self.pending.is_empty();
            self.feed_pending();
            if was_blocked && self.pending.is_empty() && self.stdin_open {
                let _ = ops.add(Events::new_raw(Self::stdin_fd(), EventSet::IN));
            }
        } else if fd == Self::stdin_fd() {
            self.on_stdin(ops);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::new(&self.signal, EventSet::IN));
        let _ = ops.add(Events::new(&self.shared.stop.event, EventSet::IN));
        let _ = ops.add(Events::new(self.drained.as_ref(), EventSet::IN));
        if self.stdin_open
            && ops
                .add(Events::new_raw(Self::stdin_fd(), EventSet::IN))
                .is_err()
        {
            // stdin is a regular file or /dev/null: epoll cannot watch it; no console input.
            self.stdin_open = false;
        }
    }
}

/// The kernel, initramfs and command line to boot.
fn resolve_guest(cfg: &VmConfig) -> Result<(PathBuf, Option<PathBuf>, String), VmError> {
    let pvm = kit::host_is_pvm();
    let (kernel, kit_initramfs, kit_cmdline) = match &cfg.kernel {
        Some(k) => (k.clone(), None, None),
        None => {
            let g = kit::default_guest()?;
            (g.kernel, g.initramfs, g.cmdline)
        }
    };
    let initramfs = cfg.initramfs.clone().or(kit_initramfs);
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
        None => kit::default_cmdline(kit_cmdline.as_deref(), pvm),
    };
    boot::probe(&kernel, initramfs.as_deref())?;
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
    let ignored = Arc::new(Mutex::new(IgnoredPorts));
    bus.insert(0x40, 4, ignored.clone())?; // PIT: Linux stops it; lull has none
    bus.insert(0x80, 1, ignored)?; // POST code / I/O delay
    Ok(bus)
}

/// Builds the VM described by `cfg` and runs it to the end.
pub fn run(cfg: &VmConfig, started: Instant) -> Result<RunOutcome, VmError> {
    let (kernel, initramfs, cmdline) = resolve_guest(cfg)?;
    let IrqchipMode::Kernel = cfg.irqchip;
    let kvm = kvm_vm::open_kvm(cfg.cpus)?;
    let mem = kvm_vm::create_guest_memory(cfg.memory.0)?;
    let vm = kvm_vm::create_vm(&kvm, &mem, true)?;
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

    // Console.
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
    let irq = EventFd::new(EFD_NONBLOCK).map_err(|e| VmError::EventLoop(e.to_string()))?;
    vm.register_irqfd(&irq, COM1_IRQ)
        .map_err(ioctl_err("KVM_IRQFD"))?;
    let console = Arc::new(Mutex::new(SerialPort::new(IrqfdTrigger(irq), sink)));
    let drained =
        Arc::new(EventFd::new(EFD_NONBLOCK).map_err(|e| VmError::EventLoop(e.to_string()))?);
    {
        let drained = drained.clone();
        console
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set_input_drained_hook(Box::new(move || {
                let _ = drained.write(1);
            }));
    }
    let serial_counters = console.lock().unwrap_or_else(|p| p.into_inner()).counters();

    let shared = Arc::new(VmShared {
        pio: build_pio_bus(console.clone())?,
        noise: GuestNoise::default(),
        vcpu_counters: (0..cfg.cpus).map(|_| VcpuCounters::default()).collect(),
        stop: StopSignal::new()?,
        started,
        booted: OnceLock::new(),
    });

    // vCPUs.
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(ioctl_err("KVM_GET_SUPPORTED_CPUID"))?;
    let mut vcpus = Vec::new();
    for id in 0..cfg.cpus {
        vcpus.push(
            vm.create_vcpu(u64::from(id))
                .map_err(ioctl_err("KVM_CREATE_VCPU"))?,
        );
    }
    let bsp = vcpus
        .first()
        .ok_or(KvmError::TooManyCpus { asked: 0, max: 0 })?;
    let tsc_khz = bsp.get_tsc_khz().map_err(ioctl_err("KVM_GET_TSC_KHZ"))?;
    for (id, vcpu_fd) in (0u32..).zip(&vcpus) {
        let boot_entry = (id == 0).then_some(entry);
        vcpu::configure(
            vcpu_fd,
            id,
            supported.as_slice(),
            cfg.cpus,
            tsc_khz,
            boot_entry,
        )?;
    }

    let signal = install_signal_handlers()?;
    let stdin_is_console = cfg.serial == SerialMode::Stdio;
    let raw_terminal = if stdin_is_console {
        RawTerminal::enable()
    } else {
        None
    };

    for (id, vcpu_fd) in (0u32..).zip(vcpus) {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("vcpu{id}"))
            .spawn(move || vcpu::run_loop(vcpu_fd, id, shared))
            .map_err(VmError::Thread)?;
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
    let reason = loop {
        if let Some(reason) = shared.stop.reason() {
            break reason;
        }
        if let Err(e) = manager.run() {
            break StopReason::VmmError(format!("event loop: {e:?}"));
        }
    };
    drop(raw_terminal);
    let _ = console.lock().unwrap_or_else(|p| p.into_inner()).flush();

    let report = RunReport {
        exit_status: 0,
        stop_reason: reason.to_string(),
        run_time_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        boot_time_ms: shared
            .booted
            .get()
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        serial_bytes_out: serial_counters.bytes_out.load(Ordering::Relaxed),
        unknown_port_accesses: shared.noise.unknown_port.count(),
        unknown_mmio_accesses: shared.noise.unknown_mmio.count(),
        vcpus: (0u32..)
            .zip(&shared.vcpu_counters)
            .map(|(i, c)| c.snapshot(i))
            .collect(),
    };
    Ok(RunOutcome { reason, report })
}
