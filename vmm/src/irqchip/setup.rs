//! Assembling `--irqchip user`: one LAPIC and mailbox per vCPU, the IOAPIC and router, the
//! timer model with its host timers, and the threads that run them.

use std::sync::{Arc, Mutex};

use devices::ioapic::IoApic;
use devices::lapic::{Lapic, LapicConfig, TimerLimits, TscMap};
use devices::serial::COM1_IRQ;
use kvm_bindings::{kvm_msr_entry, Msrs};
use timer::{Clock, CpuTimers, HostTimer, ModelKind, TimerModel, Waker};

use super::clock::VmClock;
use super::host_timer::{CentralHostTimer, SharedTimerFd, ThreadTickTimer};
use super::kick;
use super::mailbox::Mailbox;
use super::router::{InterruptRouter, IoapicEdgeTrigger};
use crate::config::{TimerModelKind, VmConfig};
use crate::cpuid::APIC_BUS_KHZ;
use crate::idle::global_load::GlobalLoad;
use crate::idle::halt_poll::{HaltPollMode, HaltPoller};
use crate::idle::inject::IdleInjector;
use crate::idle::quota::CpuQuota;
use crate::idle::IdleShared;
use crate::kvm_vm::KvmError;
use crate::metrics::LapicNoise;
use crate::ratelimit::LogLimiter;
use crate::vcpu::exit::StopReason;
use crate::vcpu::user::{on_timer_fired, FiredSummary, UserVcpu, VcpuTimer};
use crate::vm::{CreatedVcpu, VmError, VmShared};

const MSR_IA32_TSC: u32 = 0x10;

/// The per-vCPU parts handed to the vCPU threads at start.
type VcpuParts = (
    Vec<Lapic<Arc<LapicNoise>>>,
    Vec<Box<dyn CpuTimers<VcpuTimer>>>,
);

/// The user-space irqchip of one VM.
pub struct UserIrqchip {
    /// The interrupt fabric.
    pub router: Arc<InterruptRouter>,
    /// The timer model's shared part.
    pub model: Arc<dyn TimerModel<VcpuTimer>>,
    /// Unimplemented-MSR accesses.
    pub unknown_msr: Arc<LogLimiter>,
    /// The idle manager's VM-wide state.
    pub idle: Arc<IdleShared>,
    clock: VmClock,
    parts: Mutex<Option<VcpuParts>>,
    central: Option<Arc<SharedTimerFd>>,
    kind: ModelKind,
}

fn thread_err(e: std::io::Error) -> VmError {
    VmError::Thread(e)
}

/// Reads the guest TSC and the VM clock together: the guest TSC at VM-clock time 0, biased so
/// that converted deadlines are never early (the clock is read after the TSC).
fn guest_tsc_map(vcpu: &CreatedVcpu, clock: &VmClock, tsc_khz: u64) -> Result<TscMap, VmError> {
    let mut msrs = Msrs::from_entries(&[kvm_msr_entry {
        index: MSR_IA32_TSC,
        ..Default::default()
    }])
    .map_err(|_| VmError::EventLoop("building the TSC MSR list".into()))?;
    vcpu.fd
        .get_msrs(&mut msrs)
        .map_err(|source| KvmError::Ioctl {
            call: "KVM_GET_MSRS(IA32_TSC)",
            source,
        })?;
    let after = clock.now();
    let tsc = msrs.as_slice().first().map_or(0, |e| e.data);
    let elapsed_ticks = u128::from(after) * u128::from(tsc_khz) / 1_000_000;
    let at0 = u128::from(tsc).saturating_sub(elapsed_ticks);
    Ok(TscMap {
        tsc_khz,
        tsc_at_ns0: u64::try_from(at0).unwrap_or(0),
    })
}

