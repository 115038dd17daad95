//! An 82093AA-style I/O APIC (version 0x11, 24 pins): the redirection table that turns device
//! interrupt lines into interrupt messages for the local APICs.
//!
//! ```text
//!   device line ──> set_irq_line(pin, asserted) ──> IoapicInterrupt { pin, ipi }
//!                                                        │ lapic::route(&ipi, ..) + Lapic::receive
//!   level-triggered EOI from a Lapic ──> end_of_interrupt(vector) ──> re-deliveries
//!   guest MMIO at 0xFEC00000 ──> read_mmio / write_mmio (IOREGSEL at 0x00, IOWIN at 0x10)
//! ```
//!
//! Edge-triggered pins deliver on a rising edge. Level-triggered pins deliver while asserted
//! and remote IRR is clear, and set remote IRR until the LAPIC's EOI comes back
//! ([`IoApic::end_of_interrupt`]). A masked pin remembers its line: unmasking a level pin that
//! is still asserted delivers it (an edge that arrived while masked is lost, as in hardware).
//! The VMM passes the *logical* line state (asserted or not); the polarity bit is stored for
//! the guest but not applied.
//!
//! ```
//! use devices::ioapic::IoApic;
//! let mut ioapic = IoApic::new(2);
//! let write = |ioapic: &mut IoApic, reg: u32, value: u32| {
//!     let _ = ioapic.write_mmio(0x00, &reg.to_le_bytes());
//!     ioapic.write_mmio(0x10, &value.to_le_bytes())
//! };
//! let _ = write(&mut ioapic, 0x10 + 2 * 4, 0x0000_8030); // pin 4: vector 0x30, level, unmasked
//! let irq = ioapic.set_irq_line(4, true).unwrap();
//! assert_eq!(irq.ipi.vector, 0x30);
//! assert!(ioapic.set_irq_line(4, true).is_none()); // remote IRR is set
//! assert!(ioapic.end_of_interrupt(0x30).len() == 1); // still asserted: delivered again
//! ```

use crate::lapic::{DeliveryMode, DestinationMode, Ipi, Shorthand, TriggerMode};

mod state;

pub use state::{IoApicState, IoApicStateError};

/// Default physical address of the IOAPIC's register window.
pub const IOAPIC_DEFAULT_BASE: u64 = 0xFEC0_0000;
/// Size of the MMIO window the VMM should map.
pub const IOAPIC_MMIO_SIZE: u64 = 0x1000;
/// Number of interrupt pins (redirection entries).
pub const IOAPIC_PINS: usize = 24;
const _: () = assert!(IOAPIC_PINS == 24, "VERSION_VALUE encodes 24 pins");
/// Offset of the register select register.
pub const IOREGSEL: u64 = 0x00;
/// Offset of the register data window.
pub const IOWIN: u64 = 0x10;

const REG_ID: u8 = 0x00;
const REG_VERSION: u8 = 0x01;
const REG_ARBITRATION: u8 = 0x02;
const REG_REDIRECTION: u8 = 0x10;
/// Version 0x11 with the highest redirection entry (`IOAPIC_PINS - 1` = 23) in bits 23:16.
const VERSION_VALUE: u32 = 0x11 | (23 << 16);

const DELIVERY_STATUS: u64 = 1 << 12;
const REMOTE_IRR: u64 = 1 << 14;
const LEVEL: u64 = 1 << 15;
const MASKED: u64 = 1 << 16;
/// Guest-writable bits: vector, delivery mode, destination mode, polarity, trigger, mask, and
/// the 8-bit destination.
const WRITABLE: u64 = 0xFF00_0000_0001_AFFF;

/// One redirection table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedirectionEntry(pub u64);

impl RedirectionEntry {
    /// Vector (bits 7:0).
    pub fn vector(self) -> u8 {
        u8::try_from(self.0 & 0xFF).unwrap_or(0)
    }

    /// Delivery mode (bits 10:8); `None` for the encodings reserved in an IOAPIC (0b011,
    /// 0b110).
    pub fn delivery_mode(self) -> Option<DeliveryMode> {
        DeliveryMode::from_bits(self.0 >> 8).filter(|mode| *mode != DeliveryMode::StartUp)
    }

    /// Destination mode (bit 11).
    pub fn destination_mode(self) -> DestinationMode {
        if self.0 & (1 << 11) != 0 {
            DestinationMode::Logical
        } else {
            DestinationMode::Physical
        }
    }

