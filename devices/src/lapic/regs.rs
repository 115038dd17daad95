//! Register offsets, writable-bit masks and the 256-bit vector registers (ISR, TMR, IRR).
//!
//! Offsets are xAPIC MMIO offsets from the APIC base. The x2APIC MSR of a register is
//! `0x800 + (offset >> 4)`; [`msr_to_offset`] converts back.

/// Local APIC ID register.
pub const ID: u32 = 0x020;
/// Version register (read-only).
pub const VERSION: u32 = 0x030;
/// Task priority register.
pub const TPR: u32 = 0x080;
/// Arbitration priority register (xAPIC only, read-only).
pub const APR: u32 = 0x090;
/// Processor priority register (read-only).
pub const PPR: u32 = 0x0A0;
/// End-of-interrupt register (write-only).
pub const EOI: u32 = 0x0B0;
/// Remote read register (xAPIC only, read-only, always 0 here).
pub const RRD: u32 = 0x0C0;
/// Logical destination register.
pub const LDR: u32 = 0x0D0;
/// Destination format register (xAPIC only).
pub const DFR: u32 = 0x0E0;
/// Spurious-interrupt vector register.
pub const SVR: u32 = 0x0F0;
/// First of the eight in-service registers.
pub const ISR0: u32 = 0x100;
/// First of the eight trigger-mode registers.
pub const TMR0: u32 = 0x180;
/// First of the eight interrupt-request registers.
pub const IRR0: u32 = 0x200;
/// Error status register.
pub const ESR: u32 = 0x280;
/// Interrupt command register, low half (the whole 64-bit ICR in x2APIC mode).
pub const ICR_LOW: u32 = 0x300;
/// Interrupt command register, high half (xAPIC only).
pub const ICR_HIGH: u32 = 0x310;
/// LVT timer register.
pub const LVT_TIMER: u32 = 0x320;
/// LVT thermal sensor register.
pub const LVT_THERMAL: u32 = 0x330;
/// LVT performance monitoring counters register.
pub const LVT_PERFMON: u32 = 0x340;
/// LVT LINT0 register.
pub const LVT_LINT0: u32 = 0x350;
/// LVT LINT1 register.
pub const LVT_LINT1: u32 = 0x360;
/// LVT error register.
pub const LVT_ERROR: u32 = 0x370;
/// Timer initial count register.
pub const TIMER_INITIAL: u32 = 0x380;
/// Timer current count register (read-only).
pub const TIMER_CURRENT: u32 = 0x390;
/// Timer divide configuration register.
pub const TIMER_DIVIDE: u32 = 0x3E0;
/// Self-IPI register (x2APIC only, write-only).
pub const SELF_IPI: u32 = 0x3F0;
/// Size of the xAPIC register page that holds registers (the rest of the 4 KiB page is
/// reserved).
pub const REGISTER_SPACE: u32 = 0x400;

/// First x2APIC MSR.
pub const X2APIC_MSR_FIRST: u32 = 0x800;
/// Last x2APIC MSR.
pub const X2APIC_MSR_LAST: u32 = 0x8FF;
/// The IA32_APIC_BASE MSR.
pub const MSR_APIC_BASE: u32 = 0x1B;
/// The IA32_TSC_DEADLINE MSR.
pub const MSR_TSC_DEADLINE: u32 = 0x6E0;

/// Number of local vector table entries (timer, thermal, perfmon, LINT0, LINT1, error).
pub const LVT_COUNT: u32 = 6;
/// Version register value: version 0x14, `LVT_COUNT - 1` in bits 23:16, no EOI-broadcast
/// suppression.
pub const VERSION_VALUE: u32 = 0x14 | ((LVT_COUNT - 1) << 16);

/// LVT mask bit.
pub const LVT_MASKED: u32 = 1 << 16;
/// LVT vector field.
pub const LVT_VECTOR: u32 = 0xFF;
/// Writable bits of the LVT timer register: vector, mask, timer mode (18:17).
pub const LVT_TIMER_WRITABLE: u32 = 0x0007_00FF;
/// Writable bits of the thermal and perfmon LVTs: vector, delivery mode, mask.
pub const LVT_DELIVERY_WRITABLE: u32 = 0x0001_07FF;
/// Writable bits of LINT0/LINT1: vector, delivery mode, polarity, trigger mode, mask.
pub const LVT_LINT_WRITABLE: u32 = 0x0001_A7FF;
/// Writable bits of the LVT error register: vector, mask.
pub const LVT_ERROR_WRITABLE: u32 = 0x0001_00FF;
/// SVR bit 8: APIC software enable.
pub const SVR_ENABLED: u32 = 1 << 8;
/// Writable bits of the SVR: vector and software enable (no focus checking, no EOI
/// broadcast suppression).
pub const SVR_WRITABLE: u32 = 0x1FF;
/// Writable bits of the xAPIC ICR low half: vector, delivery mode, destination mode, level,
/// trigger mode, shorthand (delivery status reads 0: every IPI is sent at once).
pub const ICR_LOW_WRITABLE: u32 = 0x000C_CFFF;
/// Bits of the x2APIC ICR whose setting faults (#GP): 13, 17:16 and 31:20.
pub const X2APIC_ICR_RESERVED: u64 = 0xFFF0_0000 | (3 << 16) | (1 << 13);

