//! The `lapic` target: lull's real per-vCPU user irqchip (`vmm::irqchip::user::vcpu::
//! UserVcpuIrq`), 2-4 of them from one real `UserIrqChip` (`crate::chip`: fake clock, fake
//! host timers, any timer model, PV EOI on or off), driven the way `vmm::vcpu::run` drives
//! them: `before_entry` on a fake `CpuPort` whose interrupt window the input opens and
//! closes, then the guest's exit as a real `kvm_ioctls::VcpuExit` (LAPIC MMIO at the current
//! base, IOAPIC MMIO, x2APIC / IA32_APIC_BASE / TSC-deadline / PV EOI / PV deadline MSRs,
//! IPIs, EOIs through the register or the PV flag, deadlines stored in the PV deadline slot,
//! interrupt windows, EINTR) through `after_run`, `handle_exit`
//! (the generic `vmm::vcpu::exit::handle_exit` for what the chip gives back) and `exit_done`.
//! Between steps the clock moves, the `central` model's thread runs, devices raise IOAPIC
//! lines. A vCPU that an INIT stopped waits for its SIPI (`wait_for_sipi` is called only once
//! the SIPI is there, so nothing blocks).
//!
//! `lapic_idle` (`run_idle`) drives the same vCPUs on a chip with the idle manager's features
//! on (halt polling, timer advance, idle injection, CPU quota, global timers), with the same
//! checks. A vCPU handling its timer early spins on a clock that then moves by itself
//! (`chip::FuzzClock`); the target moves the clock past the holds of idle injection and the
//! quota (from its own copies of both) before the chip would block in them.
//!
//! The priority checks trust nothing the LAPIC computes: `model.rs` records, per vCPU, the
//! vectors the fake port saw injected and no EOI (register, MSR or PV flag) has ended, and the
//! TPR the guest wrote; IPI targets come from the SDM's destination rules over the LAPICs'
//! registers (`oracle.rs`), not from `devices::lapic::route`.
//!
//! Checked (`check.rs`), for every vCPU after every step:
//! - ISR = the recorded in-service vectors; TPR = the TPR written; PPR = the SDM's function of
//!   the two (11.8.3.1); the next interrupt is the highest pending vector iff its class is
//!   above PPR's; no vector below 16 in IRR or ISR;
//! - IA32_APIC_BASE as last told to KVM (`CpuPort::set_apic_base`) is the LAPIC's;
//! - **no lost timer**: a vCPU in the guest with a LAPIC deadline has a host timer armed no
//!   later (its own tick, or the `central` thread's); **the clamp bounds the storm**: LAPIC
//!   timer fires <= the guest's LAPIC writes + elapsed time / `min_period_ns`.
//!
//! At every entry: CR8 as given to KVM (`kvm_run.cr8`) = TPR[7:4] of the TPR written; never
//! more than one injection, and none while the port says the guest cannot take one; the
//! injected vector's class is above the recorded PPR, and it is the LAPIC's highest pending one
//! (now the highest in service, above everything left in IRR); nothing early: a timer deadline
//! the clock has not reached is still armed, untouched; no idle-manager hold the target did not
//! foresee; an open window with nothing injected means
//! nothing is deliverable; the interrupt-window request is on exactly when something is
//! still deliverable; no timer deadline is due (a due timer fired before the entry), and a
//! periodic re-arm is `min_period_ns` after the deadline it replaces; an unmasked timer fire
//! left its vector in IRR or ISR; **a posted IPI is never lost**: every fixed IPI another
//! step sent to this vCPU (a target by the SDM's rules, `oracle.rs`) is in its IRR or ISR,
//! and every NMI was injected; a PV EOI flag lull sets is set
//! only for a lone, edge-triggered in-service vector with nothing pending.
//!
//! At every IPI: `devices::lapic::route` over the LAPICs' addressing state names exactly the
//! LAPICs the SDM's rules accept (either way where the SDM leaves it open), and sends the same
//! message with lowest-priority delivery to exactly one software-enabled LAPIC they accept.
//!
//! At every exit: a deadline a guest write set is at least `min_delay_ns` away; an EOI
//! (register or PV flag) retires the highest in-service vector; a PV flag lull set is taken
//! back; a deadline stored in a PV deadline slot is taken (the slot reads 0) and counted once;
//! nothing panics, whatever the guest wrote.
//!
//! `LULL_FUZZ_TRACE=1` prints each step as it runs (e.g. under `cargo test`'s replay).

