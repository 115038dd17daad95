//! Interrupt messages: the fields of an ICR write (an IPI) or an IOAPIC redirection entry.
//!
//! ICR layout (SDM vol. 3 figure 11-12): vector 7:0, delivery mode 10:8, destination mode 11,
//! delivery status 12, level 14, trigger mode 15, shorthand 19:18; destination 63:56 in xAPIC
//! mode, 63:32 in x2APIC mode.

/// How the target handles a message (ICR/redirection bits 10:8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryMode {
    /// Deliver `vector` to every target.
    Fixed,
    /// Deliver `vector` to the one target with the lowest priority.
    LowestPriority,
    /// System management interrupt (lull ignores it).
    Smi,
    /// Non-maskable interrupt; the vector is ignored.
    Nmi,
    /// INIT: reset the target's LAPIC and park it waiting for a SIPI.
    Init,
    /// Start-up IPI: the target starts in real mode at `vector << 12`.
    StartUp,
    /// External interrupt from an 8259 (lull has none; ignored).
    ExtInt,
}

impl DeliveryMode {
    /// Decodes the 3-bit field; `None` for the reserved encoding 0b011.
    pub fn from_bits(bits: u64) -> Option<DeliveryMode> {
        match bits & 7 {
            0 => Some(DeliveryMode::Fixed),
            1 => Some(DeliveryMode::LowestPriority),
            2 => Some(DeliveryMode::Smi),
            4 => Some(DeliveryMode::Nmi),
            5 => Some(DeliveryMode::Init),
            6 => Some(DeliveryMode::StartUp),
            7 => Some(DeliveryMode::ExtInt),
            _ => None,
        }
    }
}

/// How `destination` is matched (bit 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestinationMode {
    /// `destination` is an APIC ID.
    Physical,
    /// `destination` is a logical mask matched against each LDR.
    Logical,
}

/// Destination shorthand (ICR bits 19:18).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shorthand {
    /// Use the destination field.
    None,
    /// The sender only.
    SelfOnly,
    /// Every APIC, the sender included.
    AllIncludingSelf,
    /// Every APIC but the sender.
    AllExcludingSelf,
}

/// Trigger mode (bit 15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerMode {
    /// Edge-triggered.
    Edge,
    /// Level-triggered: the EOI must reach the IOAPIC.
    Level,
}

/// An interrupt message to route with [`route`](super::route) and deliver with
/// [`Lapic::receive`](super::Lapic::receive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipi {
    /// Delivery mode.
    pub delivery_mode: DeliveryMode,
    /// Vector (ignored for NMI and INIT; the start page for SIPI).
    pub vector: u8,
    /// Destination: an 8-bit xAPIC or 32-bit x2APIC ID or logical mask.
    pub destination: u32,
    /// Physical or logical destination.
    pub destination_mode: DestinationMode,
    /// Shorthand; overrides `destination` unless [`Shorthand::None`].
    pub shorthand: Shorthand,
    /// Level bit: false only for an INIT level de-assert.
    pub assert: bool,
    /// Trigger mode.
    pub trigger_mode: TriggerMode,
    /// Whether `destination` is in x2APIC format (32-bit, broadcast 0xFFFF_FFFF) rather than
    /// xAPIC format (8-bit, broadcast 0xFF).
    pub x2apic_format: bool,
    /// APIC ID of the sending LAPIC; `None` for messages from the IOAPIC.
    pub source_apic_id: Option<u32>,
}

impl Ipi {
    /// A fixed, edge-triggered, physical interrupt for `vector` at APIC `destination`.
    ///
    /// ```
    /// use devices::lapic::{DeliveryMode, Ipi};
    /// let ipi = Ipi::fixed(0x40, 1);
    /// assert_eq!(ipi.delivery_mode, DeliveryMode::Fixed);
    /// ```
    pub fn fixed(vector: u8, destination: u32) -> Ipi {
        Ipi {
            delivery_mode: DeliveryMode::Fixed,
            vector,
            destination,
            destination_mode: DestinationMode::Physical,
            shorthand: Shorthand::None,
            assert: true,
            trigger_mode: TriggerMode::Edge,
            x2apic_format: false,
            source_apic_id: None,
        }
    }

    /// Whether this is an INIT level de-assert (which targets ignore).
    pub fn is_init_deassert(&self) -> bool {
        self.delivery_mode == DeliveryMode::Init
            && !self.assert
            && self.trigger_mode == TriggerMode::Level
    }
}

