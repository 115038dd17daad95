//! A vCPU of the `lapic` target goes to enter the guest: `before_entry` (or the wait for
//! SIPI), and the checks of every entry.

use std::sync::atomic::Ordering;

use devices::lapic::{regs, InitSipiState};
use timer::Clock;
use vmm::irqchip::{Entry, VcpuIrq};

use super::check::{self, read_reg};
use super::machine::Machine;
use super::vcpu::{lapic_of, Place};

impl Machine {
    /// vCPU `i`'s thread goes to enter the guest: `before_entry`, or the SIPI wait.
    pub(super) fn enter(&mut self, i: usize, open: bool) {
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
}
