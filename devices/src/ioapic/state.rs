//! The IOAPIC's state as a plain value, for snapshots: [`IoApic::save`] and
//! [`IoApic::restore`], which checks a saved state (untrusted: a snapshot file) before it
//! takes any of it.

use serde::{Deserialize, Serialize};

use super::{IoApic, IoApicEvents, IOAPIC_PINS, LEVEL, REMOTE_IRR, WRITABLE};

/// Everything an [`IoApic`] holds, as a plain value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoApicState {
    /// The 4-bit IOAPIC ID.
    pub id: u8,
    /// The register IOREGSEL selects.
    pub select: u8,
    /// The redirection table, remote IRR included, pin by pin.
    pub entries: Vec<u64>,
    /// The logical level of each pin's line (true = asserted).
    pub lines: Vec<bool>,
}

/// Why a saved IOAPIC state cannot be restored: the snapshot is corrupt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IoApicStateError {
    /// The ID does not fit its 4 bits.
    #[error("Saved IOAPIC state: ID {0} does not fit 4 bits: corrupt snapshot")]
    Id(u8),
    /// The table or the line levels are not one per pin.
    #[error("Saved IOAPIC state: {entries} redirection entries and {lines} line levels for {pins} pins: corrupt snapshot", pins = IOAPIC_PINS)]
    Pins {
        /// Entries saved.
        entries: usize,
        /// Line levels saved.
        lines: usize,
    },
    /// A redirection entry has bits the guest cannot set, or remote IRR on an edge pin.
    #[error("Saved IOAPIC state: redirection entry {pin} = {value:#x} has bits the guest cannot set: corrupt snapshot")]
    Entry {
        /// The pin.
        pin: usize,
        /// The saved entry.
        value: u64,
    },
}

impl<E: IoApicEvents> IoApic<E> {
    /// This IOAPIC's state, for a snapshot.
    pub fn save(&self) -> IoApicState {
        IoApicState {
            id: self.id,
            select: self.select,
            entries: self.entries.to_vec(),
            lines: self.lines.to_vec(),
        }
    }

    /// Takes `state` after checking all of it (on an error nothing changed). Delivers
    /// nothing: an interrupt that was pending at the save is in the LAPICs' IRRs or awaits
    /// its EOI under remote IRR.
    pub fn restore(&mut self, state: &IoApicState) -> Result<(), IoApicStateError> {
        if state.id > 0xF {
            return Err(IoApicStateError::Id(state.id));
        }
        let (Ok(entries), Ok(lines)) = (
            <[u64; IOAPIC_PINS]>::try_from(state.entries.as_slice()),
            <[bool; IOAPIC_PINS]>::try_from(state.lines.as_slice()),
        ) else {
            return Err(IoApicStateError::Pins {
                entries: state.entries.len(),
                lines: state.lines.len(),
            });
        };
        for (pin, &value) in entries.iter().enumerate() {
            let edge_with_irr = value & REMOTE_IRR != 0 && value & LEVEL == 0;
            if value & !(WRITABLE | REMOTE_IRR) != 0 || edge_with_irr {
                return Err(IoApicStateError::Entry { pin, value });
            }
        }
        self.id = state.id;
        self.select = state.select;
        self.entries = entries;
        self.lines = lines;
        Ok(())
    }
}