mod check;
mod idle;
pub mod input;
mod model;
mod oracle;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arbitrary::Unstructured;
use devices::lapic::{
    regs, ApicMode, DeliveryMode, DestinationMode, InitSipiState, Ipi, Lapic, Shorthand,
    TimerLimits, TriggerMode,
};
use kvm_ioctls::{MsrExitReason, ReadMsrExit, VcpuExit, WriteMsrExit};
use timer::{Clock, ModelKind};
use vm_memory::{Bytes, GuestAddress};
use vmm::idle::inject::IdleInjector;
use vmm::idle::quota::CpuQuota;
use vmm::irqchip::user::pv_deadline::MSR_LULL_PV_DEADLINE;
use vmm::irqchip::user::pv_eoi::MSR_KVM_PV_EOI_EN;
use vmm::irqchip::user::vcpu::UserVcpuIrq;
use vmm::irqchip::{ChipExit, Entry, IrqChip, VcpuIrq};
use vmm::setup::layout::IOAPIC_ADDR;
use vmm::metrics::{LapicNoise, VcpuCounters};
use vmm::vcpu::exit::VcpuAction;

use crate::chip::{ChipSpec, FakeChip, FakePort, FuzzClock};
use check::{highest, read_bitmap, read_reg};
use input::{GuestAction, IpiSpec, Op};

/// The clock stops here: ~146 years of uptime. Beyond it, deadlines that saturate at
/// `u64::MAX` would look due, which no real run reaches.
const MAX_NOW: u64 = 1 << 62;

/// One vCPU's irqchip half.
type Irq = UserVcpuIrq<Arc<LapicNoise>, FuzzClock>;

/// Where a vCPU's thread is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In user space between an exit and the next entry.
    Out,
    /// In KVM_RUN (after `before_entry` said Enter).
    InGuest,
    /// In INIT, waiting for a SIPI.
    WaitingForSipi,
}

/// One vCPU: its irqchip half, its fake port, and what the target expects of it.
struct Vcpu {
    irq: Irq,
    port: FakePort,
    place: Place,
    /// Fixed IPIs sent to it since its last entry.
    expected: Vec<u8>,
    /// NMIs sent to it since its last entry.
    expected_nmis: u64,
    /// LAPIC writes (MMIO or MSR) its guest made: each may arm the timer once.
    writes: u64,
    /// The PV EOI flag the guest enabled (accepted writes of the MSR).
    pv_flag: Option<u64>,
    /// The PV deadline slot the guest enabled (accepted writes of the MSR).
    pv_slot: Option<u64>,
    /// The vector lull offered through the flag at the last entry, when the target saw it
    /// offered (the flag went from 0 to 1).
    offered: Option<u8>,
    /// What the target delivered to it and the guest ended, and the TPR the guest wrote.
    model: model::Priority,
    /// When its last entry ended (what the chip charges the CPU quota from).
    entered: u64,
}

/// The VM: the chip, its vCPUs, the limits the LAPICs were built with.
struct Machine {
    fake: FakeChip,
    vcpus: Vec<Vcpu>,
    model: ModelKind,
    start: u64,
    tsc_khz: u64,
    guest_tsc: u64,
    limits: TimerLimits,
    /// The target's copy of the chip's idle injector (window arithmetic only).
    inject: Option<IdleInjector>,
    /// The target's copy of the chip's CPU quota, charged as the chip charges its own.
    quota: Option<CpuQuota>,
}

/// A 4-byte guest write of xAPIC register `offset`.
fn xapic_write(offset: u32, value: u32) -> GuestAction {
    GuestAction::MmioWrite {
        offset: input::Offset::Page(u16::try_from(offset).unwrap_or(0)),
        len: 4,
        value: input::Value::Raw(value),
    }
}

fn lapic_of(v: &Vcpu) -> Lapic<Arc<LapicNoise>> {
    // Reads go to a copy: looking must not change what is looked at.
    v.irq.lapic().clone()
}