/// ESR bit 5: send illegal vector.
pub const ESR_SEND_ILLEGAL_VECTOR: u32 = 1 << 5;
/// ESR bit 6: received illegal vector.
pub const ESR_RECEIVE_ILLEGAL_VECTOR: u32 = 1 << 6;
/// ESR bit 7: illegal register address.
pub const ESR_ILLEGAL_REGISTER: u32 = 1 << 7;

/// The LVT index of a register offset (0 = timer ... 5 = error), if it is an LVT.
pub fn lvt_index(offset: u32) -> Option<usize> {
    match offset {
        LVT_TIMER..=LVT_ERROR if offset.is_multiple_of(0x10) => {
            usize::try_from((offset - LVT_TIMER) >> 4).ok()
        }
        _ => None,
    }
}

/// Writable bits of the LVT with the given index.
pub fn lvt_writable(index: usize) -> u32 {
    match index {
        0 => LVT_TIMER_WRITABLE,
        1 | 2 => LVT_DELIVERY_WRITABLE,
        3 | 4 => LVT_LINT_WRITABLE,
        _ => LVT_ERROR_WRITABLE,
    }
}

/// The xAPIC offset of an x2APIC MSR, if `msr` is in the x2APIC range.
pub fn msr_to_offset(msr: u32) -> Option<u32> {
    (X2APIC_MSR_FIRST..=X2APIC_MSR_LAST)
        .contains(&msr)
        .then(|| (msr - X2APIC_MSR_FIRST) << 4)
}

/// The low byte of a register value (vectors, priorities); explicit masking, never a lossy cast.
pub fn low_byte(value: u32) -> u8 {
    u8::try_from(value & 0xFF).unwrap_or(0)
}

/// Bits 7:4 of a vector or priority: its priority class.
pub fn class(value: u8) -> u8 {
    value >> 4
}

/// A 256-bit register (ISR, TMR or IRR): one bit per vector, read as eight 32-bit words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VectorBitmap([u32; 8]);

impl VectorBitmap {
    /// The register whose eight 32-bit words are `words` (word 0 holds vectors 0-31).
    pub fn from_words(words: [u32; 8]) -> Self {
        VectorBitmap(words)
    }

    /// The eight 32-bit words (word 0 holds vectors 0-31).
    pub fn words(&self) -> [u32; 8] {
        self.0
    }

    /// Sets the bit of `vector`.
    pub fn set(&mut self, vector: u8) {
        self.0[usize::from(vector >> 5)] |= 1 << (vector & 31);
    }

    /// Clears the bit of `vector`.
    pub fn clear(&mut self, vector: u8) {
        self.0[usize::from(vector >> 5)] &= !(1 << (vector & 31));
    }

    /// Whether the bit of `vector` is set.
    pub fn contains(&self, vector: u8) -> bool {
        self.0[usize::from(vector >> 5)] & (1 << (vector & 31)) != 0
    }

    /// The highest set vector.
    pub fn highest(&self) -> Option<u8> {
        self.0.iter().enumerate().rev().find_map(|(word, &bits)| {
            let top = 31u32.checked_sub(bits.leading_zeros())?;
            u8::try_from(word * 32 + usize::try_from(top).ok()?).ok()
        })
    }

    /// The 32-bit word `index` (0..8) as the guest reads it; 0 for other indices.
    pub fn word(&self, index: usize) -> u32 {
        self.0.get(index).copied().unwrap_or(0)
    }

    /// Whether no bit is set.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_set_clear_highest() {
        let mut b = VectorBitmap::default();
        assert_eq!(b.highest(), None);
        b.set(0x31);
        b.set(0xFF);
        b.set(0x20);
        assert_eq!(b.highest(), Some(0xFF));
        assert_eq!(b.word(7), 1 << 31);
        assert_eq!(b.word(1), 1 | (1 << 0x11));
        b.clear(0xFF);
        assert_eq!(b.highest(), Some(0x31));
        assert!(b.contains(0x20));
        assert!(!b.contains(0x21));
        assert_eq!(b.word(8), 0);
    }

    #[test]
    fn msr_mapping_and_lvt_index() {
        assert_eq!(msr_to_offset(0x830), Some(ICR_LOW));
        assert_eq!(msr_to_offset(0x83F), Some(SELF_IPI));
        assert_eq!(msr_to_offset(0x7FF), None);
        assert_eq!(lvt_index(LVT_TIMER), Some(0));
        assert_eq!(lvt_index(LVT_ERROR), Some(5));
        assert_eq!(lvt_index(0x325), None);
        assert_eq!(lvt_index(TIMER_INITIAL), None);
        assert_eq!(VERSION_VALUE, 0x0005_0014);
    }
}
