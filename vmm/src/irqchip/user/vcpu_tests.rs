//! The per-vCPU user irqchip on a fake vCPU and a fake clock: what reaches the guest, and
//! when, without `/dev/kvm`.

use std::sync::Arc;

use devices::ioapic::IoApic;
use devices::lapic::{Ipi, LapicConfig, NoopLapicEvents};
use proptest::prelude::*;
use timer::{build, FakeClock, FakeHostTimer, HostTimer, ModelKind};

use super::*;
use crate::config::knobs::HaltPollMode;
use crate::irqchip::user::cr8::TPR_POLL_NS;

use crate::irqchip::fake_port::FakePort;
use crate::irqchip::user::mailbox::Mailbox;

pub(super) struct Rig {
    pub(super) irq: UserVcpuIrq<NoopLapicEvents, FakeClock>,
    pub(super) router: Arc<InterruptRouter>,
    pub(super) clock: FakeClock,
    shared: Arc<VcpuShared>,
    pub(super) port: FakePort,
    /// vCPU 0's host tick.
    tick: FakeHostTimer,
    /// Guest memory (64 KiB at 0).
    mem: Arc<vm_memory::GuestMemoryMmap>,
}

const LAPIC: u64 = 0xfee0_0000;

impl Rig {
    /// vCPU 0 of a one-vCPU VM, its LAPIC software-enabled.
    pub(super) fn new(kind: ModelKind) -> Self {
        Self::with_pv_deadline(kind, true)
    }

    /// As [`Rig::new`], with lull's PV deadline offered or not.
    fn with_pv_deadline(kind: ModelKind, pv_deadline: bool) -> Self {
        let mem = Arc::new(
            vm_memory::GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 0x10000)])
                .unwrap(),
        );
        let clock = FakeClock::new(0);
        let lapic = Lapic::new(LapicConfig::default()).unwrap();
        let router = Arc::new(InterruptRouter::new(
            vec![lapic.destination_info()],
            vec![Arc::new(Mailbox::new().unwrap())],
            IoApic::new(1),
        ));
        let waker = Arc::new(|_cpu: usize| {});
        let tick = FakeHostTimer::new();
        let mut host = |_| Box::new(tick.clone()) as Box<dyn HostTimer>;
        let model = build::<VcpuTimer>(kind, &[0], &mut host, waker).unwrap();
        let idle = Arc::new(IdleShared {
            halt_poll: HaltPollMode::Off,
            timer_advance: crate::config::knobs::TimerAdvanceMode::Off,
            timer_slack: crate::config::knobs::TimerSlack::Off,
            inject: None,
            quota: None,
            global: None,
            wake_placement: crate::config::knobs::WakePlacementMode::Off,
        });
        let shared = Arc::new(VcpuShared::new(1, std::time::Instant::now()).unwrap());
        let irq = UserVcpuIrq::new(UserVcpuParts {
            id: 0,
            lapic,
            timers: model.cpus.into_iter().next().unwrap(),
            router: router.clone(),
            clock: clock.clone(),
            idle,
            shared: shared.clone(),
            unknown_msr: Arc::new(LogLimiter::new()),
            mem: mem.clone(),
            pv_eoi: true,
            pv_deadline,
            wake_timer: None,
            tsc_anchor: None,
        })
        .unwrap();
        let mut rig = Rig {
            irq,
            router,
            clock,
            shared,
            port: FakePort::default(),
            tick,
            mem,
        };
        rig.mmio_write(0xf0, 0x1ff); // SVR: software enable, spurious vector 0xff
        rig
    }

    pub(super) fn mmio_write(&mut self, offset: u64, value: u32) {
        let bytes = value.to_le_bytes();
        let handled = self
            .irq
            .handle_exit(VcpuExit::MmioWrite(LAPIC + offset, &bytes));
        assert!(matches!(handled, Ok(ChipExit::Continue)));
        self.irq.exit_done(&mut self.port);
    }

    pub(super) fn wrmsr(&mut self, index: u32, data: u64) {
        assert_eq!(
            self.try_wrmsr(index, data),
            0,
            "MSR {index:#x} write faulted"
        );
    }

    /// A WRMSR exit; returns its error byte (1: #GP).
    fn try_wrmsr(&mut self, index: u32, data: u64) -> u8 {
        let mut error = 0u8;
        let exit = VcpuExit::X86Wrmsr(kvm_ioctls::WriteMsrExit {
            error: &mut error,
            reason: kvm_ioctls::MsrExitReason::Filter,
            index,
            data,
        });
        assert!(matches!(self.irq.handle_exit(exit), Ok(ChipExit::Continue)));
        self.irq.exit_done(&mut self.port);
        error
    }

    /// The guest handles the interrupt it was given and EOIs it.
    pub(super) fn eoi(&mut self) {
        self.mmio_write(0xb0, 0);
    }
}