impl UserIrqchip {
    /// Builds the irqchip for `vcpus` (created and configured, not yet running).
    pub fn new(
        cfg: &VmConfig,
        vcpus: &[CreatedVcpu],
        tsc_khz: u32,
        noise: Arc<LapicNoise>,
    ) -> Result<Self, VmError> {
        kick::install_handler().map_err(|e| VmError::EventLoop(format!("kick signal: {e}")))?;
        let clock = VmClock::new();
        let bsp = vcpus
            .first()
            .ok_or(KvmError::TooManyCpus { asked: 0, max: 0 })?;
        let tsc = guest_tsc_map(bsp, &clock, u64::from(tsc_khz))?;
        let mut lapics = Vec::new();
        for id in 0..cfg.cpus {
            let config = LapicConfig {
                apic_id: id,
                bsp: id == 0,
                bus_hz: u64::from(APIC_BUS_KHZ) * 1000,
                tsc,
                limits: TimerLimits::default(),
                x2apic_supported: true,
                max_phys_addr_bits: devices::lapic::MAX_PHYS_ADDR_BITS,
            };
            let lapic = Lapic::with_events(config, noise.clone())
                .map_err(|e| VmError::EventLoop(format!("LAPIC: {e}")))?;
            lapics.push(lapic);
        }
        let mailboxes: Vec<Arc<Mailbox>> = lapics.iter().map(|_| Arc::default()).collect();
        let ioapic_id = u8::try_from(cfg.cpus).unwrap_or(u8::MAX);
        let router = Arc::new(InterruptRouter::new(
            lapics.iter().map(|l| l.destination_info()).collect(),
            mailboxes.clone(),
            IoApic::new(ioapic_id),
        ));
        let waker: Arc<dyn Waker> = {
            let mailboxes = mailboxes.clone();
            Arc::new(move |cpu: usize| {
                if let Some(m) = mailboxes.get(cpu) {
                    m.kick();
                }
            })
        };
        let kind = match cfg.timer_model {
            TimerModelKind::Pull => ModelKind::Pull,
            TimerModelKind::Push => ModelKind::Push,
            TimerModelKind::Central => ModelKind::Central,
        };
        let central = match kind {
            ModelKind::Central => Some(Arc::new(SharedTimerFd::new(clock).map_err(thread_err)?)),
            _ => None,
        };
        let nodes = vec![0; lapics.len()];
        let mut host = |cpu: Option<usize>| -> Box<dyn HostTimer> {
            match (cpu, &central) {
                (None, Some(fd)) => Box::new(CentralHostTimer(fd.clone())),
                _ => Box::new(ThreadTickTimer::new(clock)),
            }
        };
        let model = timer::build::<VcpuTimer>(kind, &nodes, &mut host, waker)
            .map_err(|e| VmError::EventLoop(format!("timer model: {e}")))?;
        let idle = Arc::new(IdleShared {
            halt_poll: cfg.halt_poll.unwrap_or(HaltPollMode::Adaptive),
            inject: cfg.idle_inject.map(|c| IdleInjector::new(c, lapics.len())),
            quota: cfg
                .cpu_quota
                .map(|q| CpuQuota::new(q, clock.to_monotonic(0))),
            global: cfg.global_timers.map(GlobalLoad::new),
        });
        Ok(Self {
            router,
            idle,
            model: model.shared,
            unknown_msr: Arc::new(LogLimiter::new()),
            clock,
            parts: Mutex::new(Some((lapics, model.cpus))),
            central,
            kind,
        })
    }

    /// The VM clock's current time.
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// The serial port's interrupt: an edge on IOAPIC pin 4.
    pub fn serial_trigger(&self) -> IoapicEdgeTrigger {
        IoapicEdgeTrigger {
            router: self.router.clone(),
            pin: usize::try_from(COM1_IRQ).unwrap_or(4),
        }
    }

    /// Starts one thread per vCPU, and the timer thread of the `central` model.
    pub fn start(&self, vcpus: Vec<CreatedVcpu>, shared: Arc<VmShared>) -> Result<(), VmError> {
        let parts = self.parts.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some((lapics, cpus)) = parts else {
            return Err(VmError::EventLoop("the irqchip was started twice".into()));
        };
        for (((id, v), lapic), timers) in (0u32..).zip(vcpus).zip(lapics).zip(cpus) {
            let unit = UserVcpu {
                vcpu: v.fd,
                id,
                lapic,
                timers,
                router: self.router.clone(),
                clock: self.clock,
                shared: shared.clone(),
                reset_regs: v.reset_regs,
                reset_sregs: v.reset_sregs,
                unknown_msr: self.unknown_msr.clone(),
                lapic_timer: None,
                idle: self.idle.clone(),
                poller: HaltPoller::new(self.idle.halt_poll),
                inject_timer: None,
                quota_timer: None,
                global_armed: false,
            };
            std::thread::Builder::new()
                .name(format!("vcpu{id}"))
                .spawn(move || unit.run())
                .map_err(thread_err)?;
        }
        if let (ModelKind::Central, Some(fd)) = (self.kind, &self.central) {
            let fd = fd.clone();
            let model = self.model.clone();
            let router = self.router.clone();
            let clock = self.clock;
            let idle = self.idle.clone();
            std::thread::Builder::new()
                .name("timers".into())
                .spawn(move || {
                    if let Err(e) = crate::seccomp::apply(crate::seccomp::ThreadKind::Timers) {
                        shared.stop.request(StopReason::VmmError(e.to_string()));
                        return;
                    }
                    loop {
                        // One wake-up per expiry: a timerfd re-armed while the thread blocks
                        // in read() fires at the new deadline.
                        if let Err(e) = fd.wait() {
                            if e.kind() != std::io::ErrorKind::Interrupted {
                                shared
                                    .stop
                                    .request(StopReason::VmmError(format!("timer thread: {e}")));
                                return;
                            }
                        }
                        if shared.stop.is_requested() {
                            return;
                        }
                        let mut summary = FiredSummary::default();
                        model.service(clock.now(), &mut |fired| {
                            on_timer_fired(&router, idle.global.as_ref(), &mut summary, fired)
                        });
                        if let Some(g) = &idle.global {
                            for _ in 0..summary.own_global + summary.remote_global {
                                g.timer_thread_fired();
                            }
                        }
                    }
                })
                .map_err(thread_err)?;
        }
        Ok(())
    }

    /// Wakes every vCPU and the timer thread so that they see the stop.
    pub fn stop_all(&self) {
        for m in self.router.mailboxes() {
            m.flag_control();
        }
        if let Some(fd) = &self.central {
            let _ = fd.arm_at(0);
        }
    }
}