/// The outcome of decoding an ICR write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IcrDecode {
    /// Send this message.
    Send(Ipi),
    /// A fixed or lowest-priority message with a vector below 16 (ESR "send illegal vector").
    IllegalVector(u8),
    /// A delivery mode lull does not send (SMI, ExtINT, reserved): ignored.
    Unsupported(u8),
}

/// Decodes an ICR value written by the APIC with ID `source_apic_id`.
pub(crate) fn decode_icr(icr: u64, x2apic: bool, source_apic_id: u32) -> IcrDecode {
    let vector = u8::try_from(icr & 0xFF).unwrap_or(0);
    let mode_bits = u8::try_from((icr >> 8) & 7).unwrap_or(0);
    let delivery_mode = match DeliveryMode::from_bits(icr >> 8) {
        Some(DeliveryMode::Smi | DeliveryMode::ExtInt) | None => {
            return IcrDecode::Unsupported(mode_bits)
        }
        Some(mode) => mode,
    };
    if matches!(
        delivery_mode,
        DeliveryMode::Fixed | DeliveryMode::LowestPriority
    ) && vector < 16
    {
        return IcrDecode::IllegalVector(vector);
    }
    let destination = if x2apic {
        u32::try_from(icr >> 32).unwrap_or(u32::MAX)
    } else {
        u32::try_from(icr >> 56).unwrap_or(0)
    };
    let shorthand = match (icr >> 18) & 3 {
        0 => Shorthand::None,
        1 => Shorthand::SelfOnly,
        2 => Shorthand::AllIncludingSelf,
        _ => Shorthand::AllExcludingSelf,
    };
    IcrDecode::Send(Ipi {
        delivery_mode,
        vector,
        destination,
        destination_mode: if icr & (1 << 11) != 0 {
            DestinationMode::Logical
        } else {
            DestinationMode::Physical
        },
        shorthand,
        assert: icr & (1 << 14) != 0,
        trigger_mode: if icr & (1 << 15) != 0 {
            TriggerMode::Level
        } else {
            TriggerMode::Edge
        },
        x2apic_format: x2apic,
        source_apic_id: Some(source_apic_id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(icr: u64, x2apic: bool) -> Ipi {
        match decode_icr(icr, x2apic, 3) {
            IcrDecode::Send(ipi) => ipi,
            other => panic!("{icr:#x} decoded as {other:?}"),
        }
    }

    #[test]
    fn each_delivery_mode() {
        let cases = [
            (0x0000_4031, DeliveryMode::Fixed),
            (0x0000_4131, DeliveryMode::LowestPriority),
            (0x0000_4400, DeliveryMode::Nmi),
            (0x0000_C500, DeliveryMode::Init),
            (0x0000_4608, DeliveryMode::StartUp),
        ];
        for (low, mode) in cases {
            let ipi = send((2u64 << 56) | low, false);
            assert_eq!(ipi.delivery_mode, mode);
            assert_eq!(ipi.destination, 2);
            assert_eq!(ipi.source_apic_id, Some(3));
        }
        assert_eq!(send(0x4608, false).vector, 8);
        assert_eq!(decode_icr(0x4200, false, 0), IcrDecode::Unsupported(2));
        assert_eq!(decode_icr(0x4300, false, 0), IcrDecode::Unsupported(3));
        assert_eq!(decode_icr(0x4700, false, 0), IcrDecode::Unsupported(7));
        assert_eq!(decode_icr(0x400F, false, 0), IcrDecode::IllegalVector(0xF));
        assert_eq!(decode_icr(0x410F, true, 0), IcrDecode::IllegalVector(0xF));
    }

    #[test]
    fn init_level_deassert() {
        let ipi = send(0x0000_8500, false);
        assert!(ipi.is_init_deassert());
        assert!(!send(0x0000_C500, false).is_init_deassert());
    }

    #[test]
    fn shorthands_and_formats() {
        assert_eq!(send(0x4_4031, false).shorthand, Shorthand::SelfOnly);
        assert_eq!(send(0x8_4031, false).shorthand, Shorthand::AllIncludingSelf);
        assert_eq!(send(0xC_4031, false).shorthand, Shorthand::AllExcludingSelf);
        assert_eq!(send(0x4031, false).shorthand, Shorthand::None);
        let x2 = send(0x0001_0004_0000_4831, true);
        assert_eq!(x2.destination, 0x0001_0004);
        assert_eq!(x2.destination_mode, DestinationMode::Logical);
        assert!(x2.x2apic_format);
        let xa = send(0xFF00_0000_0000_8831, false);
        assert_eq!(xa.destination, 0xFF);
        assert_eq!(xa.trigger_mode, TriggerMode::Level);
        assert!(!xa.assert);
    }
}
