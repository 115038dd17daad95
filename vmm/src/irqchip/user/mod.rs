//! `--irqchip user`: lull's own LAPICs, IOAPIC and HLT, with the timer model and the idle
//! manager; how vCPU threads, devices and timers hand each other interrupts without KVM's
//! in-kernel LAPIC.
//!
//! ```text
//!  vCPU thread i (UserVcpuIrq i)          other threads (vCPU j, VMM, timer thread)
//!  ─────────────────────────────          ─────────────────────────────────────────
//!  owns Lapic i + CpuTimers i             route(ipi) ─> Mailbox i ─> kick i
//!  before KVM_RUN: drain Mailbox i,         kick = tgkill(SIGRTMIN+1) if i may be in KVM_RUN
//!    run timers, idle hold, inject                 (handler sets kvm_run.immediate_exit)
//!  HLT: poll, then CpuTimers::idle ->            + unpark if i may be blocked in HLT
//!    park until timeout or kick; wake
//!  host tick: POSIX timer -> SIGRTMIN+1 to its own thread
//! ```
//!
//! - [`router`]: the routing table and the IOAPIC; delivers messages to mailboxes.
//! - [`saved`]: a vCPU's LAPIC and PV registrations as a snapshot holds them.
//! - [`mailbox`]: one per vCPU; posts and kicks without touching the target's LAPIC.
//! - [`vcpu`]: the per-vCPU half ([`UserVcpuIrq`]), generic over the clock.
//! - [`exit`]: the LAPIC/IOAPIC/MSR exits, a free function.
//! - [`cr8`]: CR8 and TPR as one register, and the poll for CR8 writes KVM does not report.
//! - [`guest_tsc`]: the map from the guest TSC to the VM clock.
//! - [`timers`]: what a fired timer does; [`host_timer`]: the host ticks; [`wait`]: how a
//!   blocked vCPU waits (when and for how long is the idle manager's: `idle::halt`);
//!   [`ranged_wake`]: its wake-up with `--timer-slack`.

pub mod cr8;
pub mod exit;
pub mod guest_tsc;
pub mod host_timer;
pub mod lapic_timer_host;
pub mod mailbox;
pub mod pv_deadline;
pub mod pv_eoi;
pub mod pv_msr;
pub mod ranged_wake;
pub mod router;
pub mod saved;
pub mod timers;
pub mod vcpu;
pub mod wait;

#[cfg(test)]
mod central_resume_tests;
#[cfg(test)]
mod ranged_wait_tests;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use devices::ioapic::IoApic;
use devices::lapic::{Lapic, LapicConfig, TimerLimits};
use devices::testdev::IrqLines;
use timer::{lock, CpuTimers, HostTimer, ModelKind, Nanos, TimerModel, VmTime, Waker};
use vm_memory::GuestMemoryMmap;

use super::clock::VmClock;
use super::{EdgeIrq, IrqChip, IrqChipError, VcpuIrq};
use crate::idle::quota::CpuQuota;
use crate::idle::shared::IdleKnobs;
use crate::idle::vcpu_timer::{FiredSummary, VcpuTimer};
use crate::idle::IdleShared;
use crate::metrics::{GlobalTimersReport, IdleInjectReport, LapicNoise, RunReport};
use crate::ratelimit::LogLimiter;
use crate::setup::cpuid::APIC_BUS_KHZ;
use crate::state::device_timers::DeviceTimers;
use crate::state::{StopReason, VcpuShared};
use guest_tsc::{sample_guest_tsc, tsc_map, GuestTscRead, TscAnchor};
use host_timer::{SharedHostTimer, SharedTimerFd, ThreadTickTimer};
use mailbox::Mailbox;
use router::{InterruptRouter, IoapicEdgeTrigger};
use timers::on_timer_fired;
use vcpu::{UserVcpuIrq, UserVcpuParts};