impl Machine {
    fn new(u: &mut Unstructured<'_>, idle: bool) -> arbitrary::Result<Option<Self>> {
        let cpus = u.int_in_range(2u32..=4)?;
        let model = match u.int_in_range(0u8..=2)? {
            0 => ModelKind::Pull,
            1 => ModelKind::Push,
            _ => ModelKind::Central,
        };
        let tsc_khz = u.int_in_range(1u32..=10_000_000)?;
        let guest_tsc = u.arbitrary()?;
        let start = match u.int_in_range(0u8..=2)? {
            0 => 0,
            1 => u.int_in_range(0u64..=1 << 50)?,
            _ => MAX_NOW - u64::from(u.arbitrary::<u32>()?),
        };
        let pv_eoi = u.arbitrary()?;
        let pv_deadline = u.arbitrary()?;
        let spec = ChipSpec {
            cpus,
            model,
            tsc_khz,
            guest_tsc,
            start,
            pv_eoi,
            pv_deadline,
        };
        let idle = if idle { Some(idle::spec(u)?) } else { None };
        let Some(fake) = FakeChip::with_idle(spec, idle) else {
            return Ok(None);
        };
        let inject = idle
            .and_then(|s| s.idle_inject)
            .map(|c| IdleInjector::new(c, usize::try_from(cpus).unwrap_or(0)));
        // The chip's quota epoch: its clock's 0 on CLOCK_MONOTONIC, which is 0 here.
        let quota = idle.and_then(|s| s.cpu_quota).map(|c| CpuQuota::new(c, 0));
        let mut vcpus = Vec::new();
        for id in 0..cpus {
            let irq = fake
                .chip
                .user_vcpu(id, &fake.shared)
                .unwrap_or_else(|e| panic!("vCPU {id}: {e}"));
            let mut port = crate::chip::fake_port();
            let mut irq = irq;
            irq.attach(&mut port);
            vcpus.push(Vcpu {
                irq,
                port,
                place: Place::Out,
                expected: Vec::new(),
                expected_nmis: 0,
                writes: 0,
                pv_flag: None,
                pv_slot: None,
                offered: None,
                model: model::Priority::default(),
                entered: 0,
            });
        }
        let mut machine = Machine {
            fake,
            vcpus,
            model,
            start,
            tsc_khz: u64::from(tsc_khz),
            guest_tsc,
            limits: TimerLimits::default(),
            inject,
            quota,
        };
        // Most inputs start where a booted guest is: every LAPIC software-enabled, some with a
        // flat logical ID (as Linux sets them up), through the same exits.
        let booted: u8 = u.arbitrary()?;
        for i in 0..machine.vcpus.len() {
            if booted & 1 == 0 {
                machine.enter(i, false);
                machine.exit(i, xapic_write(regs::SVR, 0x1ff));
                if booted & 2 == 0 {
                    machine.enter(i, false);
                    machine.exit(i, xapic_write(regs::DFR, 0xffff_ffff));
                    machine.enter(i, false);
                    machine.exit(i, xapic_write(regs::LDR, 1 << (24 + i)));
                }
            }
        }
        Ok(Some(machine))
    }

    fn now(&self) -> u64 {
        self.fake.clock.now()
    }

    /// The guest's TSC now, roughly (an input shape, not an oracle).
    fn tsc_now(&self) -> u64 {
        let ns = u128::from(self.now() - self.start);
        let ticks = ns * u128::from(self.tsc_khz) / 1_000_000;
        self.guest_tsc
            .wrapping_add(u64::try_from(ticks).unwrap_or(u64::MAX))
    }

    fn index(&self, cpu: u8) -> usize {
        usize::from(cpu) % self.vcpus.len()
    }

    /// Whether vCPU `i`'s PV flag is its own (a flag two vCPUs share is the guest's mess).
    fn pv_flag_alone(&self, i: usize) -> Option<u64> {
        let flag = self.vcpus[i].pv_flag?;
        let shared = self
            .vcpus
            .iter()
            .enumerate()
            .any(|(j, v)| j != i && v.pv_flag == Some(flag));
        (!shared).then_some(flag)
    }

    /// Whether vCPU `i`'s PV deadline slot is its own: no other vCPU's slot and no PV EOI
    /// flag (which lull writes) within its 8 bytes.
    fn pv_slot_alone(&self, i: usize) -> Option<u64> {
        let slot = self.vcpus[i].pv_slot?;
        let overlaps = |a: u64| a.abs_diff(slot) < 8;
        let shared = self.vcpus.iter().enumerate().any(|(j, v)| {
            v.pv_flag.is_some_and(overlaps) || (j != i && v.pv_slot.is_some_and(overlaps))
        });
        (!shared).then_some(slot)
    }

    /// A counter of vCPU `id` (0 if it has none).
    fn counter(&self, id: u32, which: impl Fn(&VcpuCounters) -> &AtomicU64) -> u64 {
        self.fake
            .shared
            .counters(id)
            .map_or(0, |c| which(c).load(Ordering::Relaxed))
    }

    fn flag_byte(&self, flag: u64) -> u8 {
        self.fake
            .mem
            .read_obj::<u8>(GuestAddress(flag))
            .unwrap_or_else(|e| panic!("PV flag {flag:#x} accepted outside RAM: {e}"))
    }