    /// Whether the input is active low (bit 13).
    pub fn active_low(self) -> bool {
        self.0 & (1 << 13) != 0
    }

    /// Remote IRR (bit 14): a level-triggered interrupt awaits its EOI.
    pub fn remote_irr(self) -> bool {
        self.0 & REMOTE_IRR != 0
    }

    /// Trigger mode (bit 15).
    pub fn trigger_mode(self) -> TriggerMode {
        if self.0 & LEVEL != 0 {
            TriggerMode::Level
        } else {
            TriggerMode::Edge
        }
    }

    /// Mask (bit 16).
    pub fn masked(self) -> bool {
        self.0 & MASKED != 0
    }

    /// Destination APIC ID or logical mask (bits 63:56).
    pub fn destination(self) -> u8 {
        u8::try_from(self.0 >> 56).unwrap_or(0)
    }
}

/// An interrupt the IOAPIC sends: route `ipi` with [`crate::lapic::route`] and deliver it with
/// [`crate::lapic::Lapic::receive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoapicInterrupt {
    /// The pin that raised it.
    pub pin: usize,
    /// The message (xAPIC format, no shorthand, no source).
    pub ipi: Ipi,
}

/// Guest or VMM behaviour worth counting; every method has an empty default.
pub trait IoApicEvents {
    /// An access to an offset, width or register the IOAPIC ignores.
    fn invalid_access(&self, _offset: u64, _len: usize) {}
    /// `set_irq_line` for a pin beyond the last one.
    fn invalid_pin(&self, _pin: usize) {}
    /// A redirection entry with a reserved delivery mode fired (nothing was sent).
    fn reserved_delivery_mode(&self, _pin: usize) {}
}

/// Events sink that ignores everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoopIoApicEvents;

impl IoApicEvents for NoopIoApicEvents {}

/// The I/O APIC. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct IoApic<E: IoApicEvents = NoopIoApicEvents> {
    id: u8,
    select: u8,
    entries: [u64; IOAPIC_PINS],
    lines: [bool; IOAPIC_PINS],
    events: E,
}

impl IoApic<NoopIoApicEvents> {
    /// An IOAPIC with 4-bit ID `id` (as in the MP table), every pin masked.
    pub fn new(id: u8) -> Self {
        IoApic::with_events(id, NoopIoApicEvents)
    }
}

impl<E: IoApicEvents> IoApic<E> {
    /// An IOAPIC that reports ignored accesses to `events`.
    pub fn with_events(id: u8, events: E) -> Self {
        IoApic {
            id: id & 0xF,
            select: 0,
            entries: [MASKED; IOAPIC_PINS],
            lines: [false; IOAPIC_PINS],
            events,
        }
    }

    /// Back to the reset state: every pin masked, the line levels kept.
    pub fn reset(&mut self) {
        self.select = 0;
        self.entries = [MASKED; IOAPIC_PINS];
    }

    /// The redirection entry of `pin`.
    pub fn redirection_entry(&self, pin: usize) -> Option<RedirectionEntry> {
        self.entries.get(pin).copied().map(RedirectionEntry)
    }

    /// The events sink.
    pub fn events(&self) -> &E {
        &self.events
    }

    /// Reads at `offset` in the MMIO window. IOREGSEL and IOWIN read 1 to 4 bytes from their
    /// start; anything else reads zeros.
    pub fn read_mmio(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let value = match (offset, data.len()) {
            (IOREGSEL, 1..=4) => u32::from(self.select),
            (IOWIN, 1..=4) => self.read_register(),
            _ => {
                self.events.invalid_access(offset, data.len());
                return;
            }
        };
        let bytes = value.to_le_bytes();
        data.copy_from_slice(&bytes[..data.len()]);
    }

    /// Writes at `offset` in the MMIO window: a 1 or 4 byte IOREGSEL write, or a 4-byte IOWIN
    /// write. Returns an interrupt to deliver if the write unmasked an asserted level pin.
    pub fn write_mmio(&mut self, offset: u64, data: &[u8]) -> Option<IoapicInterrupt> {
        match (offset, data) {
            (IOREGSEL, [select, ..]) if matches!(data.len(), 1 | 4) => {
                self.select = *select;
                None
            }
            (IOWIN, &[a, b, c, d]) => self.write_register(u32::from_le_bytes([a, b, c, d])),
            _ => {
                self.events.invalid_access(offset, data.len());
                None
            }
        }
    }