/// What the user-space irqchip is built from.
#[derive(Debug, Clone)]
pub struct UserChipConfig {
    /// vCPUs.
    pub cpus: u32,
    /// Timer model.
    pub model: ModelKind,
    /// The guest's TSC frequency.
    pub tsc_khz: u32,
    /// The idle knobs, which the idle manager's VM-wide state is built from.
    pub idle: IdleKnobs,
    /// Offer KVM's PV EOI to the guest.
    pub pv_eoi: bool,
    /// Offer lull's PV TSC deadline to the guest.
    pub pv_deadline: bool,
    /// Whether the guest may switch its LAPIC to x2APIC mode (advertised in CPUID).
    pub x2apic: bool,
    /// The guest's MAXPHYADDR (CPUID 0x80000008 EAX[7:0]): IA32_APIC_BASE bits at or above it
    /// are reserved.
    pub max_phys_addr_bits: u8,
}

/// The per-vCPU parts handed out by [`IrqChip::vcpu`]: LAPIC, timers, and the wake-up
/// timerfd the timer model arms while the vCPU is blocked (none on a fake clock).
type VcpuParts = (
    Lapic<Arc<LapicNoise>>,
    Box<dyn CpuTimers<VcpuTimer>>,
    Option<Arc<SharedTimerFd>>,
);

/// Makes the chip's host timers: `Some(cpu)` for vCPU `cpu`'s tick, `None` for the `central`
/// model's thread (as `timer::build` asks for them).
pub type HostTimers<'a> = &'a mut dyn FnMut(Option<usize>) -> Box<dyn HostTimer>;

/// The user-space irqchip of one VM, on clock `C` (the VM's CLOCK_MONOTONIC-based
/// [`VmClock`]; a fake one in tests and fuzzing, see [`UserIrqChip::with_clock`]).
pub struct UserIrqChip<C: VmTime = VmClock> {
    router: Arc<InterruptRouter>,
    model: Arc<dyn TimerModel<VcpuTimer>>,
    idle: Arc<IdleShared>,
    unknown_msr: Arc<LogLimiter>,
    noise: Arc<LapicNoise>,
    clock: C,
    parts: Mutex<Vec<Option<VcpuParts>>>,
    central: Option<Arc<SharedTimerFd>>,
    mem: Arc<GuestMemoryMmap>,
    pv_eoi: bool,
    pv_deadline: bool,
    /// The TSC map's rate and the VM-clock time it was made at, and the cheap guest-TSC read
    /// each vCPU re-anchors it with (see [`guest_tsc`]); `None`: no re-anchoring.
    tsc_khz: u64,
    tsc_anchored_at: Nanos,
    tsc_read: Option<GuestTscRead>,
}

impl UserIrqChip<VmClock> {
    /// Builds the chip; `read_guest_tsc` reads the boot CPU's TSC (IA32_TSC), a few times
    /// (see [`guest_tsc`]).
    pub fn new(
        cfg: &UserChipConfig,
        mem: Arc<GuestMemoryMmap>,
        read_guest_tsc: impl FnMut() -> Result<u64, IrqChipError>,
    ) -> Result<Self, IrqChipError> {
        crate::host::sys::kick::install_handler().map_err(|e| IrqChipError::Host {
            what: "the kick signal handler",
            source: std::io::Error::from_raw_os_error(e.errno()),
        })?;
        let clock = VmClock::new();
        let sample = sample_guest_tsc(&clock, read_guest_tsc)?;
        tracing::debug!("guest TSC map: TSC read within {} ns", sample.window());
        let tsc = (sample.tsc, sample.after);
        let central = match cfg.model {
            ModelKind::Central => {
                Some(
                    SharedTimerFd::new(clock.clone()).map_err(|source| IrqChipError::Host {
                        what: "the central timer thread's timerfd",
                        source,
                    })?,
                )
            }
            _ => None,
        };
        let mut host = |cpu: Option<usize>| -> Box<dyn HostTimer> {
            match (cpu, &central) {
                (None, Some(fd)) => Box::new(SharedHostTimer(fd.clone())),
                _ => Box::new(ThreadTickTimer::new(clock.clone())),
            }
        };
        let mut chip = Self::with_clock(cfg, mem, clock.clone(), tsc, &mut host)?;
        chip.central = central;
        chip.attach_wake_timers()?;
        Ok(chip)
    }