    fn step(&mut self, op: Op) {
        self.fake.fuzz_clock.settle();
        match op {
            Op::Enter { cpu, open } => {
                let i = self.index(cpu);
                self.enter(i, open);
            }
            Op::Exit { cpu, action } => {
                let i = self.index(cpu);
                if self.vcpus[i].place != Place::InGuest {
                    self.enter(i, true);
                }
                if self.vcpus[i].place == Place::InGuest {
                    self.exit(i, action);
                }
            }
            Op::Advance(delay) => {
                let to = self.now().saturating_add(delay.get()).min(MAX_NOW);
                self.fake.clock.set(to);
                self.timer_thread(false);
            }
            Op::TimerThread => self.timer_thread(true),
            Op::Edge(pin) => {
                let trigger = self
                    .fake
                    .chip
                    .edge_irq(u32::from(pin))
                    .unwrap_or_else(|e| panic!("edge trigger for pin {pin}: {e}"));
                let _ = devices::serial::Trigger::trigger(&trigger);
            }
            Op::Line { pin, asserted } => {
                self.fake
                    .chip
                    .irq_lines()
                    .set_level(u32::from(pin), asserted);
            }
        }
    }

    /// The `central` model's thread: wakes at its timerfd's deadline (or spuriously).
    fn timer_thread(&mut self, spurious: bool) {
        let Some(central) = &self.fake.central else {
            return;
        };
        let now = self.now();
        if spurious || central.deadline() <= now {
            if central.deadline() <= now {
                // The one-shot timerfd fired: the host disarmed it (lull does not disarm it
                // again when nothing is left to arm).
                central.expire();
            }
            self.fake.chip.service_timers();
            let next = central.deadline();
            assert!(
                next > now,
                "timer thread re-armed at {next}, not after now {now}: it would spin"
            );
        }
    }

    /// vCPU `i`'s thread goes to enter the guest: `before_entry`, or the SIPI wait.
    fn enter(&mut self, i: usize, open: bool) {
        match self.vcpus[i].place {
            Place::InGuest => return,
            Place::WaitingForSipi => {
                // A wake-up in the wait for SIPI services the mailbox, as before_entry does.
                let v = &mut self.vcpus[i];
                let entry = v.irq.before_entry(&mut v.port);
                assert_eq!(entry, Entry::WaitForSipi, "vCPU {i} left INIT without SIPI");
                v.expected.clear();
                v.expected_nmis = 0;
                let InitSipiState::SipiReceived(vector) = v.irq.lapic().init_sipi_state() else {
                    return;
                };
                // The SIPI is there: the wait returns at once.
                assert_eq!(v.irq.wait_for_sipi(&mut v.port), Some(vector));
                assert_eq!(v.irq.lapic().init_sipi_state(), InitSipiState::Running);
                v.place = Place::Out;
            }
            Place::Out => {}
        }
        self.skip_holds();
        let id = u32::try_from(i).unwrap_or(0);
        let held = |m: &Machine| {
            m.counter(id, |c| &c.injected_idle_ns) + m.counter(id, |c| &c.throttled_ns)
        };
        let held_before = held(self);
        let now = self.now();
        let flag = self.pv_flag_alone(i);
        let flag_before = flag.map(|f| self.flag_byte(f));
        let v = &mut self.vcpus[i];
        let counters = self.fake.shared.counters(u32::try_from(i).unwrap_or(0));
        let fires = || counters.map_or(0, |c| c.lapic_timer_fires.load(Ordering::Relaxed));
        let fires_before = fires();
        let mut before = lapic_of(v);
        let deadline_before = before.timer_deadline();
        let lvt = read_reg(&mut before, regs::LVT_TIMER);
        let software_enabled = before.destination_info().software_enabled;
        let nmis_before = v.port.nmis;
        v.port.open = open;
        v.port.injected.clear();
        let entry = v.irq.before_entry(&mut v.port);
        match entry {
            Entry::Stop => panic!("vCPU {i}: before_entry stopped a VM nobody stopped"),
            Entry::WaitForSipi => {
                assert!(v.port.injected.is_empty(), "vCPU {i}: injected in INIT");
                // An INIT reset the LAPIC (or the AP never started).
                v.model.reset();
                v.place = Place::WaitingForSipi;
                v.expected.clear();
                v.expected_nmis = 0;
                return;
            }
            Entry::Enter => v.place = Place::InGuest,
        }
        let entered = self.fake.clock.now();
        v.entered = entered;
        let after_now = entered;
        let mut after = lapic_of(v);
        check::entry(i, &*v, &mut after, now);
        v.model.in_service.extend(v.port.injected.iter().copied());
        let deadline = after.timer_deadline();
        assert!(
            deadline.is_none_or(|d| d > after_now),
            "vCPU {i}: entered the guest with its timer due ({deadline:?} <= now {after_now})"
        );
        // Nothing early: a deadline the clock had not reached when the vCPU entered is still
        // armed, untouched (a fire consumes a one-shot deadline or moves a periodic one).
        if let Some(d) = deadline_before.filter(|&d| d > after_now) {
            assert_eq!(
                deadline,
                Some(d),
                "vCPU {i}: timer deadline {d} taken before it came (entered at {after_now})"
            );
        }
        if let (Some(due), Some(next)) = (deadline_before.filter(|&d| d <= after_now), deadline) {
            assert!(
                next - due >= self.limits.min_period_ns,
                "vCPU {i}: periodic step {} below the {} ns clamp",
                next - due,
                self.limits.min_period_ns
            );
        }
        if fires() > fires_before && software_enabled {
            if let Some(lvt) = lvt.filter(|l| l & regs::LVT_MASKED == 0) {
                let vector = regs::low_byte(lvt);
                if vector >= 16 {
                    assert!(
                        check::pending_or_in_service(&mut after, vector),
                        "vCPU {i}: timer fired unmasked but vector {vector:#x} is nowhere"
                    );
                }
            }
        }
        let expected = std::mem::take(&mut v.expected);
        for vector in expected {
            assert!(
                check::pending_or_in_service(&mut after, vector),
                "vCPU {i}: IPI vector {vector:#x} sent to it was lost"
            );
        }
        if std::mem::take(&mut v.expected_nmis) > 0 {
            assert!(
                v.port.nmis > nmis_before,
                "vCPU {i}: NMI sent to it not injected"
            );
        }
        v.offered = None;
        if let (Some(f), Some(0)) = (flag, flag_before) {
            if self.flag_byte(f) == 1 {
                let v = &mut self.vcpus[i];
                v.offered = Some(check::pv_offer_allowed(i, &mut after));
            }
        }
        assert_eq!(
            held(self),
            held_before,
            "vCPU {i}: held by the idle manager where the target foresaw no hold"
        );
    }

