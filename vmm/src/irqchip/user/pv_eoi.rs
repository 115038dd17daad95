//! KVM's paravirtual EOI, driven by lull (`--irqchip user`): KVM implements the guest ABI only
//! for its own LAPIC, so lull offers the flag and reads it back itself.
//!
//! The guest (Linux `kvm_guest_apic_eoi_write`, or the kit's C guests with `pv_eoi=1`) writes
//! the guest-physical address of a per-CPU byte to `MSR_KVM_PV_EOI_EN` (bit 0: enable). Before
//! an entry, if the LAPIC allows it (`Lapic::pv_eoi_vector`: one edge-triggered vector in
//! service, nothing pending), lull sets bit 0 of that byte; the guest's EOI then clears the bit
//! instead of writing the EOI register, and takes no exit. At the next exit lull reads the
//! byte and clears it in any case: if the guest cleared it, the EOI happened
//! (`Lapic::pv_eoi`). One exit per interrupt saved; the rule "read back at every exit,
//! offered again at every entry" keeps the LAPIC exact whenever lull looks at it.

use devices::lapic::{Eoi, Lapic, LapicEvents};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// `MSR_KVM_PV_EOI_EN`.
pub const MSR_KVM_PV_EOI_EN: u32 = 0x4b56_4d04;
/// The enable bit of the MSR, and the "EOI pending" bit of the guest's byte.
const ENABLED: u64 = 1;

/// A guest write of the MSR lull refuses (#GP, as KVM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PvEoiError {
    /// The address is not 4-byte aligned.
    #[error("PV EOI address {0:#x} is not 4-byte aligned")]
    Unaligned(u64),
    /// The address is not in guest RAM.
    #[error("PV EOI address {0:#x} is not in guest RAM")]
    NotRam(u64),
}

/// One vCPU's PV EOI state.
#[derive(Debug, Default)]
pub struct PvEoi {
    msr: u64,
    /// The vector whose flag is set in guest memory (offered at the last entry).
    offered: Option<u8>,
}

impl PvEoi {
    /// The MSR's value.
    pub fn msr(&self) -> u64 {
        self.msr
    }

    /// A guest write of the MSR.
    pub fn write_msr(&mut self, value: u64, mem: &GuestMemoryMmap) -> Result<(), PvEoiError> {
        let addr = value & !ENABLED;
        if value & ENABLED != 0 {
            if !addr.is_multiple_of(4) {
                return Err(PvEoiError::Unaligned(addr));
            }
            if mem.read_obj::<u8>(GuestAddress(addr)).is_err() {
                return Err(PvEoiError::NotRam(addr));
            }
        }
        self.msr = value;
        self.offered = None;
        Ok(())
    }

    fn flag(&self) -> Option<GuestAddress> {
        (self.msr & ENABLED != 0).then_some(GuestAddress(self.msr & !ENABLED))
    }

    /// Before an entry: offers the flag for the vector in service, if the LAPIC allows it.
    pub fn before_entry<E: LapicEvents>(&mut self, lapic: &Lapic<E>, mem: &GuestMemoryMmap) {
        let Some(flag) = self.flag() else {
            return;
        };
        let vector = lapic.pv_eoi_vector();
        if vector.is_some() && mem.write_obj(1u8, flag).is_ok() {
            self.offered = vector;
        }
    }

    /// After an exit: takes the flag back; the EOI if the guest cleared it meanwhile.
    pub fn after_exit<E: LapicEvents>(
        &mut self,
        lapic: &mut Lapic<E>,
        mem: &GuestMemoryMmap,
    ) -> Option<Eoi> {
        let vector = self.offered.take()?;
        let flag = self.flag()?;
        let still_set = mem.read_obj::<u8>(flag).map_or(true, |b| b & 1 != 0);
        let _ = mem.write_obj(0u8, flag);
        if still_set {
            None
        } else {
            lapic.pv_eoi(vector)
        }
    }
}

#[cfg(test)]
mod tests {
    use devices::lapic::{Ipi, LapicConfig};
    use vm_memory::GuestMemoryMmap;

    use super::*;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    fn lapic_with_one_in_service(vector: u8) -> Lapic {
        let mut l = Lapic::new(LapicConfig::default()).unwrap();
        let _ = l.write_mmio(0xf0, &0x1ffu32.to_le_bytes(), 0);
        l.receive(&Ipi::fixed(vector, 0));
        l.interrupt_injected(vector);
        l
    }

    #[test]
    fn a_cleared_flag_is_an_eoi_and_a_set_one_is_not() {
        let m = mem();
        let mut pv = PvEoi::default();
        pv.write_msr(0x1000 | 1, &m).unwrap();
        let mut l = lapic_with_one_in_service(0x40);
        pv.before_entry(&l, &m);
        assert_eq!(m.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 1);
        // The guest did not EOI yet: the flag is taken back, nothing ends.
        assert_eq!(pv.after_exit(&mut l, &m), None);
        assert_eq!(m.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 0);
        assert!(l.pv_eoi_vector().is_some());
        // Offered again; this time the guest clears it.
        pv.before_entry(&l, &m);
        m.write_obj(0u8, GuestAddress(0x1000)).unwrap();
        let eoi = pv.after_exit(&mut l, &m).map(|e| e.vector);
        assert_eq!(eoi, Some(0x40));
        assert_eq!(l.pv_eoi_vector(), None);
        // Nothing offered: nothing read back, even if the byte says cleared.
        assert_eq!(pv.after_exit(&mut l, &m), None);
    }

    #[test]
    fn bad_addresses_fault_and_disabled_means_no_flag() {
        let m = mem();
        let mut pv = PvEoi::default();
        assert_eq!(
            pv.write_msr(0x1002 | 1, &m),
            Err(PvEoiError::Unaligned(0x1002))
        );
        assert_eq!(
            pv.write_msr(0x10_0000 | 1, &m),
            Err(PvEoiError::NotRam(0x10_0000))
        );
        pv.write_msr(0x2000, &m).unwrap();
        let l = lapic_with_one_in_service(0x40);
        pv.before_entry(&l, &m);
        assert_eq!(m.read_obj::<u8>(GuestAddress(0x2000)).unwrap(), 0);
        assert_eq!(pv.msr(), 0x2000);
    }
}
