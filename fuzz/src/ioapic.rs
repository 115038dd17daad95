//! The `ioapic` target: arbitrary IOREGSEL/IOWIN accesses (any offset and width), device line
//! changes on any pin number and EOIs of any vector.
//!
//! After every step:
//! - no redirection entry holds a bit outside the writable set plus remote IRR, and an
//!   edge-triggered entry never holds remote IRR;
//! - **no lost level interrupt**: an asserted, unmasked level pin with a valid delivery mode
//!   has been delivered and awaits its EOI (remote IRR set);
//! - every interrupt the IOAPIC sends comes from an unmasked pin, carries that pin's vector and
//!   trigger mode and a valid delivery mode; a level one sets remote IRR;
//! - IOWIN reads of a redirection register return the entry's half.

use arbitrary::{Arbitrary, Unstructured};
use devices::ioapic::{IoApic, IoapicInterrupt, IOAPIC_PINS, IOREGSEL, IOWIN};
use devices::lapic::{DeliveryMode, TriggerMode};

const WRITABLE: u64 = 0xFF00_0000_0001_AFFF;
const REMOTE_IRR: u64 = 1 << 14;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    /// Select a register (1- or 4-byte write to IOREGSEL, or a wild one).
    Select { reg: u8, wide: bool },
    /// Write the data window.
    WriteWindow(u32),
    /// Write an entry half with shapes that reach the level paths sooner.
    WriteEntry {
        pin: u8,
        high: bool,
        vector: u8,
        delivery: u8,
        level: bool,
        masked: bool,
        destination: u8,
    },
    /// Read the data window or IOREGSEL.
    Read { window: bool, len: u8 },
    /// Any access at any offset and width.
    Wild {
        offset: u16,
        len: u8,
        value: u32,
        write: bool,
    },
    /// A device line changes.
    Line { pin: u8, asserted: bool },
    /// A LAPIC signals EOI.
    Eoi(u8),
}

struct Fuzz {
    ioapic: IoApic,
    lines: [bool; IOAPIC_PINS],
}

impl Fuzz {
    fn check_sent(&self, irq: &IoapicInterrupt) {
        let entry = self
            .ioapic
            .redirection_entry(irq.pin)
            .unwrap_or_else(|| panic!("interrupt from pin {} beyond the table", irq.pin));
        assert!(!entry.masked(), "pin {} sent while masked", irq.pin);
        assert_eq!(irq.ipi.vector, entry.vector());
        assert_eq!(irq.ipi.trigger_mode, entry.trigger_mode());
        assert_ne!(irq.ipi.delivery_mode, DeliveryMode::StartUp);
        assert_eq!(Some(irq.ipi.delivery_mode), entry.delivery_mode());
        if entry.trigger_mode() == TriggerMode::Level {
            assert!(
                entry.remote_irr(),
                "level pin {} sent without remote IRR",
                irq.pin
            );
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let Some(irq) = self.ioapic.write_mmio(offset, data) {
            self.check_sent(&irq);
        }
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Select { reg, wide } => {
                let bytes = u32::from(reg).to_le_bytes();
                self.write(IOREGSEL, if wide { &bytes } else { &bytes[..1] });
            }
            Op::WriteWindow(value) => self.write(IOWIN, &value.to_le_bytes()),
            Op::WriteEntry {
                pin,
                high,
                vector,
                delivery,
                level,
                masked,
                destination,
            } => {
                let reg = 0x10 + 2 * (pin % 26) + u8::from(high);
                self.write(IOREGSEL, &[reg]);
                let value = if high {
                    u32::from(destination) << 24
                } else {
                    u32::from(vector)
                        | (u32::from(delivery & 7) << 8)
                        | (u32::from(level) << 15)
                        | (u32::from(masked) << 16)
                };
                self.write(IOWIN, &value.to_le_bytes());
                let mut back = [0u8; 4];
                self.ioapic.read_mmio(IOWIN, &mut back);
                if let Some(entry) = self.ioapic.redirection_entry(usize::from(pin % 26)) {
                    let half = if high {
                        entry.0 >> 32
                    } else {
                        entry.0 & 0xFFFF_FFFF
                    };
                    assert_eq!(u64::from(u32::from_le_bytes(back)), half, "IOWIN read-back");
                }
            }
            Op::Read { window, len } => {
                let mut data = [0u8; 8];
                let offset = if window { IOWIN } else { IOREGSEL };
                self.ioapic
                    .read_mmio(offset, &mut data[..usize::from(len % 9)]);
            }
            Op::Wild {
                offset,
                len,
                value,
                write,
            } => {
                let mut data = [0u8; 8];
                data[..4].copy_from_slice(&value.to_le_bytes());
                let data = &mut data[..usize::from(len % 9)];
                let offset = u64::from(offset & 0xFFF);
                if write {
                    self.write(offset, data);
                } else {
                    self.ioapic.read_mmio(offset, data);
                }
            }
            Op::Line { pin, asserted } => {
                let pin = usize::from(pin % 30);
                if let Some(line) = self.lines.get_mut(pin) {
                    *line = asserted;
                }
                if let Some(irq) = self.ioapic.set_irq_line(pin, asserted) {
                    assert_eq!(irq.pin, pin);
                    self.check_sent(&irq);
                }
            }
            Op::Eoi(vector) => {
                for irq in self.ioapic.end_of_interrupt(vector) {
                    self.check_sent(&irq);
                    assert!(self.lines[irq.pin], "EOI re-delivered a de-asserted pin");
                }
            }
        }
    }

    fn check(&self) {
        for pin in 0..IOAPIC_PINS {
            let Some(entry) = self.ioapic.redirection_entry(pin) else {
                panic!("pin {pin} has no entry");
            };
            assert_eq!(
                entry.0 & !(WRITABLE | REMOTE_IRR),
                0,
                "pin {pin}: reserved bits"
            );
            if entry.trigger_mode() == TriggerMode::Edge {
                assert!(!entry.remote_irr(), "edge pin {pin} holds remote IRR");
            } else if self.lines[pin] && !entry.masked() && entry.delivery_mode().is_some() {
                assert!(
                    entry.remote_irr(),
                    "pin {pin}: asserted, unmasked level interrupt neither sent nor pending"
                );
            }
        }
    }
}

/// Runs one input: steps until the bytes run out.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(id) = u.arbitrary::<u8>() else {
        return;
    };
    let mut fuzz = Fuzz {
        ioapic: IoApic::new(id),
        lines: [false; IOAPIC_PINS],
    };
    while let Ok(op) = u.arbitrary::<Op>() {
        fuzz.step(op);
        fuzz.check();
        if u.is_empty() {
            break;
        }
    }
}
