//! IOAPIC behaviour and property tests, and the IOAPIC -> LAPIC -> EOI round trip.

use super::*;
use std::cell::Cell;

fn select_write(
    ioapic: &mut IoApic<impl IoApicEvents>,
    reg: u8,
    value: u32,
) -> Option<IoapicInterrupt> {
    let _ = ioapic.write_mmio(IOREGSEL, &[reg]);
    ioapic.write_mmio(IOWIN, &value.to_le_bytes())
}

fn select_read(ioapic: &mut IoApic<impl IoApicEvents>, reg: u8) -> u32 {
    let _ = ioapic.write_mmio(IOREGSEL, &u32::from(reg).to_le_bytes());
    let mut data = [0u8; 4];
    ioapic.read_mmio(IOWIN, &mut data);
    u32::from_le_bytes(data)
}

fn program(ioapic: &mut IoApic, pin: u8, low: u32, dest: u8) -> Option<IoapicInterrupt> {
    let _ = select_write(ioapic, 0x11 + 2 * pin, u32::from(dest) << 24);
    select_write(ioapic, 0x10 + 2 * pin, low)
}

#[test]
fn id_version_arbitration() {
    let mut ioapic = IoApic::new(4);
    assert_eq!(select_read(&mut ioapic, 0), 4 << 24);
    assert_eq!(select_read(&mut ioapic, 1), 0x0017_0011);
    assert_eq!(select_read(&mut ioapic, 2), 4 << 24);
    let _ = select_write(&mut ioapic, 0, 0xFFFF_FFFF);
    assert_eq!(select_read(&mut ioapic, 0), 0x0F00_0000);
    let _ = select_write(&mut ioapic, 1, 0);
    assert_eq!(select_read(&mut ioapic, 1), 0x0017_0011);
    let mut sel = [0u8; 1];
    ioapic.read_mmio(IOREGSEL, &mut sel);
    assert_eq!(sel, [1]);
}

#[test]
fn entries_reset_masked_and_keep_reserved_bits_zero() {
    let mut ioapic = IoApic::new(0);
    for pin in 0..24u8 {
        assert_eq!(select_read(&mut ioapic, 0x10 + 2 * pin), 1 << 16);
        assert_eq!(select_read(&mut ioapic, 0x11 + 2 * pin), 0);
    }
    let _ = select_write(&mut ioapic, 0x10, u32::MAX);
    assert_eq!(select_read(&mut ioapic, 0x10), 0x0001_AFFF);
    let _ = select_write(&mut ioapic, 0x11, u32::MAX);
    assert_eq!(select_read(&mut ioapic, 0x11), 0xFF00_0000);
    // Beyond the last entry: ignored, reads 0.
    assert_eq!(select_read(&mut ioapic, 0x40), 0);
    assert!(select_write(&mut ioapic, 0x40, 1).is_none());
}

#[test]
fn edge_delivers_on_rising_edge_only() {
    let mut ioapic = IoApic::new(0);
    let _ = program(&mut ioapic, 1, 0x0000_0931, 0x03);
    let irq = ioapic.set_irq_line(1, true).unwrap();
    assert_eq!(irq.pin, 1);
    assert_eq!(irq.ipi.vector, 0x31);
    assert_eq!(irq.ipi.destination, 3);
    assert_eq!(irq.ipi.destination_mode, DestinationMode::Logical);
    assert_eq!(irq.ipi.delivery_mode, DeliveryMode::LowestPriority);
    assert_eq!(irq.ipi.trigger_mode, TriggerMode::Edge);
    assert!(ioapic.set_irq_line(1, true).is_none());
    assert!(ioapic.set_irq_line(1, false).is_none());
    assert!(ioapic.set_irq_line(1, true).is_some());
    assert!(!ioapic.redirection_entry(1).unwrap().remote_irr());
}

