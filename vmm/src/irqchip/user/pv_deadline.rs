//! lull's paravirtual TSC deadline (`--irqchip user`, `--pv-deadline on`): a guest arms its
//! next LAPIC timer deadline with a store to memory instead of a WRMSR, so that a timer event
//! of a vCPU that arms and halts costs one exit (the HLT) instead of two.
//!
//! The guest finds the feature in lull's CPUID leaves (`0x40000100`: signature, `0x40000101`
//! EAX bit 0) and writes the guest-physical address of a per-CPU, 8-byte aligned `u64` slot to
//! `MSR_LULL_PV_DEADLINE` (bit 0: enable). From then on, writing a non-zero TSC value to the
//! slot is a write of IA32_TSC_DEADLINE that takes effect at the vCPU's next exit to lull: at
//! every exit, before the exit itself is handled, lull reads the slot and, if it is non-zero,
//! writes 0 back and applies the value as the MSR write (ignored unless the LVT timer is in
//! TSC-deadline mode, as the MSR write is). A slot value is therefore never lost and never
//! applied twice, and it is older than anything the exit itself does (a WRMSR at that exit
//! wins). The guest's side of the contract (`docs/GUEST-ABI.md`): the store is only
//! guaranteed to act once the vCPU halts or exits, so a guest that may keep running writes
//! the MSR instead. The vCPU thread alone touches the slot while the vCPU is out of the guest,
//! so there is no race with the guest's stores.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// `MSR_LULL_PV_DEADLINE` ("LUL" and 1).
pub const MSR_LULL_PV_DEADLINE: u32 = 0x4c55_4c01;
/// The enable bit of the MSR.
const ENABLED: u64 = 1;

/// A guest write of the MSR that lull refuses (#GP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PvDeadlineError {
    /// The slot is not 8-byte aligned.
    #[error("PV deadline slot {0:#x} is not 8-byte aligned")]
    Unaligned(u64),
    /// The slot is not in guest RAM.
    #[error("PV deadline slot {0:#x} is not in guest RAM")]
    NotRam(u64),
}

/// One vCPU's PV deadline state.
#[derive(Debug, Default)]
pub struct PvDeadline {
    msr: u64,
}

impl PvDeadline {
    /// The MSR's value.
    pub fn msr(&self) -> u64 {
        self.msr
    }

    /// A guest write of the MSR (bits 1 and 2 are part of the alignment check).
    pub fn write_msr(&mut self, value: u64, mem: &GuestMemoryMmap) -> Result<(), PvDeadlineError> {
        let addr = value & !ENABLED;
        if value & ENABLED != 0 {
            if !addr.is_multiple_of(8) {
                return Err(PvDeadlineError::Unaligned(addr));
            }
            if mem.read_obj::<u64>(GuestAddress(addr)).is_err() {
                return Err(PvDeadlineError::NotRam(addr));
            }
        }
        self.msr = value;
        Ok(())
    }

    /// At an exit: the deadline the guest stored since the last one, if any (the slot is
    /// cleared: each value is applied once).
    pub fn take(&self, mem: &GuestMemoryMmap) -> Option<u64> {
        if self.msr & ENABLED == 0 {
            return None;
        }
        let slot = GuestAddress(self.msr & !ENABLED);
        let value = mem.read_obj::<u64>(slot).ok().filter(|&v| v != 0)?;
        mem.write_obj(0u64, slot).ok()?;
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    #[test]
    fn a_stored_deadline_is_taken_once_and_only_when_enabled() {
        let m = mem();
        let mut pv = PvDeadline::default();
        m.write_obj(1234u64, GuestAddress(0x1000)).unwrap();
        assert_eq!(pv.take(&m), None, "disabled: the slot is not read");
        pv.write_msr(0x1000 | 1, &m).unwrap();
        assert_eq!(pv.take(&m), Some(1234));
        assert_eq!(m.read_obj::<u64>(GuestAddress(0x1000)).unwrap(), 0);
        assert_eq!(pv.take(&m), None, "taken once");
        m.write_obj(99u64, GuestAddress(0x1000)).unwrap();
        pv.write_msr(0x1000, &m).unwrap();
        assert_eq!(pv.take(&m), None, "disabled again");
        assert_eq!(m.read_obj::<u64>(GuestAddress(0x1000)).unwrap(), 99);
    }

    #[test]
    fn bad_slots_fault_and_keep_the_old_value() {
        let m = mem();
        let mut pv = PvDeadline::default();
        pv.write_msr(0x2000 | 1, &m).unwrap();
        assert_eq!(
            pv.write_msr(0x2004 | 1, &m),
            Err(PvDeadlineError::Unaligned(0x2004))
        );
        assert_eq!(
            pv.write_msr(0x1_0000 | 1, &m),
            Err(PvDeadlineError::NotRam(0x10000))
        );
        assert_eq!(pv.msr(), 0x2000 | 1);
        // A slot straddling the end of RAM is refused too.
        assert!(pv.write_msr(0xfffc | 1, &m).is_err());
    }
}