    /// vCPU `i` (in the guest) exits with what its guest did.
    fn exit(&mut self, i: usize, action: GuestAction) {
        if let GuestAction::Ipi(IpiSpec { destination, .. }) = action {
            if self.vcpus[i].irq.lapic().mode() == ApicMode::XApic {
                // An xAPIC guest writes the destination (ICR2) first: an exit of its own.
                self.exit(i, xapic_write(regs::ICR_HIGH, destination << 24));
                self.enter(i, false);
                if self.vcpus[i].place != Place::InGuest {
                    return;
                }
            }
        }
        let now = self.now();
        let id = u32::try_from(i).unwrap_or(0);
        let flag = self.pv_flag_alone(i);
        let mut lapic = lapic_of(&self.vcpus[i]);
        let deadline_before = lapic.timer_deadline();
        let base = lapic.base_address();
        let mode = lapic.mode();
        let offered = self.vcpus[i].offered.take();
        // The guest's EOI: through the PV flag when lull set it (no exit of its own).
        let mut pv_eoi = None;
        let mut eoi_register = false;
        if let GuestAction::Eoi = action {
            match (flag, offered) {
                (Some(f), Some(vector)) if self.flag_byte(f) == 1 => {
                    self.write_flag(f, 0);
                    pv_eoi = Some(vector);
                }
                _ => eoi_register = mode != ApicMode::Disabled,
            }
        }
        let pv_eois = |m: &Machine| m.counter(id, |c| &c.pv_eois);
        let pv_eois_before = pv_eois(self);
        let pv_deadlines = |m: &Machine| m.counter(id, |c| &c.pv_deadlines);
        let pv_deadlines_before = pv_deadlines(self);
        // The guest's store to its PV deadline slot, taken by the exit's `after_run`.
        let mut stored = None;
        if let (GuestAction::StoreDeadline(value), Some(slot)) = (action, self.vcpus[i].pv_slot) {
            let tsc = value.get(self.tsc_now());
            self.fake
                .mem
                .write_obj(tsc, GuestAddress(slot))
                .unwrap_or_else(|e| panic!("PV slot {slot:#x} accepted outside RAM: {e}"));
            self.vcpus[i].writes += 1;
            stored = self.pv_slot_alone(i).map(|slot| (slot, tsc));
        }
        let cr8 = self.vcpus[i].port.cr8;
        if let Some(quota) = &self.quota {
            // What the chip charges in `after_run`: the time since the entry.
            quota.charge(now, now.saturating_sub(self.vcpus[i].entered));
        }
        self.vcpus[i].irq.after_run(Some(cr8));
        if let Some((slot, tsc)) = stored {
            let left: u64 = self.fake.mem.read_obj(GuestAddress(slot)).unwrap_or(0);
            assert_eq!(left, 0, "vCPU {i}: PV deadline slot not taken");
            let taken = pv_deadlines(self) - pv_deadlines_before;
            assert_eq!(taken, u64::from(tsc != 0), "vCPU {i}: PV deadlines taken");
        }
        // Every EOI by flag lull took ended the highest in-service interrupt.
        for _ in pv_eois_before..pv_eois(self) {
            self.vcpus[i].model.eoi();
        }
        if let Some(vector) = pv_eoi {
            let isr = read_bitmap(&mut lapic_of(&self.vcpus[i]), regs::ISR0);
            assert!(
                isr.is_none_or(|isr| !check::contains(&isr, vector)),
                "vCPU {i}: PV EOI of {vector:#x} did not retire it"
            );
            assert_eq!(
                pv_eois(self),
                pv_eois_before + 1,
                "vCPU {i}: PV EOI not counted"
            );
        } else if let (Some(f), Some(_)) = (flag, offered) {
            assert_eq!(self.flag_byte(f), 0, "vCPU {i}: PV flag not taken back");
        }
        // What the EOI register must retire (read after `after_run`, which may EOI by flag).
        let isr_before = read_bitmap(&mut lapic_of(&self.vcpus[i]), regs::ISR0);
        let tsc_now = self.tsc_now();
        match action {
            GuestAction::MmioWrite { offset, len, value } => {
                let mut data = [0u8; 8];
                data[..4].copy_from_slice(&value.get().to_le_bytes());
                let addr = base.wrapping_add(offset.get());
                self.vcpus[i].writes += 1;
                self.run_exit(i, VcpuExit::MmioWrite(addr, &data[..usize::from(len % 9)]));
                // An aligned 4-byte write inside the page is a register write (SDM 11.4.1).
                let off = offset.get();
                if mode == ApicMode::XApic && len % 9 == 4 && off % 16 == 0 && off < 0x1000 {
                    let model = &mut self.vcpus[i].model;
                    match u32::try_from(off).unwrap_or(u32::MAX) {
                        regs::TPR => model.tpr = data[0],
                        regs::EOI => model.eoi(),
                        _ => {}
                    }
                }
            }
            GuestAction::MmioRead { offset, len } => {
                let mut data = [0u8; 8];
                let addr = base.wrapping_add(offset.get());
                self.run_exit(
                    i,
                    VcpuExit::MmioRead(addr, &mut data[..usize::from(len % 9)]),
                );
            }
            GuestAction::IoapicWrite { offset, len, value } => {
                let mut data = [0u8; 8];
                data[..4].copy_from_slice(&value.get().to_le_bytes());
                let addr = IOAPIC_ADDR + u64::from(offset);
                self.run_exit(i, VcpuExit::MmioWrite(addr, &data[..usize::from(len % 9)]));
            }
            GuestAction::IoapicRead { offset, len } => {
                let mut data = [0u8; 8];
                let addr = IOAPIC_ADDR + u64::from(offset);
                self.run_exit(
                    i,
                    VcpuExit::MmioRead(addr, &mut data[..usize::from(len % 9)]),
                );
            }
            GuestAction::MsrWrite { msr, value } => {
                let (index, data) = (msr.get(), value.get(tsc_now));
                self.vcpus[i].writes += 1;
                let accepted = self.wrmsr(i, index, data);
                let model = &mut self.vcpus[i].model;
                if accepted && mode == ApicMode::X2Apic {
                    match index {
                        0x808 => model.tpr = data.to_le_bytes()[0],
                        0x80B => model.eoi(),
                        _ => {}
                    }
                }
                if mode != ApicMode::Disabled
                    && self.vcpus[i].irq.lapic().mode() == ApicMode::Disabled
                {
                    // A global disable resets the LAPIC (SDM 11.4.3).
                    self.vcpus[i].model.reset();
                }
                if accepted {
                    let enabled = (data & 1 == 1).then_some(data & !1);
                    match index {
                        MSR_KVM_PV_EOI_EN => self.vcpus[i].pv_flag = enabled,
                        MSR_LULL_PV_DEADLINE => self.vcpus[i].pv_slot = enabled,
                        _ => {}
                    }
                }
            }
            GuestAction::MsrRead { msr } => {
                let (mut error, mut data) = (0u8, 0u64);
                let exit = VcpuExit::X86Rdmsr(ReadMsrExit {
                    error: &mut error,
                    reason: MsrExitReason::Filter,
                    index: msr.get(),
                    data: &mut data,
                });
                self.run_exit(i, exit);
            }
            GuestAction::Ipi(spec) => self.send_ipi(i, &mut lapic, spec),
            GuestAction::Eoi if eoi_register => {
                self.vcpus[i].writes += 1;
                self.vcpus[i].model.eoi();
                if mode == ApicMode::X2Apic {
                    self.wrmsr(i, regs::X2APIC_MSR_FIRST + (regs::EOI >> 4), 0);
                } else {
                    let addr = base + u64::from(regs::EOI);
                    self.run_exit(i, VcpuExit::MmioWrite(addr, &[0; 4]));
                }
                let isr = read_bitmap(&mut lapic_of(&self.vcpus[i]), regs::ISR0);
                if let (Some(mut want), Some(got)) = (isr_before, isr) {
                    if let Some(top) = highest(&want) {
                        want[usize::from(top >> 5)] &= !(1 << (top & 31));
                    }
                    assert_eq!(
                        got, want,
                        "vCPU {i}: EOI did not retire exactly the highest in-service vector"
                    );
                }
            }
            GuestAction::Window => self.run_exit(i, VcpuExit::IrqWindowOpen),
            GuestAction::Eoi | GuestAction::Interrupted | GuestAction::StoreDeadline(_) => {
                let v = &mut self.vcpus[i];
                v.irq.exit_done(&mut v.port);
            }
        }
        let v = &mut self.vcpus[i];
        v.place = Place::Out;
        let deadline = v.irq.lapic().timer_deadline();
        if let Some(d) = deadline.filter(|_| deadline != deadline_before) {
            let floor = now.saturating_add(self.limits.min_delay_ns);
            assert!(
                d >= floor,
                "vCPU {i}: deadline {d} below now {now} + min delay"
            );
        }
    }