#[test]
fn level_remote_irr_and_eoi() {
    let mut ioapic = IoApic::new(0);
    let _ = program(&mut ioapic, 9, 0x0000_A041, 0x00);
    let irq = ioapic.set_irq_line(9, true).unwrap();
    assert_eq!(irq.ipi.trigger_mode, TriggerMode::Level);
    assert!(ioapic.redirection_entry(9).unwrap().remote_irr());
    assert_ne!(select_read(&mut ioapic, 0x10 + 18) & (1 << 14), 0);
    assert!(ioapic.set_irq_line(9, true).is_none());
    // Remote IRR is read-only for the guest.
    let _ = select_write(&mut ioapic, 0x10 + 18, 0x0000_A041);
    assert!(ioapic.redirection_entry(9).unwrap().remote_irr());
    // EOI with the line still asserted: delivered again.
    assert_eq!(ioapic.end_of_interrupt(0x41).len(), 1);
    assert!(ioapic.redirection_entry(9).unwrap().remote_irr());
    // Line drops, EOI: nothing more.
    assert!(ioapic.set_irq_line(9, false).is_none());
    assert!(ioapic.end_of_interrupt(0x41).is_empty());
    assert!(!ioapic.redirection_entry(9).unwrap().remote_irr());
    // Another vector's EOI changes nothing.
    assert!(ioapic.set_irq_line(9, true).is_some());
    assert!(ioapic.end_of_interrupt(0x42).is_empty());
    assert!(ioapic.redirection_entry(9).unwrap().remote_irr());
}

#[test]
fn masked_pins_remember_their_line() {
    let mut ioapic = IoApic::new(0);
    // Level pin, masked, asserted: unmasking delivers.
    let _ = program(&mut ioapic, 10, 0x0001_8050, 0x01);
    assert!(ioapic.set_irq_line(10, true).is_none());
    let irq = program(&mut ioapic, 10, 0x0000_8050, 0x01).unwrap();
    assert_eq!((irq.pin, irq.ipi.vector), (10, 0x50));
    // Level pin unmasked after the line dropped: nothing.
    let _ = program(&mut ioapic, 11, 0x0001_8051, 0x01);
    assert!(ioapic.set_irq_line(11, true).is_none());
    assert!(ioapic.set_irq_line(11, false).is_none());
    assert!(program(&mut ioapic, 11, 0x0000_8051, 0x01).is_none());
    // Edge pin: an edge while masked is lost.
    let _ = program(&mut ioapic, 12, 0x0001_0052, 0x01);
    assert!(ioapic.set_irq_line(12, true).is_none());
    assert!(program(&mut ioapic, 12, 0x0000_0052, 0x01).is_none());
    // Masking a level pin in service holds re-delivery at EOI until unmasked.
    let _ = program(&mut ioapic, 10, 0x0001_8050, 0x01);
    assert!(ioapic.end_of_interrupt(0x50).is_empty());
    assert!(program(&mut ioapic, 10, 0x0000_8050, 0x01).is_some());
}

#[test]
fn switching_to_edge_clears_remote_irr() {
    let mut ioapic = IoApic::new(0);
    let _ = program(&mut ioapic, 3, 0x0000_8060, 0);
    assert!(ioapic.set_irq_line(3, true).is_some());
    let _ = program(&mut ioapic, 3, 0x0000_0060, 0);
    assert!(!ioapic.redirection_entry(3).unwrap().remote_irr());
}