    /// Gives every vCPU's timers a wake-up timerfd on the VM clock, which its blocked thread
    /// waits on and other threads may re-arm (see `UserVcpuIrq::block_until`).
    fn attach_wake_timers(&mut self) -> Result<(), IrqChipError> {
        let clock = self.clock.clone();
        let ranged = !lapic_timer_host::slack::hard_wait(self.idle.timer_slack);
        for part in lock(&self.parts).iter_mut().flatten() {
            let fd = if ranged {
                SharedTimerFd::ranged_for_poll(clock.clone())
            } else {
                SharedTimerFd::for_poll(clock.clone())
            };
            let wake = fd.map_err(|source| IrqChipError::Host {
                what: "a vCPU's wake-up timerfd",
                source,
            })?;
            part.1
                .set_wake_timer(Box::new(SharedHostTimer(wake.clone())));
            part.2 = Some(wake);
        }
        Ok(())
    }
}

impl<C: VmTime + Send + Sync> UserIrqChip<C> {
    /// Builds the chip on `clock` with the host timers `host` makes and the guest TSC
    /// `guest_tsc.0`, read just before `clock` said `guest_tsc.1`, without touching the host:
    /// no helper thread, so with the `central` model nobody expires timers but
    /// [`Self::service_timers`], and no kick signal handler, so every vCPU half must run on one
    /// thread (a kick of another thread would find no handler). [`UserIrqChip::new`] is this
    /// on the VM clock with real host timers; tests and the fuzz targets pass a fake clock and
    /// fake host timers.
    pub fn with_clock(
        cfg: &UserChipConfig,
        mem: Arc<GuestMemoryMmap>,
        clock: C,
        guest_tsc: (u64, Nanos),
        host: HostTimers<'_>,
    ) -> Result<Self, IrqChipError> {
        // The map's bias (the time between the TSC read and `guest_tsc.1`) delays every
        // converted deadline: `guest_tsc.1` is read right after the TSC, not here.
        let tsc = tsc_map(guest_tsc.0, guest_tsc.1, u64::from(cfg.tsc_khz));
        let noise = Arc::new(LapicNoise::default());
        let lapics = (0..cfg.cpus)
            .map(|id| {
                let config = LapicConfig {
                    apic_id: id,
                    bsp: id == 0,
                    bus_hz: u64::from(APIC_BUS_KHZ) * 1000,
                    tsc,
                    limits: TimerLimits::default(),
                    x2apic_supported: cfg.x2apic,
                    max_phys_addr_bits: cfg.max_phys_addr_bits,
                };
                Lapic::with_events(config, noise.clone())
                    .map_err(|source| IrqChipError::Lapic { id, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mailboxes = lapics
            .iter()
            .map(|_| Mailbox::new().map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| IrqChipError::Host {
                what: "a vCPU's kick eventfd",
                source,
            })?;
        let router = Arc::new(InterruptRouter::new(
            lapics.iter().map(|l| l.destination_info()).collect(),
            mailboxes.clone(),
            IoApic::new(u8::try_from(cfg.cpus).unwrap_or(u8::MAX)),
        ));
        let waker: Arc<dyn Waker> = Arc::new(move |cpu: usize| {
            if let Some(m) = mailboxes.get(cpu) {
                m.kick();
            }
        });
        let nodes = vec![0; lapics.len()];
        let model = timer::build::<VcpuTimer>(cfg.model, &nodes, host, waker)?;
        // `pull`: a running vCPU's host tick for global timers at the end of their range.
        model.shared.set_global_slack(cfg.idle.timer_slack.ns());
        let idle = Arc::new(IdleShared::new(
            cfg.idle,
            lapics.len(),
            clock.to_monotonic(0),
        ));
        let parts = lapics
            .into_iter()
            .zip(model.cpus)
            .map(|(lapic, timers)| Some((lapic, timers, None)))
            .collect();
        Ok(Self {
            router,
            model: model.shared,
            idle,
            unknown_msr: Arc::new(LogLimiter::new()),
            noise,
            clock,
            parts: Mutex::new(parts),
            central: None,
            mem,
            pv_eoi: cfg.pv_eoi,
            pv_deadline: cfg.pv_deadline,
            tsc_khz: u64::from(cfg.tsc_khz),
            tsc_anchored_at: guest_tsc.1,
            tsc_read: None,
        })
    }

    /// Lets every vCPU taken from now on re-anchor its TSC map with `read`, a cheap read of
    /// the guest TSC from any thread (RDTSC plus KVM's offset), so that the map does not
    /// drift with the VM's age (see [`guest_tsc`]).
    pub fn reanchor_tsc_with(&mut self, read: GuestTscRead) {
        self.tsc_read = Some(read);
    }

    /// The per-vCPU half of vCPU `id` (taken once), as its concrete type: what
    /// [`IrqChip::vcpu`] boxes. Tests and fuzz targets use it to look at the vCPU's LAPIC.
    pub fn user_vcpu(
        &self,
        id: u32,
        shared: &Arc<VcpuShared>,
    ) -> Result<UserVcpuIrq<Arc<LapicNoise>, C>, IrqChipError> {
        let taken = usize::try_from(id)
            .ok()
            .and_then(|i| lock(&self.parts).get_mut(i).and_then(Option::take));
        let (lapic, timers, wake_timer) = taken.ok_or(IrqChipError::NoVcpuPart(id))?;
        UserVcpuIrq::new(UserVcpuParts {
            id,
            lapic,
            timers,
            router: self.router.clone(),
            clock: self.clock.clone(),
            idle: self.idle.clone(),
            shared: shared.clone(),
            unknown_msr: self.unknown_msr.clone(),
            mem: self.mem.clone(),
            pv_eoi: self.pv_eoi,
            pv_deadline: self.pv_deadline,
            wake_timer,
            tsc_anchor: self
                .tsc_read
                .clone()
                .map(|read| TscAnchor::new(read, self.tsc_khz, self.tsc_anchored_at)),
        })
        .ok_or(IrqChipError::NoVcpuPart(id))
    }

    /// One pass of the `central` model's timer thread at the clock's now: expires every due
    /// timer and notifies the owners. The thread does this at each timerfd expiry; a chip
    /// built by [`Self::with_clock`] has no thread, and its owner calls this instead.
    pub fn service_timers(&self) {
        service_central(&self.model, &self.router, &self.idle, None, &self.clock);
    }

    /// The central model's timer thread: expires every timer at the timerfd's deadline.
    fn central_thread(&self, fd: Arc<SharedTimerFd>, shared: Arc<VcpuShared>) -> impl FnOnce() {
        let model = self.model.clone();
        let router = self.router.clone();
        let clock = self.clock.clone();
        let idle = self.idle.clone();
        move || {
            if let Err(e) = crate::host::seccomp::apply(crate::host::seccomp::ThreadKind::Timers) {
                shared.stop.request(StopReason::VmmError(e.to_string()));
                return;
            }
            loop {
                // One wake-up per expiry: a timerfd re-armed while the thread blocks in
                // read() fires at the new deadline.
                if let Err(e) = fd.wait() {
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        let why = format!("timer thread: {e}");
                        shared.stop.request(StopReason::VmmError(why));
                        return;
                    }
                }
                if shared.stop.is_requested() {
                    return;
                }
                service_central(&model, &router, &idle, Some(&shared.device_timers), &clock);
            }
        }
    }
}

/// What the `central` model's timer thread does at each wake-up: expires every due timer
/// (notifying owners, running device callbacks), counts the global ones and arms what the
/// devices asked for meanwhile.
fn service_central<C: VmTime>(
    model: &Arc<dyn TimerModel<VcpuTimer>>,
    router: &InterruptRouter,
    idle: &IdleShared,
    devices: Option<&Arc<DeviceTimers>>,
    clock: &C,
) {
    let now = clock.now();
    let mut summary = FiredSummary::default();
    let mut devices_due = Vec::new();
    model.service(now, &mut |fired| {
        on_timer_fired(
            router,
            idle.global.as_ref(),
            &mut devices_due,
            &mut summary,
            fired,
        )
    });
    if let Some(d) = devices {
        // After the model's expiry, outside its locks (see `timers`).
        for id in devices_due {
            d.fire(id);
        }
        let epoch = clock.to_monotonic(0);
        for (id, at) in d.take_pending() {
            model.arm_global(0, at.saturating_sub(epoch), VcpuTimer::Device(id));
        }
    }
    if let Some(g) = &idle.global {
        for _ in 0..summary.global() {
            g.timer_thread_fired();
        }
        // Re-arm what fired at once, as a running vCPU does in the other models: the same
        // load whichever model expires it.
        for slot in g.take_pending() {
            let deadline = g.next_deadline(slot, now);
            model.arm_global(g.owner(slot), deadline, VcpuTimer::Global(slot));
        }
    }
}

impl<C: VmTime + Send + Sync> IrqChip for UserIrqChip<C> {
    fn name(&self) -> &'static str {
        "user"
    }

    fn vcpu(&self, id: u32, shared: &Arc<VcpuShared>) -> Result<Box<dyn VcpuIrq>, IrqChipError> {
        Ok(Box::new(self.user_vcpu(id, shared)?))
    }

    fn edge_irq(&self, gsi: u32) -> Result<EdgeIrq, IrqChipError> {
        Ok(EdgeIrq::Ioapic(IoapicEdgeTrigger {
            router: self.router.clone(),
            pin: usize::try_from(gsi).unwrap_or(usize::MAX),
        }))
    }

    fn irq_lines(&self) -> Arc<dyn IrqLines> {
        Arc::new(router::UserIrqLines(self.router.clone()))
    }

    fn start(&self, shared: &Arc<VcpuShared>) -> Result<(), IrqChipError> {
        if let Some(fd) = &self.central {
            std::thread::Builder::new()
                .name("timers".into())
                .spawn(self.central_thread(fd.clone(), shared.clone()))
                .map_err(|source| IrqChipError::Host {
                    what: "the timer thread",
                    source,
                })?;
        }
        Ok(())
    }

    fn kick_all(&self) {
        for m in self.router.mailboxes() {
            m.flag_control();
        }
        if let Some(fd) = &self.central {
            let _ = fd.arm_at(0);
        }
    }

    fn kick_to_pause(&self) {
        for m in self.router.mailboxes() {
            m.kick();
        }
    }

    fn paused(&self, monotonic: u64) {
        self.clock.freeze_at(monotonic);
    }

    fn save_ioapic(&self) -> Option<devices::ioapic::IoApicState> {
        Some(self.router.save_ioapic())
    }

    fn restore_ioapic(
        &self,
        state: &devices::ioapic::IoApicState,
    ) -> Result<(), saved::ChipStateError> {
        Ok(self.router.restore_ioapic(state)?)
    }

    fn resuming(&self, paused_ns: u64) {
        // Re-arms every host timer from its VM-clock deadline, the central thread's too (one
        // armed while the clock stood was written as "never"). Not a wake-up at 0 for the
        // central thread: its model believes the timerfd armed for its earliest deadline, and
        // would not arm it again after such a wake-up (a restored VM hung that way).
        self.clock.thaw(paused_ns);
    }

    fn report(&self, report: &mut RunReport) {
        let now = self.clock.now();
        let counters = &self.router.counters;
        report.unknown_msr_accesses = self.unknown_msr.count();
        report.lapic_invalid_accesses = self.noise.invalid_access.count();
        report.lapic_timer_clamps = self.noise.timer_clamped.count();
        report.ipis = counters.ipis.load(Ordering::Relaxed);
        report.device_interrupts = counters.device_interrupts.load(Ordering::Relaxed);
        report.timer_model = Some(self.model.kind().to_string());
        report.timers = Some(self.model.metrics());
        report.halt_poll = Some(self.idle.halt_poll.to_string());
        report.timer_advance = Some(self.idle.timer_advance.to_string());
        report.timer_slack = Some(self.idle.timer_slack.to_string());
        report.wake_placement = Some(self.idle.wake_placement.to_string());
        report.idle_inject = self.idle.inject.as_ref().map(|inj| IdleInjectReport {
            config: inj.config().to_string(),
            all_idle_together_ns: inj.all_idle_together_ns(now),
        });
        report.cpu_quota = self.idle.quota.as_ref().map(CpuQuota::report);
        report.global_timers = self.idle.global.as_ref().map(|g| GlobalTimersReport {
            config: g.config().to_string(),
            timer_thread_fires: g.timer_thread_fires.load(Ordering::Relaxed),
        });
    }
}