    fn write_flag(&self, flag: u64, value: u8) {
        self.fake
            .mem
            .write_obj(value, GuestAddress(flag))
            .unwrap_or_else(|e| panic!("PV flag {flag:#x}: {e}"));
    }

    /// WRMSR through the exit path; true if it did not fault.
    fn wrmsr(&mut self, i: usize, index: u32, data: u64) -> bool {
        let mut error = 0u8;
        let exit = VcpuExit::X86Wrmsr(WriteMsrExit {
            error: &mut error,
            reason: MsrExitReason::Filter,
            index,
            data,
        });
        self.run_exit(i, exit);
        error == 0
    }

    /// One exit as `vmm::vcpu::run` handles it: the chip first, then the generic handler.
    fn run_exit(&mut self, i: usize, exit: VcpuExit<'_>) {
        let v = &mut self.vcpus[i];
        match v.irq.handle_exit(exit) {
            Ok(ChipExit::Continue) => {}
            Ok(ChipExit::Stop(reason)) => panic!("vCPU {i}: the irqchip stopped the VM: {reason}"),
            Err(exit) => {
                let id = u32::try_from(i).unwrap_or(0);
                let Some(counters) = self.fake.shared.counters(id) else {
                    panic!("no counters for vCPU {i}");
                };
                let ctx = self.fake.buses.exit_context(id, counters);
                let action = vmm::vcpu::exit::handle_exit(exit, &ctx);
                assert_eq!(
                    action,
                    VcpuAction::Continue,
                    "vCPU {i}: MMIO stopped the VM"
                );
            }
        }
        v.irq.exit_done(&mut v.port);
    }