    /// The pin and half (false = low, true = high) of a redirection register index.
    fn entry_of(select: u8) -> Option<(usize, bool)> {
        let index = usize::from(select.checked_sub(REG_REDIRECTION)?);
        (index < 2 * IOAPIC_PINS).then_some((index / 2, index % 2 == 1))
    }

    fn read_register(&mut self) -> u32 {
        match self.select {
            REG_ID | REG_ARBITRATION => u32::from(self.id) << 24,
            REG_VERSION => VERSION_VALUE,
            select => match Self::entry_of(select) {
                Some((pin, high)) => {
                    let entry = self.entries[pin];
                    let half = if high {
                        entry >> 32
                    } else {
                        entry & 0xFFFF_FFFF
                    };
                    u32::try_from(half).unwrap_or(0)
                }
                None => {
                    self.events.invalid_access(IOWIN, 4);
                    0
                }
            },
        }
    }

    fn write_register(&mut self, value: u32) -> Option<IoapicInterrupt> {
        match self.select {
            REG_ID => {
                self.id = u8::try_from((value >> 24) & 0xF).unwrap_or(0);
                None
            }
            select => {
                let Some((pin, high)) = Self::entry_of(select) else {
                    self.events.invalid_access(IOWIN, 4);
                    return None;
                };
                let old = self.entries[pin];
                let value = u64::from(value);
                let written = if high {
                    (old & 0xFFFF_FFFF) | (value << 32)
                } else {
                    (old & 0xFFFF_FFFF_0000_0000) | value
                };
                let mut entry = (written & WRITABLE) | (old & REMOTE_IRR);
                if entry & LEVEL == 0 {
                    entry &= !REMOTE_IRR;
                }
                self.entries[pin] = entry;
                self.deliver_level(pin)
            }
        }
    }

    /// Delivers a level-triggered pin if it is asserted, unmasked and not awaiting an EOI.
    fn deliver_level(&mut self, pin: usize) -> Option<IoapicInterrupt> {
        let entry = self.entries[pin];
        if entry & LEVEL == 0 || entry & (MASKED | REMOTE_IRR) != 0 || !self.lines[pin] {
            return None;
        }
        let irq = self.message(pin)?;
        self.entries[pin] |= REMOTE_IRR;
        Some(irq)
    }

    fn message(&self, pin: usize) -> Option<IoapicInterrupt> {
        let entry = RedirectionEntry(self.entries[pin] & !DELIVERY_STATUS);
        let Some(delivery_mode) = entry.delivery_mode() else {
            self.events.reserved_delivery_mode(pin);
            return None;
        };
        Some(IoapicInterrupt {
            pin,
            ipi: Ipi {
                delivery_mode,
                vector: entry.vector(),
                destination: u32::from(entry.destination()),
                destination_mode: entry.destination_mode(),
                shorthand: Shorthand::None,
                assert: true,
                trigger_mode: entry.trigger_mode(),
                x2apic_format: false,
                source_apic_id: None,
            },
        })
    }

    /// Sets the logical state of the line into `pin` (true = asserted). Returns the interrupt
    /// to deliver, if any: on a rising edge for edge pins; while asserted with remote IRR clear
    /// for level pins (remote IRR is then set). A level interrupt that no LAPIC accepts would
    /// hold remote IRR forever, as on hardware; the VMM may call
    /// [`IoApic::end_of_interrupt`] itself when routing finds no target.
    pub fn set_irq_line(&mut self, pin: usize, asserted: bool) -> Option<IoapicInterrupt> {
        let Some(line) = self.lines.get_mut(pin) else {
            self.events.invalid_pin(pin);
            return None;
        };
        let rising = asserted && !*line;
        *line = asserted;
        let entry = self.entries[pin];
        if entry & LEVEL != 0 {
            return self.deliver_level(pin);
        }
        if rising && entry & MASKED == 0 {
            return self.message(pin);
        }
        None
    }

    /// A LAPIC signalled EOI for a level-triggered `vector`: clears remote IRR of the
    /// level-triggered pins with that vector and re-delivers those whose line is still
    /// asserted.
    pub fn end_of_interrupt(&mut self, vector: u8) -> Vec<IoapicInterrupt> {
        let mut redelivered = Vec::new();
        for pin in 0..IOAPIC_PINS {
            let entry = RedirectionEntry(self.entries[pin]);
            if entry.vector() != vector || !entry.remote_irr() {
                continue;
            }
            self.entries[pin] &= !REMOTE_IRR;
            redelivered.extend(self.deliver_level(pin));
        }
        redelivered
    }
}

#[cfg(test)]
mod tests;