proptest! {
    /// Every interrupt posted to the vCPU reaches the guest exactly once, in priority order
    /// at each entry, whatever the guest's interrupt window looks like at each entry.
    #[test]
    fn a_posted_interrupt_is_never_lost_or_doubled(
        vectors in prop::collection::btree_set(0x20u8..=0xfe, 1..12),
        windows in prop::collection::vec(any::<bool>(), 1..40),
    ) {
        let mut rig = Rig::new(ModelKind::Pull);
        for &v in &vectors {
            rig.router.send_ipi(&Ipi::fixed(v, 0));
        }
        let mut got = Vec::new();
        // Entries with the window as given, then open ones until everything is delivered.
        let opens = windows.into_iter().chain(std::iter::repeat(true)).take(400);
        for open in opens {
            rig.port.open = open;
            prop_assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
            if let Some(v) = rig.port.injected.pop() {
                prop_assert!(rig.port.injected.is_empty(), "two injections in one entry");
                got.push(v);
                rig.eoi();
            } else if rig.irq.lapic().has_pending_interrupt() {
                prop_assert!(!open);
                prop_assert!(rig.port.window_requested, "pending with no window requested");
            }
            if got.len() == vectors.len() {
                break;
            }
        }
        let mut want: Vec<u8> = vectors.into_iter().collect();
        want.sort_unstable_by(|a, b| b.cmp(a));
        prop_assert_eq!(got, want);
    }
}

#[test]
fn a_tsc_deadline_interrupt_comes_at_its_deadline_never_before() {
    let mut rig = Rig::new(ModelKind::Pull);
    rig.port.open = true;
    rig.mmio_write(0x320, 0x4_0040); // LVT timer: TSC-deadline mode, vector 0x40
                                     // The default TSC map is 1 tick per ns from 0.
    let khz = LapicConfig::default().tsc.tsc_khz;
    let deadline_ns = 2_000_000;
    rig.wrmsr(0x6e0, deadline_ns * khz / 1_000_000);
    rig.clock.set(deadline_ns - 1);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(rig.port.injected.is_empty(), "the interrupt came early");
    rig.clock.set(deadline_ns + 500);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x40]);
    // Its lateness is recorded: 500 ns falls in the first bucket.
    let c = rig.shared.counters(0).unwrap();
    assert_eq!(c.lapic_timer_fires.load(Ordering::Relaxed), 1);
    assert_eq!(c.lateness_us_log2[0].load(Ordering::Relaxed), 1);
}

#[test]
fn a_tsc_deadline_is_converted_with_a_map_re_anchored_to_the_guest_tsc() {
    use crate::irqchip::user::guest_tsc::{TscAnchor, REANCHOR_NS};
    // The default map says 1 tick per ns from 0, but this guest's TSC runs 1% fast.
    let mut rig = Rig::new(ModelKind::Pull);
    let c = rig.clock.clone();
    let tsc = move || {
        let ns = timer::Clock::now(&c);
        ns + ns / 100
    };
    let read: Arc<dyn Fn() -> u64 + Send + Sync> = Arc::new(tsc.clone());
    rig.irq.chip.tsc_anchor = Some(TscAnchor::new(read, 1_000_000, 0));
    rig.port.open = true;
    rig.mmio_write(0x320, 0x4_0040); // LVT timer: TSC-deadline mode, vector 0x40
    let t = 2 * REANCHOR_NS;
    rig.clock.set(t);
    rig.irq.after_run(None); // an exit: the map is due for a new anchor
                             // The guest asks for 1 ms of its TSC ahead: 1,010,000 ticks, as many ns here. The
                             // start-up map would put the deadline t / 100 (20 ms) later.
    rig.wrmsr(0x6e0, tsc() + 1_010_000);
    rig.clock.set(t + 1_009_999);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(rig.port.injected.is_empty(), "the interrupt came early");
    rig.clock.set(t + 1_010_000);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x40], "the interrupt is late");
}

