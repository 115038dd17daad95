//! lull's real user-space irqchip (`vmm::irqchip::user::UserIrqChip`) on a fake clock and fake
//! host timers, for the targets that drive lull's glue rather than a copy of it (`lapic`,
//! `serial`), and a fake vCPU for its per-vCPU half.
//!
//! The chip is built by `UserIrqChip::with_clock`, the constructor `UserIrqChip::new` wraps:
//! same LAPICs, router, IOAPIC, timer model and idle state, but time is a `FakeClock` the input
//! moves, host ticks are `FakeHostTimer`s whose deadlines the targets read, and nothing
//! installs a signal handler or starts a thread. With the `central` timer model the target
//! plays the timer thread (`UserIrqChip::service_timers`). Nothing here sleeps or blocks:
//! targets never call `VcpuIrq::halted`, and call `wait_for_sipi` only when a start-up IPI is
//! already waiting (it returns at once then).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use devices::mmio::MmioBus;
use devices::pio::PioBus;
use timer::{Clock, FakeClock, FakeHostTimer, HostTimer, ModelKind, Nanos, VmTime};
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm::config::knobs::{
    CpuQuotaConfig, GlobalTimersConfig, HaltPollMode, IdleInjectConfig, TimerAdvanceMode,
};
use vmm::irqchip::user::{UserChipConfig, UserIrqChip};
use vmm::state::VcpuShared;
use vmm::vcpu::DeviceBuses;

/// Size of the fake guest RAM (where PV EOI flags live).
pub const GUEST_RAM: u64 = 0x4000;

/// The fake clock as the chip's clock type (`VmTime` is `vmm`'s, `FakeClock` the timer
/// crate's: the wrapper is this crate's own).
///
/// With [`IdleSpec::timer_advance`] on, a vCPU that handles its LAPIC timer early spins on
/// the clock until the deadline; a fake clock that never moves would spin forever. So a clock
/// built [`FuzzClock::spinning`] moves on by itself, [`SPIN_STEP_NS`] after every
/// [`SPIN_READS`] reads of one value without the target moving it in between: only a spin
/// reads the clock that often within one step (the target calls [`FuzzClock::settle`] at
/// each step).
#[derive(Clone, Debug)]
pub struct FuzzClock {
    clock: FakeClock,
    spin: Option<Arc<Spin>>,
}

/// Reads of one value after which a spinning [`FuzzClock`] moves on.
pub const SPIN_READS: u64 = 1000;
/// How far a spinning [`FuzzClock`] moves on.
pub const SPIN_STEP_NS: u64 = 997;

/// A spinning clock's count of reads of one value.
#[derive(Debug, Default)]
struct Spin {
    last: AtomicU64,
    reads: AtomicU64,
}

impl FuzzClock {
    /// A clock that moves only when the target moves it.
    pub fn fixed(clock: FakeClock) -> Self {
        Self { clock, spin: None }
    }

    /// A clock that also moves on while the chip spins on it.
    pub fn spinning(clock: FakeClock) -> Self {
        Self {
            clock,
            spin: Some(Arc::default()),
        }
    }

    /// The target starts a step: the reads so far were not a spin.
    pub fn settle(&self) {
        if let Some(spin) = &self.spin {
            spin.reads.store(0, Ordering::SeqCst);
        }
    }
}

impl Clock for FuzzClock {
    fn now(&self) -> Nanos {
        let t = self.clock.now();
        let Some(spin) = &self.spin else {
            return t;
        };
        if spin.last.swap(t, Ordering::SeqCst) != t {
            spin.reads.store(0, Ordering::SeqCst);
            return t;
        }
        if spin.reads.fetch_add(1, Ordering::SeqCst) + 1 < SPIN_READS {
            return t;
        }
        spin.reads.store(0, Ordering::SeqCst);
        self.clock.advance(SPIN_STEP_NS);
        let t = self.clock.now();
        spin.last.store(t, Ordering::SeqCst);
        t
    }
}

impl VmTime for FuzzClock {
    fn to_monotonic(&self, t: Nanos) -> u64 {
        t
    }
}

/// What a chip is built with.
#[derive(Debug, Clone, Copy)]
pub struct ChipSpec {
    /// vCPUs.
    pub cpus: u32,
    /// Timer model.
    pub model: ModelKind,
    /// Guest TSC frequency.
    pub tsc_khz: u32,
    /// The guest TSC read when the chip is built.
    pub guest_tsc: u64,
    /// The fake clock's start.
    pub start: Nanos,
    /// Offer PV EOI.
    pub pv_eoi: bool,
    /// Offer lull's PV TSC deadline.
    pub pv_deadline: bool,
}

/// The idle manager's features a chip is built with (all off for [`FakeChip::new`]).
#[derive(Debug, Clone, Copy)]
pub struct IdleSpec {
    /// Halt polling (the targets never halt: it only has to stay out of the way).
    pub halt_poll: HaltPollMode,
    /// Timer advance: host timers armed early, the vCPU spinning to the deadline.
    pub timer_advance: TimerAdvanceMode,
    /// Idle injection.
    pub idle_inject: Option<IdleInjectConfig>,
    /// CPU quota (its phase must be `Aligned`: a random one is drawn from the host).
    pub cpu_quota: Option<CpuQuotaConfig>,
    /// Background global timers on the vCPUs' bases.
    pub global_timers: Option<GlobalTimersConfig>,
}

