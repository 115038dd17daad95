//! The VM of the `lapic` target: the chip and its vCPUs, built from the input, and the steps
//! and checks that are not a vCPU's entry (enter.rs), exit (exit.rs) or IPI (ipi.rs).

use std::sync::atomic::{AtomicU64, Ordering};

use arbitrary::Unstructured;
use devices::lapic::{regs, TimerLimits};
use kvm_ioctls::{MsrExitReason, VcpuExit, WriteMsrExit};
use timer::{Clock, ModelKind};
use vm_memory::{Bytes, GuestAddress};
use vmm::idle::inject::IdleInjector;
use vmm::idle::quota::CpuQuota;
use vmm::irqchip::user::lapic_timer_host::tick_defer::GRACE_NS;
use vmm::irqchip::{ChipExit, IrqChip, VcpuIrq};
use vmm::metrics::VcpuCounters;
use vmm::vcpu::exit::VcpuAction;

use super::input::{self, GuestAction, Op};
use super::vcpu::{lapic_of, Place, Vcpu};
use super::{check, idle, model};
use crate::chip::{ChipSpec, FakeChip};

/// The clock stops here: ~146 years of uptime. Beyond it, deadlines that saturate at
/// `u64::MAX` would look due, which no real run reaches.
pub(super) const MAX_NOW: u64 = 1 << 62;

/// The VM: the chip, its vCPUs, the limits the LAPICs were built with.
pub(super) struct Machine {
    pub(super) fake: FakeChip,
    pub(super) vcpus: Vec<Vcpu>,
    pub(super) model: ModelKind,
    pub(super) start: u64,
    pub(super) tsc_khz: u64,
    pub(super) guest_tsc: u64,
    pub(super) limits: TimerLimits,
    /// The target's copy of the chip's idle injector (window arithmetic only).
    pub(super) inject: Option<IdleInjector>,
    /// The target's copy of the chip's CPU quota, charged as the chip charges its own.
    pub(super) quota: Option<CpuQuota>,
}

/// A 4-byte guest write of xAPIC register `offset`.
pub(super) fn xapic_write(offset: u32, value: u32) -> GuestAction {
    GuestAction::MmioWrite {
        offset: input::Offset::Page(u16::try_from(offset).unwrap_or(0)),
        len: 4,
        value: input::Value::Raw(value),
    }
}

/// The chip an input asks for: 2-4 vCPUs, the timer model, the TSC, where the clock starts,
/// PV EOI and PV deadline on or off.
fn chip_spec(u: &mut Unstructured<'_>) -> arbitrary::Result<ChipSpec> {
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
    Ok(ChipSpec {
        cpus,
        model,
        tsc_khz,
        guest_tsc,
        start,
        pv_eoi,
        pv_deadline,
    })
}

/// vCPU `id` of `fake`: its irqchip half, attached to a new fake port, out of the guest.
fn attached_vcpu(fake: &FakeChip, id: u32) -> Vcpu {
    let irq = fake
        .chip
        .user_vcpu(id, &fake.shared)
        .unwrap_or_else(|e| panic!("vCPU {id}: {e}"));
    let mut port = crate::chip::fake_port();
    let mut irq = irq;
    irq.attach(&mut port);
    Vcpu {
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
    }
}

impl Machine {
    /// The VM an input asks for (`None`: one the chip refuses), its vCPUs started as the
    /// input says; with the idle manager's features if `idle`.
    pub(super) fn new(u: &mut Unstructured<'_>, idle: bool) -> arbitrary::Result<Option<Self>> {
        let spec = chip_spec(u)?;
        let idle = if idle { Some(idle::spec(u)?) } else { None };
        let Some(fake) = FakeChip::with_idle(spec, idle) else {
            return Ok(None);
        };
        let inject = idle
            .and_then(|s| s.idle_inject)
            .map(|c| IdleInjector::new(c, usize::try_from(spec.cpus).unwrap_or(0)));
        // The chip's quota epoch: its clock's 0 on CLOCK_MONOTONIC, which is 0 here.
        let quota = idle.and_then(|s| s.cpu_quota).map(|c| CpuQuota::new(c, 0));
        let vcpus = (0..spec.cpus).map(|id| attached_vcpu(&fake, id)).collect();
        let mut machine = Machine {
            fake,
            vcpus,
            model: spec.model,
            start: spec.start,
            tsc_khz: u64::from(spec.tsc_khz),
            guest_tsc: spec.guest_tsc,
            limits: TimerLimits::default(),
            inject,
            quota,
        };
        let booted: u8 = u.arbitrary()?;
        machine.boot(booted);
        Ok(Some(machine))
    }