#[test]
fn delivery_modes_and_bad_accesses() {
    #[derive(Default)]
    struct Count(Cell<u32>);
    impl IoApicEvents for Count {
        fn invalid_access(&self, _: u64, _: usize) {
            self.0.set(self.0.get() + 1);
        }
        fn invalid_pin(&self, _: usize) {
            self.0.set(self.0.get() + 1);
        }
        fn reserved_delivery_mode(&self, _: usize) {
            self.0.set(self.0.get() + 1);
        }
    }
    let mut ioapic = IoApic::with_events(0, Count::default());
    let _ = select_write(&mut ioapic, 0x10, 0x0000_0400);
    assert_eq!(
        ioapic.set_irq_line(0, true).unwrap().ipi.delivery_mode,
        DeliveryMode::Nmi
    );
    let _ = select_write(&mut ioapic, 0x12, 0x0000_0300);
    assert!(ioapic.set_irq_line(1, true).is_none());
    let _ = select_write(&mut ioapic, 0x14, 0x0000_0600);
    assert!(ioapic.set_irq_line(2, true).is_none());
    assert_eq!(ioapic.events().0.get(), 2);
    assert!(ioapic.set_irq_line(24, true).is_none());
    let _ = ioapic.write_mmio(IOWIN, &[1, 2]);
    let _ = ioapic.write_mmio(0x20, &[0; 4]);
    let mut data = [0xFFu8; 8];
    ioapic.read_mmio(IOWIN, &mut data);
    assert_eq!(data, [0; 8]);
    assert_eq!(ioapic.events().0.get(), 6);
}

#[derive(Debug, Clone)]
enum Op {
    Write(u8, u32),
    Line(usize, bool),
    Eoi(u8),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        (0u8..0x44, prop_oneof![any::<u32>(), (0u32..0x2_0000)]).prop_map(|(r, v)| Op::Write(r, v)),
        (0usize..26, any::<bool>()).prop_map(|(p, l)| Op::Line(p, l)),
        prop_oneof![any::<u8>(), 0x30u8..0x34].prop_map(Op::Eoi),
    ]
}

proptest::proptest! {
    #[test]
    fn no_level_interrupt_is_lost(ops in proptest::collection::vec(op(), 1..300)) {
        let mut ioapic = IoApic::new(1);
        for op in ops {
            let delivered: Vec<IoapicInterrupt> = match op {
                Op::Write(reg, value) => select_write(&mut ioapic, reg, value).into_iter().collect(),
                Op::Line(pin, level) => ioapic.set_irq_line(pin, level).into_iter().collect(),
                Op::Eoi(vector) => ioapic.end_of_interrupt(vector),
            };
            for irq in delivered {
                let entry = ioapic.redirection_entry(irq.pin).unwrap();
                proptest::prop_assert!(!entry.masked());
                proptest::prop_assert_eq!(irq.ipi.vector, entry.vector());
            }
            for pin in 0..IOAPIC_PINS {
                let entry = ioapic.redirection_entry(pin).unwrap();
                let level = entry.trigger_mode() == TriggerMode::Level;
                proptest::prop_assert!(level || !entry.remote_irr());
                if level && ioapic.lines[pin] && !entry.masked() && entry.delivery_mode().is_some() {
                    proptest::prop_assert!(entry.remote_irr(), "pin {} lost its interrupt", pin);
                }
            }
        }
    }
}