impl IdleSpec {
    /// Every feature off (what `lull run` does without the idle flags but timer advance,
    /// whose default is adaptive: off here).
    pub fn off() -> Self {
        Self {
            halt_poll: HaltPollMode::Off,
            timer_advance: TimerAdvanceMode::Off,
            idle_inject: None,
            cpu_quota: None,
            global_timers: None,
        }
    }
}

/// A real user irqchip with its fake time and host timers, and the VM state it hangs off.
pub struct FakeChip {
    /// The chip.
    pub chip: UserIrqChip<FuzzClock>,
    /// Its clock.
    pub clock: FakeClock,
    /// The clock as the chip reads it.
    pub fuzz_clock: FuzzClock,
    /// The VM's shared state (counters, stop request).
    pub shared: Arc<VcpuShared>,
    /// The buses exits reach beyond the chip (empty).
    pub buses: DeviceBuses,
    /// Guest RAM.
    pub mem: Arc<GuestMemoryMmap>,
    /// vCPU i's host tick (`pull`, `push`).
    pub ticks: Vec<FakeHostTimer>,
    /// The timer thread's host timer (`central`).
    pub central: Option<FakeHostTimer>,
}

/// The host timers `timer::build` asked for, by owner.
type Made = Arc<Mutex<Vec<(Option<usize>, FakeHostTimer)>>>;

impl FakeChip {
    /// Builds the chip with the idle manager's features off; `None` if `vmm` refuses the
    /// configuration.
    pub fn new(spec: ChipSpec) -> Option<Self> {
        Self::with_idle(spec, None)
    }

    /// Builds the chip with the idle manager's features `idle` (and a clock that moves while
    /// the chip spins on it) or, for `None`, with them off.
    pub fn with_idle(spec: ChipSpec, idle: Option<IdleSpec>) -> Option<Self> {
        let clock = FakeClock::new(spec.start);
        let fuzz_clock = match idle {
            Some(_) => FuzzClock::spinning(clock.clone()),
            None => FuzzClock::fixed(clock.clone()),
        };
        let idle = idle.unwrap_or_else(IdleSpec::off);
        let mem = Arc::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), usize::try_from(GUEST_RAM).ok()?)])
                .ok()?,
        );
        let cfg = UserChipConfig {
            cpus: spec.cpus,
            model: spec.model,
            tsc_khz: spec.tsc_khz,
            idle: vmm::idle::shared::IdleKnobs {
                halt_poll: idle.halt_poll,
                timer_advance: idle.timer_advance,
                timer_slack: vmm::config::knobs::TimerSlack::Off,
                wake_placement: vmm::config::knobs::WakePlacementMode::Off,
                idle_inject: idle.idle_inject,
                cpu_quota: idle.cpu_quota,
                global_timers: idle.global_timers,
            },
            pv_eoi: spec.pv_eoi,
            pv_deadline: spec.pv_deadline,
            x2apic: true,
            max_phys_addr_bits: devices::lapic::MAX_PHYS_ADDR_BITS,
        };
        let made: Made = Arc::default();
        let mut host = |owner: Option<usize>| -> Box<dyn HostTimer> {
            let t = FakeHostTimer::new();
            made.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((owner, t.clone()));
            Box::new(t)
        };
        let chip = UserIrqChip::with_clock(
            &cfg,
            mem.clone(),
            fuzz_clock.clone(),
            (spec.guest_tsc, clock.now()),
            &mut host,
        )
        .ok()?;
        let made = std::mem::take(&mut *made.lock().unwrap_or_else(|p| p.into_inner()));
        let cpus = usize::try_from(spec.cpus).ok()?;
        let ticks = (0..cpus)
            .map(|i| {
                made.iter()
                    .find(|(owner, _)| *owner == Some(i))
                    .map_or_else(FakeHostTimer::new, |(_, t)| t.clone())
            })
            .collect();
        let central = made
            .iter()
            .find(|(owner, _)| owner.is_none())
            .map(|(_, t)| t.clone());
        let shared = Arc::new(VcpuShared::new(spec.cpus, Instant::now()).ok()?);
        Some(Self {
            chip,
            clock,
            fuzz_clock,
            shared,
            buses: DeviceBuses::new(PioBus::new(), MmioBus::new()),
            mem,
            ticks,
            central,
        })
    }
}

/// The vCPU the targets drive: lull's recording fake, taking every NMI at once (set
/// `kvm_nmi: Some(KvmNmi::None)` when built, see [`fake_port`]).
pub use vmm::irqchip::fake_port::FakePort;

/// A [`FakePort`] whose NMIs never stay queued in "KVM".
pub fn fake_port() -> FakePort {
    FakePort {
        kvm_nmi: Some(vmm::irqchip::KvmNmi::None),
        ..FakePort::default()
    }
}
