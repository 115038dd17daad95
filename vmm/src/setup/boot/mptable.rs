//! The Intel MultiProcessor Specification 1.4 table that tells the guest about its CPUs,
//! its IOAPIC and how ISA IRQs are wired.
//!
//! Layout: the floating pointer structure, then the configuration table header and its
//! entries, all inside the EBDA at [`EBDA_START`](crate::setup::layout::EBDA_START).

use crate::setup::layout::{EBDA_START, HIMEM_START, IOAPIC_ADDR, LAPIC_ADDR};

/// The table does not fit where it must go.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum MpTableError {
    /// Too many CPUs for the EBDA.
    #[error("The MP table for {0} CPUs does not fit in the EBDA")]
    TooLarge(u32),
}

const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const CPU_FLAG_ENABLED: u8 = 1;
const CPU_FLAG_BSP: u8 = 2;
const ISA_BUS_ID: u8 = 0;
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;
const ALL_LAPICS: u8 = 0xff;
/// CPUID.1 EAX-style signature of a generic family-6 CPU, and FPU+APIC feature flags.
const CPU_SIGNATURE: u32 = 0x600;
const CPU_FEATURES: u32 = 0x201;

/// Little-endian byte writer.
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
}

fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |acc, b| acc.wrapping_add(*b))
        .wrapping_neg()
}

/// The MP table for `cpus` CPUs as bytes to be written at [`EBDA_START`]; the IOAPIC gets ID
/// `cpus`.
pub fn build(cpus: u32) -> Result<Vec<u8>, MpTableError> {
    let too_large = MpTableError::TooLarge(cpus);
    let cpu_count = u8::try_from(cpus).map_err(|_| too_large.clone())?;
    let ioapic_id = cpu_count;
    let table_addr = u32::try_from(EBDA_START + 16).map_err(|_| too_large.clone())?;
    let ioapic_addr = u32::try_from(IOAPIC_ADDR).map_err(|_| too_large.clone())?;

    let mut entries = Out(Vec::new());
    let mut count = processor_entries(&mut entries, cpu_count);
    count += bus_and_ioapic_entries(&mut entries, ioapic_id, ioapic_addr);
    count += interrupt_entries(&mut entries, ioapic_id);
    let table = config_table(&entries, count, &too_large)?;
    let out = floating_pointer(table_addr, &table);

    if EBDA_START + out.0.len() as u64 > HIMEM_START {
        return Err(too_large);
    }
    Ok(out.0)
}

/// One processor entry per CPU (CPU 0 the bootstrap processor); returns how many.
fn processor_entries(entries: &mut Out, cpu_count: u8) -> u16 {
    let mut count: u16 = 0;
    for id in 0..cpu_count {
        entries.u8(0); // processor
        entries.u8(id);
        entries.u8(APIC_VERSION);
        entries.u8(CPU_FLAG_ENABLED | if id == 0 { CPU_FLAG_BSP } else { 0 });
        entries.u32(CPU_SIGNATURE);
        entries.u32(CPU_FEATURES);
        entries.bytes(&[0; 8]);
        count += 1;
    }
    count
}

/// The ISA bus and the IOAPIC (ID `ioapic_id`, at `ioapic_addr`) entries; returns how many.
fn bus_and_ioapic_entries(entries: &mut Out, ioapic_id: u8, ioapic_addr: u32) -> u16 {
    entries.u8(1); // bus
    entries.u8(ISA_BUS_ID);
    entries.bytes(b"ISA   ");
    entries.u8(2); // IOAPIC
    entries.u8(ioapic_id);
    entries.u8(IOAPIC_VERSION);
    entries.u8(1); // enabled
    entries.u32(ioapic_addr);
    2
}

/// The I/O interrupt entries of the 16 ISA IRQs and the local interrupt entries (LINT0
/// ExtINT, LINT1 NMI); returns how many.
fn interrupt_entries(entries: &mut Out, ioapic_id: u8) -> u16 {
    let mut count: u16 = 0;
    for irq in 0u8..16 {
        // ISA IRQ 0 (the PIT) is wired to IOAPIC pin 2, as on PC chipsets; the rest 1:1.
        let (kind, pin) = match irq {
            0 => (INT_TYPE_INT, 2),
            2 => (INT_TYPE_EXTINT, 0),
            n => (INT_TYPE_INT, n),
        };
        entries.u8(3); // I/O interrupt
        entries.u8(kind);
        entries.u16(0); // conforming polarity and trigger
        entries.u8(ISA_BUS_ID);
        entries.u8(irq);
        entries.u8(ioapic_id);
        entries.u8(pin);
        count += 1;
    }
    for (kind, lint) in [(INT_TYPE_EXTINT, 0u8), (INT_TYPE_NMI, 1)] {
        entries.u8(4); // local interrupt
        entries.u8(kind);
        entries.u16(0);
        entries.u8(ISA_BUS_ID);
        entries.u8(0);
        entries.u8(ALL_LAPICS);
        entries.u8(lint);
        count += 1;
    }
    count
}

/// The configuration table: its header, checksummed, then the `count` `entries`.
fn config_table(entries: &Out, count: u16, too_large: &MpTableError) -> Result<Out, MpTableError> {
    let base_len = u16::try_from(44 + entries.0.len()).map_err(|_| too_large.clone())?;
    let mut table = Out(Vec::new());
    table.bytes(b"PCMP");
    table.u16(base_len);
    table.u8(4); // spec revision 1.4
    table.u8(0); // checksum, patched below
    table.bytes(b"LULL    ");
    table.bytes(b"LULL-VM     ");
    table.u32(0); // OEM table pointer
    table.u16(0); // OEM table size
    table.u16(count);
    table.u32(u32::try_from(LAPIC_ADDR).map_err(|_| too_large.clone())?);
    table.u16(0); // extended table length
    table.u8(0); // extended table checksum
    table.u8(0);
    table.bytes(&entries.0);
    table.0[7] = checksum(&table.0);
    Ok(table)
}

/// The floating pointer structure, checksummed, pointing at `table_addr`, followed by the
/// configuration table `table` that it points at.
fn floating_pointer(table_addr: u32, table: &Out) -> Out {
    let mut out = Out(Vec::new());
    out.bytes(b"_MP_");
    out.u32(table_addr);
    out.u8(1); // length in 16-byte units
    out.u8(4);
    out.u8(0); // checksum, patched below
    out.bytes(&[0; 5]); // feature bytes: 0 = a configuration table is present
    out.0[10] = checksum(&out.0);
    out.bytes(&table.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    #[test]
    fn checksums_and_counts_are_right() {
        for cpus in [1u32, 2, 4, 64, 254] {
            let t = build(cpus).unwrap();
            assert_eq!(&t[0..4], b"_MP_");
            assert_eq!(sum(&t[0..16]), 0);
            let table = &t[16..];
            assert_eq!(&table[0..4], b"PCMP");
            let len = usize::from(u16::from_le_bytes([table[4], table[5]]));
            assert_eq!(len, table.len());
            assert_eq!(sum(table), 0);
            let count = u16::from_le_bytes([table[34], table[35]]);
            assert_eq!(u32::from(count), cpus + 2 + 16 + 2);
            // First processor is the BSP, the rest are not.
            assert_eq!(table[44 + 3], CPU_FLAG_ENABLED | CPU_FLAG_BSP);
            if cpus > 1 {
                assert_eq!(table[44 + 20 + 3], CPU_FLAG_ENABLED);
            }
        }
    }

    #[test]
    fn too_many_cpus_is_an_error() {
        assert!(build(300).is_err());
    }
}