#[test]
fn a_halt_with_a_takeable_interrupt_resumes_and_a_stop_ends_it() {
    let mut rig = Rig::new(ModelKind::Push);
    rig.port.open = true;
    rig.router.send_ipi(&Ipi::fixed(0x50, 0));
    assert_eq!(rig.irq.halted(&mut rig.port), HaltEnd::Resume);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x50]);
    rig.shared.stop.request(crate::state::StopReason::Reset);
    assert_eq!(rig.irq.halted(&mut rig.port), HaltEnd::Stop);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Stop);
}

#[test]
fn an_nmi_is_injected_and_an_apic_base_write_reaches_kvm() {
    let mut rig = Rig::new(ModelKind::Central);
    rig.router.send_ipi(&nmi_ipi());
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.nmis, 1);
    // Switch to x2APIC mode: KVM hears of the new IA32_APIC_BASE.
    rig.wrmsr(0x1b, 0xfee0_0000 | 0x900 | 0x400);
    assert_eq!(rig.port.apic_base, Some(0xfee0_0d00));
}

fn nmi_ipi() -> Ipi {
    Ipi {
        delivery_mode: devices::lapic::DeliveryMode::Nmi,
        ..Ipi::fixed(0, 0)
    }
}

#[test]
fn cr8_and_tpr_are_one_register() {
    let mut rig = Rig::new(ModelKind::Pull);
    rig.port.open = true;
    // The guest wrote CR8 = 5 in the guest: TPR follows as the exit comes back.
    rig.irq.after_run(Some(5));
    assert_eq!(rig.irq.lapic().tpr(), 0x50);
    // A TPR write through the register reaches CR8 at the next entry; an unchanged CR8 after
    // the following exit keeps TPR[3:0].
    rig.mmio_write(0x80, 0x3c);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.cr8, 3);
    rig.irq.after_run(Some(rig.port.cr8));
    assert_eq!(rig.irq.lapic().tpr(), 0x3c);
    // CR8 6 holds a class-6 interrupt; CR8 0 (KVM_EXIT_SET_TPR) lets it in at the next entry.
    rig.irq.after_run(Some(6));
    rig.router.send_ipi(&Ipi::fixed(0x62, 0));
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(rig.port.injected.is_empty(), "held by CR8 6");
    assert_eq!(rig.port.cr8, 6);
    rig.irq.after_run(Some(0));
    assert!(matches!(
        rig.irq.handle_exit(VcpuExit::SetTpr),
        Ok(ChipExit::Continue)
    ));
    rig.irq.exit_done(&mut rig.port);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x62]);
    assert_eq!(rig.port.cr8, 0);
}

#[test]
fn an_interrupt_held_by_tpr_alone_makes_the_vcpu_look_again() {
    let mut rig = Rig::new(ModelKind::Push);
    rig.port.open = true;
    rig.irq.after_run(Some(6));
    rig.router.send_ipi(&Ipi::fixed(0x62, 0));
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(rig.irq.chip.tpr_poll.is_armed());
    assert_eq!(rig.irq.chip.timers.next_deadline(), TPR_POLL_NS);
    // The poll fires while CR8 is still 6: nothing is injected, and the poll is re-armed.
    rig.clock.set(TPR_POLL_NS);
    rig.irq.after_run(Some(6));
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(rig.port.injected.is_empty());
    assert_eq!(rig.irq.chip.timers.next_deadline(), 2 * TPR_POLL_NS);
    // The guest lowered CR8 (no exit reported it): the poll's exit delivers.
    rig.clock.set(2 * TPR_POLL_NS);
    rig.irq.after_run(Some(0));
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x62]);
    assert!(!rig.irq.chip.tpr_poll.is_armed(), "nothing held, no poll");
    // Nothing pending: no poll either (the common case pays nothing).
    rig.eoi();
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(!rig.irq.chip.tpr_poll.is_armed());
}

#[test]
fn a_halt_cancels_the_tpr_poll() {
    let mut rig = Rig::new(ModelKind::Pull);
    rig.port.open = true;
    rig.irq.after_run(Some(6));
    rig.router.send_ipi(&Ipi::fixed(0x62, 0));
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(rig.irq.chip.tpr_poll.is_armed());
    assert!(matches!(
        rig.irq.handle_exit(VcpuExit::Hlt),
        Err(VcpuExit::Hlt)
    ));
    assert!(!rig.irq.chip.tpr_poll.is_armed());
}

