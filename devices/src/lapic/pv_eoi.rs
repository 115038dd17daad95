//! KVM's paravirtual EOI (`KVM_FEATURE_PV_EOI`), the LAPIC's half: which in-service interrupt
//! the guest may end by clearing a flag in its own memory instead of writing the EOI register
//! (which costs an exit), and the EOI it signals that way.
//!
//! The VMM offers the flag before an entry and reads it back after the exit (`vmm`'s
//! `irqchip::user::pv_eoi`); the rules for offering it are KVM's
//! (`apic_sync_pv_eoi_to_guest` in `arch/x86/kvm/lapic.c`):
//! - exactly one vector is in service, so the EOI is unambiguous;
//! - nothing waits in the IRR: a pending interrupt must be delivered at the real EOI's
//!   priority drop, which the VMM only sees at the next exit;
//! - the vector is edge-triggered: a level-triggered EOI must reach the IOAPIC at once.

use super::{Eoi, Lapic, LapicEvents};

impl<E: LapicEvents> Lapic<E> {
    /// The in-service vector the guest may end through the PV EOI flag now, if any.
    pub fn pv_eoi_vector(&self) -> Option<u8> {
        if !self.irr.is_empty() {
            return None;
        }
        let vector = self.isr.highest()?;
        let mut others = self.isr;
        others.clear(vector);
        (others.is_empty() && !self.tmr.contains(vector)).then_some(vector)
    }

    /// The guest cleared the PV EOI flag offered for `vector`: the EOI, as a write of the
    /// EOI register. `None` (nothing done) if `vector` is no longer the one in service.
    pub fn pv_eoi(&mut self, vector: u8) -> Option<Eoi> {
        if self.isr.highest() != Some(vector) {
            return None;
        }
        self.end_of_interrupt()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::tests::{lapic, write};
    use super::super::{regs, Ipi, TriggerMode};

    /// A guest action on one LAPIC.
    #[derive(Debug, Clone)]
    enum Step {
        /// An interrupt arrives (edge or level).
        Receive(u8, bool),
        /// The VMM injects the highest pending interrupt.
        Inject,
        /// The guest EOIs: through the flag if it was offered, else the register.
        Eoi,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0x20u8..=0xfe, any::<bool>()).prop_map(|(v, l)| Step::Receive(v, l)),
            Just(Step::Inject),
            Just(Step::Eoi),
        ]
    }

    proptest! {
        /// Ending interrupts through the flag whenever it is offered gives exactly the EOIs
        /// the register would: none lost, none doubled, and every level-triggered one still
        /// comes out of the register path (to reach the IOAPIC).
        #[test]
        fn pv_eois_are_the_eois_the_register_would_give(steps in prop::collection::vec(step(), 1..60)) {
            let mut pv = lapic();
            let mut reg = lapic();
            for l in [&mut pv, &mut reg] {
                let _ = write(l, regs::SVR, 0x1ff, 0);
            }
            for s in steps {
                match s {
                    Step::Receive(v, level) => {
                        let ipi = Ipi {
                            trigger_mode: if level { TriggerMode::Level } else { TriggerMode::Edge },
                            ..Ipi::fixed(v, 0)
                        };
                        prop_assert_eq!(pv.receive(&ipi), reg.receive(&ipi));
                    }
                    Step::Inject => {
                        let next = pv.next_interrupt();
                        prop_assert_eq!(next, reg.next_interrupt());
                        if let Some(v) = next {
                            pv.interrupt_injected(v);
                            reg.interrupt_injected(v);
                        }
                    }
                    Step::Eoi => {
                        let by_register = write(&mut reg, regs::EOI, 0, 0).eoi;
                        let by_pv = match pv.pv_eoi_vector() {
                            Some(v) => {
                                prop_assert!(!by_register.is_some_and(|e| e.level_triggered));
                                pv.pv_eoi(v)
                            }
                            None => write(&mut pv, regs::EOI, 0, 0).eoi,
                        };
                        prop_assert_eq!(by_pv, by_register);
                    }
                }
                prop_assert_eq!(pv.next_interrupt(), reg.next_interrupt());
                prop_assert_eq!(pv.ppr(), reg.ppr());
            }
        }
    }

    #[test]
    fn the_flag_is_offered_only_for_a_lone_edge_interrupt() {
        let mut l = lapic();
        let _ = write(&mut l, regs::SVR, 0x1ff, 0);
        assert_eq!(l.pv_eoi_vector(), None);
        l.receive(&Ipi::fixed(0x40, 0));
        assert_eq!(l.pv_eoi_vector(), None, "pending, not in service");
        l.interrupt_injected(0x40);
        assert_eq!(l.pv_eoi_vector(), Some(0x40));
        l.receive(&Ipi::fixed(0x30, 0));
        assert_eq!(l.pv_eoi_vector(), None, "another interrupt waits");
        assert_eq!(l.pv_eoi(0x30), None, "not in service");
        assert_eq!(l.pv_eoi(0x40).map(|e| e.vector), Some(0x40));
        l.interrupt_injected(0x30);
        let level = Ipi {
            trigger_mode: TriggerMode::Level,
            ..Ipi::fixed(0x50, 0)
        };
        l.receive(&level);
        l.interrupt_injected(0x50);
        assert_eq!(l.pv_eoi_vector(), None, "two in service");
        assert!(write(&mut l, regs::EOI, 0, 0)
            .eoi
            .is_some_and(|e| e.level_triggered));
        assert_eq!(l.pv_eoi_vector(), Some(0x30));
    }
}