    /// Most inputs start where a booted guest is (`booted` bit 0 clear): every LAPIC
    /// software-enabled, some with a flat logical ID (bit 1 clear, as Linux sets them up),
    /// through the same exits.
    fn boot(&mut self, booted: u8) {
        for i in 0..self.vcpus.len() {
            if booted & 1 == 0 {
                self.enter(i, false);
                self.exit(i, xapic_write(regs::SVR, 0x1ff));
                if booted & 2 == 0 {
                    self.enter(i, false);
                    self.exit(i, xapic_write(regs::DFR, 0xffff_ffff));
                    self.enter(i, false);
                    self.exit(i, xapic_write(regs::LDR, 1 << (24 + i)));
                }
            }
        }
    }

    pub(super) fn now(&self) -> u64 {
        self.fake.clock.now()
    }

    /// The guest's TSC now, roughly (an input shape, not an oracle).
    pub(super) fn tsc_now(&self) -> u64 {
        let ns = u128::from(self.now() - self.start);
        let ticks = ns * u128::from(self.tsc_khz) / 1_000_000;
        self.guest_tsc
            .wrapping_add(u64::try_from(ticks).unwrap_or(u64::MAX))
    }

    pub(super) fn index(&self, cpu: u8) -> usize {
        usize::from(cpu) % self.vcpus.len()
    }

    /// Whether vCPU `i`'s PV flag is its own (a flag two vCPUs share is the guest's mess).
    pub(super) fn pv_flag_alone(&self, i: usize) -> Option<u64> {
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
    pub(super) fn pv_slot_alone(&self, i: usize) -> Option<u64> {
        let slot = self.vcpus[i].pv_slot?;
        let overlaps = |a: u64| a.abs_diff(slot) < 8;
        let shared = self.vcpus.iter().enumerate().any(|(j, v)| {
            v.pv_flag.is_some_and(overlaps) || (j != i && v.pv_slot.is_some_and(overlaps))
        });
        (!shared).then_some(slot)
    }

    /// A counter of vCPU `id` (0 if it has none).
    pub(super) fn counter(&self, id: u32, which: impl Fn(&VcpuCounters) -> &AtomicU64) -> u64 {
        self.fake
            .shared
            .counters(id)
            .map_or(0, |c| which(c).load(Ordering::Relaxed))
    }

    pub(super) fn flag_byte(&self, flag: u64) -> u8 {
        self.fake
            .mem
            .read_obj::<u8>(GuestAddress(flag))
            .unwrap_or_else(|e| panic!("PV flag {flag:#x} accepted outside RAM: {e}"))
    }

    pub(super) fn step(&mut self, op: Op) {
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
    pub(super) fn timer_thread(&mut self, spurious: bool) {
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

    /// Moves the clock past an idle-injection window or a throttled quota period that
    /// `before_entry` would hold the vCPU in now: the chip would block in it, on a clock that
    /// does not move while the target waits. The vCPU's thread would wake at the hold's end;
    /// time passes for everyone as if the target's `Advance` went there.
    pub(super) fn skip_holds(&mut self) {
        loop {
            let now = self.now();
            let window = self.inject.as_ref().and_then(|inj| inj.window_end(now));
            let throttled = || self.quota.as_ref()?.throttled_until(now, |t| t);
            let Some(end) = window.or_else(throttled) else {
                return;
            };
            // A hold ends at most a period (20 ms) away: past `MAX_NOW` if need be, still far
            // from the saturated deadlines that limit is for.
            self.fake.clock.set(end);
            self.timer_thread(false);
        }
    }

    pub(super) fn check(&mut self) {
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
            // A deadline armed while the guest could not take interrupts may have its tick
            // deferred past it, by at most the grace, until an entry where it can
            // (`vmm::irqchip::user::lapic_timer_host::tick_defer`).
            let bound = if v.port.open {
                deadline
            } else {
                deadline.saturating_add(GRACE_NS)
            };
            assert!(
                host <= bound,
                "vCPU {i} in the guest: lost timer: LAPIC deadline {deadline}, {what} at {host}"
            );
        }
    }

    pub(super) fn write_flag(&self, flag: u64, value: u8) {
        self.fake
            .mem
            .write_obj(value, GuestAddress(flag))
            .unwrap_or_else(|e| panic!("PV flag {flag:#x}: {e}"));
    }

    /// WRMSR through the exit path; true if it did not fault.
    pub(super) fn wrmsr(&mut self, i: usize, index: u32, data: u64) -> bool {
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
    pub(super) fn run_exit(&mut self, i: usize, exit: VcpuExit<'_>) {
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
}