#[test]
fn a_halted_vcpu_wakes_for_an_nmi_with_interrupts_disabled() {
    let mut rig = Rig::new(ModelKind::Pull);
    rig.port.open = false; // IF=0
    rig.router.send_ipi(&nmi_ipi());
    rig.router.send_ipi(&nmi_ipi());
    assert_eq!(rig.irq.halted(&mut rig.port), HaltEnd::Resume);
    assert_eq!(rig.port.nmis, 2, "both NMIs go to KVM");
}

#[test]
fn a_fixed_interrupt_waits_for_the_nmis_sent_before_it() {
    let mut rig = Rig::new(ModelKind::Pull);
    rig.port.open = true;
    // One vCPU sends an NMI, then a fixed IPI; the target's own NMI is pending too.
    rig.router.send_ipi(&nmi_ipi());
    rig.router.send_ipi(&nmi_ipi());
    rig.router.send_ipi(&Ipi::fixed(0x50, 0));
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.nmis, 2, "both NMIs go to KVM");
    // KVM would queue 0x50 as injected, ahead of its pending NMIs: it waits for a window.
    assert!(rig.port.injected.is_empty());
    assert!(rig.port.window_requested);
    // The window opened with one NMI still deliverable (after the first's IRET): wait again.
    rig.port.kvm_nmi = Some(KvmNmi::Deliverable);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(rig.port.injected.is_empty());
    assert!(rig.port.window_requested);
    // Both delivered: the fixed interrupt goes in, and KVM is not asked again.
    rig.port.kvm_nmi = Some(KvmNmi::None);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x50]);
    let asked = rig.port.events_asked;
    rig.router.send_ipi(&Ipi::fixed(0x60, 0));
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x50, 0x60]);
    assert_eq!(rig.port.events_asked, asked);
}

#[test]
fn an_nmi_held_behind_nmi_blocking_holds_no_interrupt_back() {
    let mut rig = Rig::new(ModelKind::Push);
    rig.router.send_ipi(&nmi_ipi());
    rig.router.send_ipi(&nmi_ipi());
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    // The guest is in its NMI handler with one more latched, and set IF: as on hardware, a
    // fixed interrupt is taken while the NMI waits for the handler's IRET.
    rig.port.kvm_nmi = Some(KvmNmi::Blocked);
    rig.port.open = true;
    rig.router.send_ipi(&Ipi::fixed(0x50, 0));
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x50]);
}

#[test]
fn a_halt_with_an_nmi_still_held_in_kvm_resumes_unless_nmis_are_blocked() {
    let mut rig = Rig::new(ModelKind::Push);
    // A plain halt with no NMI of lull's outstanding asks KVM nothing.
    rig.router.send_ipi(&Ipi::fixed(0x50, 0));
    rig.port.open = true;
    assert_eq!(rig.irq.halted(&mut rig.port), HaltEnd::Resume);
    assert_eq!(rig.port.events_asked, 0);
    rig.port.open = false;
    // Two NMIs went to KVM while the vCPU ran; the guest took one and halted: KVM still
    // holds the other, deliverable since the first's IRET.
    rig.router.send_ipi(&nmi_ipi());
    rig.router.send_ipi(&nmi_ipi());
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    rig.port.kvm_nmi = Some(KvmNmi::Deliverable);
    assert_eq!(rig.irq.halted(&mut rig.port), HaltEnd::Resume);
    // Halted inside the NMI handler: the held NMI waits for IRET, so the halt must not end
    // for it (a resume would come straight back as another HLT exit).
    rig.port.kvm_nmi = Some(KvmNmi::Blocked);
    assert!(!rig.irq.chip.nmi_runnable(&mut rig.port));
    assert!(rig.irq.chip.lapic.nmi_in_cpu(), "still outstanding");
    // Once KVM holds none, HLT stops asking.
    rig.port.kvm_nmi = Some(KvmNmi::None);
    assert!(!rig.irq.chip.nmi_runnable(&mut rig.port));
    let asked = rig.port.events_asked;
    assert!(!rig.irq.chip.nmi_runnable(&mut rig.port));
    assert_eq!(rig.port.events_asked, asked);
}

