//! The `lapic` target's register reads and the invariants it checks on one vCPU's LAPIC. Reads
//! go through the register interface of the LAPIC's current mode (MMIO for xAPIC, MSRs for
//! x2APIC), on a copy of the LAPIC, so that looking never changes the vCPU.

use std::sync::Arc;

use devices::lapic::{regs, ApicMode, Lapic};
use vmm::metrics::LapicNoise;

use super::model::Priority;
use super::vcpu::Vcpu;

/// A copy of one vCPU's LAPIC.
type LapicCopy = Lapic<Arc<LapicNoise>>;

/// A register read through the interface of the LAPIC's current mode (None when disabled).
pub fn read_reg(lapic: &mut LapicCopy, offset: u32) -> Option<u32> {
    match lapic.mode() {
        ApicMode::Disabled => None,
        ApicMode::XApic => {
            let mut data = [0u8; 4];
            lapic.read_mmio(u64::from(offset), &mut data, 0);
            Some(u32::from_le_bytes(data))
        }
        ApicMode::X2Apic => {
            let msr = regs::X2APIC_MSR_FIRST + (offset >> 4);
            let value = lapic
                .read_msr(msr, 0)
                .unwrap_or_else(|e| panic!("x2APIC read of {offset:#x} faulted: {e}"));
            Some(u32::try_from(value & 0xFFFF_FFFF).unwrap_or(0))
        }
    }
}

/// The 256-bit register starting at `first` (ISR, TMR or IRR), if readable.
pub fn read_bitmap(lapic: &mut LapicCopy, first: u32) -> Option<[u32; 8]> {
    let mut words = [0u32; 8];
    for (i, word) in (0u32..).zip(words.iter_mut()) {
        *word = read_reg(lapic, first + i * 0x10)?;
    }
    Some(words)
}

/// The highest vector set.
pub fn highest(words: &[u32; 8]) -> Option<u8> {
    (0u8..8).rev().find_map(|i| {
        let w = words[usize::from(i)];
        let top = 31u32.checked_sub(w.leading_zeros())?;
        u8::try_from(u32::from(i) * 32 + top).ok()
    })
}

/// Whether `vector` is set.
pub fn contains(words: &[u32; 8], vector: u8) -> bool {
    words[usize::from(vector >> 5)] & (1 << (vector & 31)) != 0
}

fn count(words: &[u32; 8]) -> u32 {
    words.iter().map(|w| w.count_ones()).sum()
}

/// Whether `vector` waits in IRR or is in service (true if the LAPIC is unreadable: disabled).
pub fn pending_or_in_service(lapic: &mut LapicCopy, vector: u8) -> bool {
    let (Some(irr), Some(isr)) = (
        read_bitmap(lapic, regs::IRR0),
        read_bitmap(lapic, regs::ISR0),
    ) else {
        return true;
    };
    contains(&irr, vector) || contains(&isr, vector)
}

/// What an entry did to vCPU `i`: at most one injection, of the highest pending vector; the
/// window request on exactly when something is still deliverable.
pub fn entry(i: usize, v: &Vcpu, after: &mut LapicCopy, now: u64) {
    let port = &v.port;
    assert!(
        port.injected.len() <= 1,
        "vCPU {i}: {} injections in one entry",
        port.injected.len()
    );
    let next = after.next_interrupt();
    if after.mode() != ApicMode::Disabled {
        // What KVM loads into CR8 at this entry (`kvm_run.cr8`): TPR[7:4] of the TPR the
        // guest wrote (SDM 11.8.6.1).
        assert_eq!(
            port.cr8,
            u64::from(v.model.tpr / 16),
            "vCPU {i}: KVM given CR8 {:#x} with TPR {:#x} written",
            port.cr8,
            v.model.tpr
        );
    }
    if let Some(&vector) = port.injected.first() {
        assert!(vector >= 16, "vCPU {i}: vector {vector:#x} injected");
        let ppr = v.model.ppr();
        assert!(
            vector / 16 > ppr / 16,
            "vCPU {i}: injected {vector:#x} at PPR {ppr:#x} (not above its class)"
        );
        if let (Some(isr), Some(irr)) = (
            read_bitmap(after, regs::ISR0),
            read_bitmap(after, regs::IRR0),
        ) {
            assert_eq!(
                highest(&isr),
                Some(vector),
                "vCPU {i}: injected {vector:#x} is not the highest in service"
            );
            assert!(
                highest(&irr).is_none_or(|p| p < vector),
                "vCPU {i}: injected {vector:#x} while {:?} was pending above it",
                highest(&irr)
            );
        }
    } else if port.open {
        assert_eq!(
            next, None,
            "vCPU {i}: the guest could take {next:?} at {now} but nothing was injected"
        );
    }
    assert_eq!(
        port.window_requested,
        next.is_some(),
        "vCPU {i}: interrupt window request {} with {next:?} deliverable",
        port.window_requested
    );
}