/// A level-triggered device interrupt through the whole user-space irqchip: IOAPIC pin ->
/// route -> LAPIC -> injection -> EOI -> IOAPIC remote IRR -> re-delivery while asserted.
#[test]
fn level_interrupt_round_trip_through_lapics() {
    use crate::lapic::{route, Lapic, LapicConfig};

    let mut cpus: Vec<Lapic> = (0..2u32)
        .map(|id| {
            let config = LapicConfig {
                apic_id: id,
                bsp: id == 0,
                ..LapicConfig::default()
            };
            let mut lapic = Lapic::new(config).unwrap();
            let _ = lapic.write_mmio(0xF0, &0x1FFu32.to_le_bytes(), 0);
            lapic
        })
        .collect();
    let mut ioapic = IoApic::new(2);
    // Pin 5: vector 0x45, level, physical destination APIC 1.
    let _ = program(&mut ioapic, 5, 0x0000_8045, 1);
    let irq = ioapic.set_irq_line(5, true).unwrap();
    let info: Vec<_> = cpus.iter().map(Lapic::destination_info).collect();
    let targets: Vec<usize> = route(&irq.ipi, &info).iter().collect();
    assert_eq!(targets, [1]);
    assert!(cpus[1].receive(&irq.ipi));
    assert_eq!(cpus[1].next_interrupt(), Some(0x45));
    cpus[1].interrupt_injected(0x45);
    // The device is still asserted when the guest EOIs: the IOAPIC sends it again.
    let eoi = cpus[1].write_mmio(0xB0, &[0; 4], 0).eoi.unwrap();
    assert!(eoi.level_triggered);
    let again = ioapic.end_of_interrupt(eoi.vector);
    assert_eq!(again.len(), 1);
    assert!(cpus[1].receive(&again[0].ipi));
    cpus[1].interrupt_injected(0x45);
    // The handler quiets the device, then EOIs: remote IRR clears, nothing more.
    assert!(ioapic.set_irq_line(5, false).is_none());
    let eoi = cpus[1].write_mmio(0xB0, &[0; 4], 0).eoi.unwrap();
    assert!(ioapic.end_of_interrupt(eoi.vector).is_empty());
    assert!(!ioapic.redirection_entry(5).unwrap().remote_irr());
    assert_eq!(cpus[1].next_interrupt(), None);
    assert_eq!(cpus[0].next_interrupt(), None);
}

#[test]
fn a_restored_ioapic_behaves_as_the_saved_one() {
    let mut a = IoApic::new(2);
    let write = |ioapic: &mut IoApic, reg: u32, value: u32| {
        let _ = ioapic.write_mmio(0x00, &reg.to_le_bytes());
        ioapic.write_mmio(0x10, &value.to_le_bytes())
    };
    let _ = write(&mut a, 0x10 + 2 * 4, 0x0000_8030); // pin 4: vector 0x30, level
    let _ = write(&mut a, 0x10 + 2 * 5 + 1, 0x0300_0000); // pin 5's destination
    assert!(a.set_irq_line(4, true).is_some()); // remote IRR set, awaiting its EOI
    let _ = a.set_irq_line(7, true);
    let state = a.save();
    let text = serde_json::to_string(&state).unwrap();
    let mut b = IoApic::new(0);
    b.restore(&serde_json::from_str(&text).unwrap()).unwrap();
    assert_eq!(b.save(), state);
    for pin in 0..IOAPIC_PINS {
        assert_eq!(a.redirection_entry(pin), b.redirection_entry(pin));
    }
    // Remote IRR holds the line on both; the EOI delivers it again on both.
    assert!(b.set_irq_line(4, true).is_none());
    assert_eq!(a.end_of_interrupt(0x30), b.end_of_interrupt(0x30));
    let (mut ra, mut rb) = ([0u8; 4], [0u8; 4]);
    a.read_mmio(0x10, &mut ra);
    b.read_mmio(0x10, &mut rb);
    assert_eq!(ra, rb, "IOREGSEL and its register");
}

#[test]
fn corrupt_ioapic_states_are_refused_by_name() {
    let good = IoApic::new(1).save();
    let refused = |change: &dyn Fn(&mut IoApicState)| {
        let mut state = good.clone();
        change(&mut state);
        let mut ioapic = IoApic::new(1);
        let err = ioapic.restore(&state).unwrap_err();
        assert_eq!(ioapic.save(), good, "a refusal changes nothing");
        err
    };
    assert_eq!(refused(&|s| s.id = 16), IoApicStateError::Id(16));
    assert_eq!(
        refused(&|s| {
            s.lines.pop();
        }),
        IoApicStateError::Pins {
            entries: 24,
            lines: 23
        }
    );
    assert_eq!(
        refused(&|s| s.entries[3] = 1 << 40),
        IoApicStateError::Entry {
            pin: 3,
            value: 1 << 40
        }
    );
    // Remote IRR on an edge-triggered pin.
    assert_eq!(
        refused(&|s| s.entries[2] = 1 << 14),
        IoApicStateError::Entry {
            pin: 2,
            value: 1 << 14
        }
    );
}