    /// A fixed (or NMI) edge IPI through the ICR of the sender's mode, with the delivery the
    /// target expects of it.
    fn send_ipi(&mut self, i: usize, lapic: &mut Lapic<Arc<LapicNoise>>, spec: IpiSpec) {
        let IpiSpec {
            vector,
            destination,
            logical,
            shorthand,
            nmi,
        } = spec;
        let mode = lapic.mode();
        let delivery: u32 = if nmi { 4 } else { 0 };
        let low = u32::from(vector)
            | (delivery << 8)
            | (u32::from(logical) << 11)
            | (1 << 14)
            | (u32::from(shorthand & 3) << 18);
        let destination = match mode {
            ApicMode::Disabled => {
                let v = &mut self.vcpus[i];
                v.irq.exit_done(&mut v.port);
                return;
            }
            ApicMode::XApic => read_reg(lapic, regs::ICR_HIGH).unwrap_or(0) >> 24,
            ApicMode::X2Apic => destination,
        };
        let ipi = Ipi {
            delivery_mode: if nmi {
                DeliveryMode::Nmi
            } else {
                DeliveryMode::Fixed
            },
            vector,
            destination,
            destination_mode: if logical {
                DestinationMode::Logical
            } else {
                DestinationMode::Physical
            },
            shorthand: match shorthand & 3 {
                0 => Shorthand::None,
                1 => Shorthand::SelfOnly,
                2 => Shorthand::AllIncludingSelf,
                _ => Shorthand::AllExcludingSelf,
            },
            assert: true,
            trigger_mode: TriggerMode::Edge,
            x2apic_format: mode == ApicMode::X2Apic,
            source_apic_id: Some(lapic.apic_id()),
        };
        let msg = oracle::Message {
            shorthand,
            logical,
            destination,
            x2apic: mode == ApicMode::X2Apic,
        };
        let addressing: Vec<_> = self
            .vcpus
            .iter()
            .map(|v| oracle::addressing(&mut lapic_of(v)))
            .collect();
        let verdicts: Vec<_> = (0..self.vcpus.len())
            .map(|j| oracle::accepts(&msg, addressing[j].as_ref(), j == i))
            .collect();
        let infos: Vec<_> = self
            .vcpus
            .iter()
            .map(|v| v.irq.lapic().destination_info())
            .collect();
        oracle::check_route(&ipi, &infos, &verdicts, &addressing);
        let sender_enabled = addressing[i].is_some_and(|a| a.software_enabled);
        for (t, verdict) in verdicts.iter().enumerate() {
            if *verdict != oracle::Verdict::Yes || !sender_enabled {
                continue;
            }
            if nmi {
                self.vcpus[t].expected_nmis += 1;
            } else if vector >= 16 && addressing[t].is_some_and(|a| a.software_enabled) {
                self.vcpus[t].expected.push(vector);
            }
        }
        self.vcpus[i].writes += 1;
        if mode == ApicMode::X2Apic {
            let value = (u64::from(destination) << 32) | u64::from(low);
            self.wrmsr(i, regs::X2APIC_MSR_FIRST + (regs::ICR_LOW >> 4), value);
        } else {
            let addr = lapic.base_address() + u64::from(regs::ICR_LOW);
            self.run_exit(i, VcpuExit::MmioWrite(addr, &low.to_le_bytes()));
        }
    }