/// lull set vCPU `i`'s PV EOI flag: exactly one vector in service, edge-triggered, nothing
/// pending (KVM's rules). Returns that vector.
pub fn pv_offer_allowed(i: usize, lapic: &mut LapicCopy) -> u8 {
    let (Some(isr), Some(irr), Some(tmr)) = (
        read_bitmap(lapic, regs::ISR0),
        read_bitmap(lapic, regs::IRR0),
        read_bitmap(lapic, regs::TMR0),
    ) else {
        panic!("vCPU {i}: PV EOI flag set with the LAPIC disabled");
    };
    assert_eq!(count(&irr), 0, "vCPU {i}: PV EOI offered with IRR {irr:x?}");
    assert_eq!(count(&isr), 1, "vCPU {i}: PV EOI offered with ISR {isr:x?}");
    let Some(vector) = highest(&isr) else {
        unreachable!("one bit is set");
    };
    assert!(
        !contains(&tmr, vector),
        "vCPU {i}: PV EOI offered for level-triggered {vector:#x}"
    );
    vector
}

/// vCPU `i`'s registers agree with each other, with what KVM was told and with the target's
/// own record of what was delivered and ended (`model`): ISR is exactly the vectors injected
/// and not EOI'd, TPR what the guest wrote, PPR the SDM's function of the two.
pub fn registers(i: usize, lapic: &mut LapicCopy, apic_base_told: Option<u64>, model: &Priority) {
    if lapic.next_interrupt().is_some() {
        assert!(lapic.has_pending_interrupt());
    }
    if let Some(told) = apic_base_told {
        let base = lapic
            .read_msr(regs::MSR_APIC_BASE, 0)
            .unwrap_or_else(|e| panic!("vCPU {i}: IA32_APIC_BASE read faulted: {e}"));
        assert_eq!(
            told, base,
            "vCPU {i}: KVM was told IA32_APIC_BASE {told:#x}, the LAPIC has {base:#x}"
        );
    }
    let Some(isr) = read_bitmap(lapic, regs::ISR0) else {
        return;
    };
    assert_eq!(
        isr,
        model.bitmap(),
        "vCPU {i}: ISR is not the vectors injected and not ended {:?}",
        model.in_service
    );
    let ppr = model.ppr();
    assert_eq!(
        read_reg(lapic, regs::TPR),
        Some(u32::from(model.tpr)),
        "vCPU {i}: TPR is not what the guest wrote"
    );
    assert_eq!(
        read_reg(lapic, regs::PPR),
        Some(u32::from(ppr)),
        "vCPU {i}: PPR is not the SDM's for TPR {:#x} and in-service {:?}",
        model.tpr,
        model.in_service
    );
    let irr = read_bitmap(lapic, regs::IRR0);
    assert!(
        irr.is_some_and(|irr| irr[0] & 0xFFFF == 0),
        "vCPU {i}: vector below 16 pending"
    );
    // Acceptance follows from the PPR (SDM 11.8.3.1): the highest pending vector is the next
    // interrupt iff its class is above PPR's.
    let deliverable = irr
        .and_then(|irr| highest(&irr))
        .filter(|&v| v / 16 > ppr / 16);
    assert_eq!(
        lapic.next_interrupt(),
        deliverable,
        "vCPU {i}: next interrupt against PPR {ppr:#x}"
    );
}