/// A periodic LAPIC timer re-armed at its expiry has its host tick programmed before the next
/// entry (found by the `lapic` fuzz target: the next period waited for some other exit).
#[test]
fn a_periodic_timer_keeps_its_host_tick_armed() {
    let mut rig = Rig::new(ModelKind::Pull);
    rig.port.open = true;
    rig.mmio_write(0x3e0, 0xb); // divide by 1: one count per ns at the 1 GHz bus
    rig.mmio_write(0x320, 0x2_0040); // periodic, vector 0x40
    rig.mmio_write(0x380, 1_000_000); // 1 ms
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.tick.deadline(), 1_000_000);
    rig.clock.set(1_000_100);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x40]);
    assert_eq!(
        rig.tick.deadline(),
        2_000_000,
        "the next period's host tick is armed before the entry"
    );
}

/// lull's PV TSC deadline: a deadline stored in the guest's slot arms the LAPIC timer at the
/// next exit (and only once), an MSR write at that same exit wins over it, and outside
/// TSC-deadline mode it is ignored as the MSR write would be.
#[test]
fn a_pv_deadline_arms_the_timer_at_the_next_exit_once() {
    use crate::irqchip::user::pv_deadline::MSR_LULL_PV_DEADLINE;
    use vm_memory::{Bytes, GuestAddress};
    let slot = GuestAddress(0x1000);
    let mut rig = Rig::new(ModelKind::Pull);
    rig.port.open = true;
    rig.mmio_write(0x320, 0x4_0040); // LVT timer: TSC-deadline mode, vector 0x40
    rig.wrmsr(MSR_LULL_PV_DEADLINE, slot.0 | 1);
    // The default TSC map is 1 tick per ns from 0.
    rig.mem.write_obj(2_000_000u64, slot).unwrap();
    assert!(
        rig.irq.lapic().timer_deadline().is_none(),
        "armed before any exit"
    );
    rig.irq.after_run(None);
    assert_eq!(rig.mem.read_obj::<u64>(slot).unwrap(), 0, "slot not taken");
    assert!(rig.irq.lapic().timer_deadline().is_some());
    rig.clock.set(1_999_999);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(rig.port.injected.is_empty(), "the interrupt came early");
    rig.clock.set(2_000_100);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x40]);
    rig.eoi();
    rig.port.injected.clear();
    let c = rig.shared.counters(0).unwrap();
    assert_eq!(c.pv_deadlines.load(Ordering::Relaxed), 1);

    // Stored, then a WRMSR at the same exit: the WRMSR is the later write.
    rig.mem.write_obj(3_000_000u64, slot).unwrap();
    rig.irq.after_run(None);
    rig.wrmsr(0x6e0, 5_000_000);
    rig.clock.set(4_000_000);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(
        rig.port.injected.is_empty(),
        "fired for the overwritten deadline"
    );
    rig.clock.set(5_000_000);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert_eq!(rig.port.injected, vec![0x40]);
    rig.eoi();
    rig.port.injected.clear();

    // One-shot mode: a stored deadline is taken and ignored.
    rig.mmio_write(0x320, 0x40);
    rig.mem.write_obj(6_000_000u64, slot).unwrap();
    rig.irq.after_run(None);
    assert_eq!(rig.mem.read_obj::<u64>(slot).unwrap(), 0);
    rig.clock.set(7_000_000);
    assert_eq!(rig.irq.before_entry(&mut rig.port), Entry::Enter);
    assert!(rig.port.injected.is_empty());
}

#[test]
fn the_pv_deadline_msr_faults_unless_offered_or_on_a_bad_slot() {
    use crate::irqchip::user::pv_deadline::MSR_LULL_PV_DEADLINE;
    let mut rig = Rig::with_pv_deadline(ModelKind::Pull, false);
    assert_eq!(rig.try_wrmsr(MSR_LULL_PV_DEADLINE, 0x1000 | 1), 1);
    let mut rig = Rig::new(ModelKind::Pull);
    assert_eq!(rig.try_wrmsr(MSR_LULL_PV_DEADLINE, 0x1004 | 1), 1);
    assert_eq!(rig.try_wrmsr(MSR_LULL_PV_DEADLINE, 0x2_0000 | 1), 1);
    assert_eq!(rig.try_wrmsr(MSR_LULL_PV_DEADLINE, 0x1000 | 1), 0);
}

#[path = "vcpu_tick_defer_tests.rs"]
mod tick_defer;
