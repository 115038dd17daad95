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

use std::sync::{Arc, Mutex};
use std::time::Instant;

use devices::pio::PioBus;
use timer::{Clock, FakeClock, FakeHostTimer, HostTimer, ModelKind, Nanos};
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm::idle::halt_poll::HaltPollMode;
use vmm::irqchip::user::vcpu::VmTime;
use vmm::irqchip::user::{UserChipConfig, UserIrqChip};
use vmm::state::VmShared;

/// Size of the fake guest RAM (where PV EOI flags live).
pub const GUEST_RAM: u64 = 0x4000;

/// The fake clock as the chip's clock type (`VmTime` is `vmm`'s, `FakeClock` the timer
/// crate's: the wrapper is this crate's own).
#[derive(Clone, Debug)]
pub struct FuzzClock(pub FakeClock);

impl Clock for FuzzClock {
    fn now(&self) -> Nanos {
        self.0.now()
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

/// A real user irqchip with its fake time and host timers, and the VM state it hangs off.
pub struct FakeChip {
    /// The chip.
    pub chip: UserIrqChip<FuzzClock>,
    /// Its clock.
    pub clock: FakeClock,
    /// The VM's shared state (counters, stop request, an empty port bus unless given one).
    pub shared: Arc<VmShared>,
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
    /// Builds the chip; `None` if `vmm` refuses the configuration.
    pub fn new(spec: ChipSpec) -> Option<Self> {
        let clock = FakeClock::new(spec.start);
        let mem = Arc::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), usize::try_from(GUEST_RAM).ok()?)])
                .ok()?,
        );
        let cfg = UserChipConfig {
            cpus: spec.cpus,
            model: spec.model,
            tsc_khz: spec.tsc_khz,
            halt_poll: HaltPollMode::Off,
            timer_advance: vmm::idle::advance::TimerAdvanceMode::Off,
            wake_placement: vmm::idle::placement::WakePlacementMode::Off,
            idle_inject: None,
            cpu_quota: None,
            global_timers: None,
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
            FuzzClock(clock.clone()),
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
        let shared =
            Arc::new(VmShared::new(PioBus::new(), spec.cpus, Instant::now(), vec![]).ok()?);
        Some(Self {
            chip,
            clock,
            shared,
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
