//! A vCPU of the `lapic` target goes to enter the guest: `before_entry` (or the wait for
//! SIPI), and the checks of every entry.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use devices::lapic::{regs, InitSipiState, Lapic};
use timer::Clock;
use vmm::irqchip::{Entry, VcpuIrq};
use vmm::metrics::LapicNoise;

use super::check::{self, read_reg};
use super::machine::Machine;
use super::vcpu::{lapic_of, Place};

/// What the target read of a vCPU before its `before_entry`, to check the entry against.
struct BeforeEntry {
    now: u64,
    /// Time the idle manager held it so far (injected idle and throttling), ns.
    held: u64,
    /// Its PV EOI flag, if it is its own, and the flag's byte.
    flag: Option<u64>,
    flag_byte: Option<u8>,
    /// Its LAPIC timer fires so far.
    fires: u64,
    deadline: Option<u64>,
    lvt: Option<u32>,
    software_enabled: bool,
    nmis: u64,
}

impl Machine {
    /// vCPU `i`'s thread goes to enter the guest: `before_entry`, or the SIPI wait.
    pub(super) fn enter(&mut self, i: usize, open: bool) {
        if !self.leave_sipi_wait(i) {
            return;
        }
        self.skip_holds();
        let before = self.read_before_entry(i);
        if !self.run_before_entry(i, open) {
            return;
        }
        let entered = self.fake.clock.now();
        let v = &mut self.vcpus[i];
        v.entered = entered;
        let after_now = entered;
        let mut after = lapic_of(v);
        check::entry(i, &*v, &mut after, before.now);
        v.model.in_service.extend(v.port.injected.iter().copied());
        self.check_timer_at_entry(i, &before, &mut after, after_now);
        self.check_ipis_at_entry(i, &before, &mut after);
        self.note_pv_offer(i, &before, &mut after);
        assert_eq!(
            self.held(i),
            before.held,
            "vCPU {i}: held by the idle manager where the target foresaw no hold"
        );
    }

    /// Whether vCPU `i`'s thread goes on to `before_entry`: not if it is in the guest, nor if
    /// it waits for a SIPI that has not come (a wake-up in that wait services the mailbox).
    fn leave_sipi_wait(&mut self, i: usize) -> bool {
        match self.vcpus[i].place {
            Place::InGuest => false,
            Place::WaitingForSipi => {
                // A wake-up in the wait for SIPI services the mailbox, as before_entry does.
                let v = &mut self.vcpus[i];
                let entry = v.irq.before_entry(&mut v.port);
                assert_eq!(entry, Entry::WaitForSipi, "vCPU {i} left INIT without SIPI");
                v.expected.clear();
                v.expected_nmis = 0;
                let InitSipiState::SipiReceived(vector) = v.irq.lapic().init_sipi_state() else {
                    return false;
                };
                // The SIPI is there: the wait returns at once.
                assert_eq!(v.irq.wait_for_sipi(&mut v.port), Some(vector));
                assert_eq!(v.irq.lapic().init_sipi_state(), InitSipiState::Running);
                v.place = Place::Out;
                true
            }
            Place::Out => true,
        }
    }

    /// Time vCPU `i` was held by the idle manager so far (injected idle and throttling), ns.
    fn held(&self, i: usize) -> u64 {
        let id = u32::try_from(i).unwrap_or(0);
        self.counter(id, |c| &c.injected_idle_ns) + self.counter(id, |c| &c.throttled_ns)
    }

    /// vCPU `i`'s LAPIC timer fires so far.
    fn timer_fires(&self, i: usize) -> u64 {
        let counters = self.fake.shared.counters(u32::try_from(i).unwrap_or(0));
        counters.map_or(0, |c| c.lapic_timer_fires.load(Ordering::Relaxed))
    }

    fn read_before_entry(&self, i: usize) -> BeforeEntry {
        let held = self.held(i);
        let now = self.now();
        let flag = self.pv_flag_alone(i);
        let flag_byte = flag.map(|f| self.flag_byte(f));
        let fires = self.timer_fires(i);
        let v = &self.vcpus[i];
        let mut lapic = lapic_of(v);
        BeforeEntry {
            now,
            held,
            flag,
            flag_byte,
            fires,
            deadline: lapic.timer_deadline(),
            lvt: read_reg(&mut lapic, regs::LVT_TIMER),
            software_enabled: lapic.destination_info().software_enabled,
            nmis: v.port.nmis,
        }
    }