    fn check(&mut self) {
        let now = self.now();
        let elapsed = now - self.start;
        for i in 0..self.vcpus.len() {
            let v = &self.vcpus[i];
            let mut lapic = lapic_of(v);
            check::registers(i, &mut lapic, v.port.apic_base, &v.model);
            let fires = self
                .fake
                .shared
                .counters(u32::try_from(i).unwrap_or(0))
                .map_or(0, |c| c.lapic_timer_fires.load(Ordering::Relaxed));
            assert!(
                fires <= v.writes + elapsed / self.limits.min_period_ns,
                "vCPU {i}: {fires} timer fires from {} LAPIC writes in {elapsed} ns exceed the clamp",
                v.writes
            );
            if v.place != Place::InGuest {
                continue;
            }
            let Some(deadline) = lapic.timer_deadline() else {
                continue;
            };
            let (host, what) = match (self.model, &self.fake.central) {
                (ModelKind::Central, Some(c)) if deadline > now => (c.deadline(), "timer thread"),
                (ModelKind::Central, _) => continue,
                _ => (self.fake.ticks[i].deadline(), "host tick"),
            };
            assert!(
                host <= deadline,
                "vCPU {i} in the guest: lost timer: LAPIC deadline {deadline}, {what} at {host}"
            );
        }
    }
}

/// Runs one input: a VM configuration, then steps until the bytes run out.
pub fn run(data: &[u8]) {
    run_with(data, false);
}

/// Runs one input on a chip with the idle manager's features on (halt polling, timer advance,
/// idle injection, CPU quota, global timers): the `lapic_idle` target.
pub fn run_idle(data: &[u8]) {
    run_with(data, true);
}

fn run_with(data: &[u8], idle: bool) {
    let mut u = Unstructured::new(data);
    let Ok(Some(mut machine)) = Machine::new(&mut u, idle) else {
        return;
    };
    let trace = std::env::var_os("LULL_FUZZ_TRACE").is_some();
    while let Ok(op) = u.arbitrary::<Op>() {
        if trace {
            eprintln!("{op:?}");
        }
        machine.step(op);
        machine.check();
        if u.is_empty() {
            break;
        }
    }
}
