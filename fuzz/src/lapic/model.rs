//! What the `lapic` target knows of a vCPU's interrupt priority from what it did to it,
//! without reading the LAPIC's ISR or TPR: the vectors the vCPU port saw injected and no EOI
//! has retired yet, and the task priority the guest last wrote. The checks compare the
//! LAPIC's ISR, TPR, PPR, the CR8 it gave KVM and what it lets in against the SDM's
//! definitions over this record.

use std::collections::BTreeSet;

/// The processor priority as the SDM defines it (Vol. 3A 11.8.3.1), nibble by nibble:
/// PPR[7:4] = max(TPR[7:4], ISRV[7:4]); PPR[3:0] = TPR[3:0] if TPR[7:4] >= ISRV[7:4], else 0.
/// `isrv` is the highest in-service vector (0 if none).
pub fn sdm_ppr(tpr: u8, isrv: u8) -> u8 {
    let (tpr_class, isr_class) = (tpr / 16, isrv / 16);
    let high = tpr_class.max(isr_class);
    let low = if tpr_class >= isr_class { tpr % 16 } else { 0 };
    high * 16 + low
}

/// One vCPU's record.
#[derive(Debug, Default, Clone)]
pub struct Priority {
    /// Vectors injected through the vCPU port and not yet retired by an EOI the guest made.
    pub in_service: BTreeSet<u8>,
    /// The TPR the guest last wrote (register or MSR).
    pub tpr: u8,
}

impl Priority {
    /// The highest in-service vector, by scanning the record (0 if none).
    pub fn isrv(&self) -> u8 {
        (0..=255u8)
            .rev()
            .find(|v| self.in_service.contains(v))
            .unwrap_or(0)
    }

    /// PPR per the SDM over the record.
    pub fn ppr(&self) -> u8 {
        sdm_ppr(self.tpr, self.isrv())
    }

    /// The guest ended its highest in-service interrupt (SDM 11.8.5).
    pub fn eoi(&mut self) {
        let top = self.isrv();
        self.in_service.remove(&top);
    }

    /// INIT or a global disable: nothing in service, TPR 0 (SDM 11.4.7.1, 11.4.7.3).
    pub fn reset(&mut self) {
        self.in_service.clear();
        self.tpr = 0;
    }

    /// The record as a 256-bit register image (ISR layout).
    pub fn bitmap(&self) -> [u32; 8] {
        let mut words = [0u32; 8];
        for &v in &self.in_service {
            words[usize::from(v / 32)] |= 1 << (v % 32);
        }
        words
    }
}