    /// `before_entry` with the interrupt window `open` (or closed): true if the vCPU entered
    /// the guest, false if an INIT put it in the wait for SIPI.
    fn run_before_entry(&mut self, i: usize, open: bool) -> bool {
        let v = &mut self.vcpus[i];
        v.port.open = open;
        v.port.injected.clear();
        match v.irq.before_entry(&mut v.port) {
            Entry::Stop => panic!("vCPU {i}: before_entry stopped a VM nobody stopped"),
            Entry::WaitForSipi => {
                assert!(v.port.injected.is_empty(), "vCPU {i}: injected in INIT");
                // An INIT reset the LAPIC (or the AP never started).
                v.model.reset();
                v.place = Place::WaitingForSipi;
                v.expected.clear();
                v.expected_nmis = 0;
                false
            }
            Entry::Enter => {
                v.place = Place::InGuest;
                true
            }
        }
    }

    /// At an entry at `after_now`: no timer due, nothing early, the periodic clamp held, and
    /// an unmasked fire left its vector in IRR or ISR.
    fn check_timer_at_entry(
        &self,
        i: usize,
        before: &BeforeEntry,
        after: &mut Lapic<Arc<LapicNoise>>,
        after_now: u64,
    ) {
        let deadline = after.timer_deadline();
        assert!(
            deadline.is_none_or(|d| d > after_now),
            "vCPU {i}: entered the guest with its timer due ({deadline:?} <= now {after_now})"
        );
        // Nothing early: a deadline the clock had not reached when the vCPU entered is still
        // armed, untouched (a fire consumes a one-shot deadline or moves a periodic one).
        if let Some(d) = before.deadline.filter(|&d| d > after_now) {
            assert_eq!(
                deadline,
                Some(d),
                "vCPU {i}: timer deadline {d} taken before it came (entered at {after_now})"
            );
        }
        if let (Some(due), Some(next)) = (before.deadline.filter(|&d| d <= after_now), deadline) {
            assert!(
                next - due >= self.limits.min_period_ns,
                "vCPU {i}: periodic step {} below the {} ns clamp",
                next - due,
                self.limits.min_period_ns
            );
        }
        if self.timer_fires(i) > before.fires && before.software_enabled {
            if let Some(lvt) = before.lvt.filter(|l| l & regs::LVT_MASKED == 0) {
                let vector = regs::low_byte(lvt);
                if vector >= 16 {
                    assert!(
                        check::pending_or_in_service(after, vector),
                        "vCPU {i}: timer fired unmasked but vector {vector:#x} is nowhere"
                    );
                }
            }
        }
    }

    /// At an entry: every fixed IPI sent to vCPU `i` since its last entry is in its IRR or
    /// ISR, and every NMI was injected.
    fn check_ipis_at_entry(
        &mut self,
        i: usize,
        before: &BeforeEntry,
        after: &mut Lapic<Arc<LapicNoise>>,
    ) {
        let v = &mut self.vcpus[i];
        let expected = std::mem::take(&mut v.expected);
        for vector in expected {
            assert!(
                check::pending_or_in_service(after, vector),
                "vCPU {i}: IPI vector {vector:#x} sent to it was lost"
            );
        }
        if std::mem::take(&mut v.expected_nmis) > 0 {
            assert!(
                v.port.nmis > before.nmis,
                "vCPU {i}: NMI sent to it not injected"
            );
        }
    }

    /// The vector lull offered through vCPU `i`'s PV EOI flag at this entry (the flag went
    /// from 0 to 1), checked to be one it may offer.
    fn note_pv_offer(
        &mut self,
        i: usize,
        before: &BeforeEntry,
        after: &mut Lapic<Arc<LapicNoise>>,
    ) {
        self.vcpus[i].offered = None;
        if let (Some(f), Some(0)) = (before.flag, before.flag_byte) {
            if self.flag_byte(f) == 1 {
                self.vcpus[i].offered = Some(check::pv_offer_allowed(i, after));
            }
        }
    }
}
