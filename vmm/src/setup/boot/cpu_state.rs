//! The boot CPU's register state for each entry protocol: GDT, segments, control registers,
//! identity page tables.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

use crate::setup::layout::{
    BOOT_STACK_TOP, GDT_ADDR, IDT_ADDR, PDE_ADDR, PDPTE_ADDR, PML4_ADDR, ZERO_PAGE_ADDR,
};

const CR0_PE: u64 = 1;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
const RFLAGS_RESERVED: u64 = 2;

/// How the boot CPU enters the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryMode {
    /// PVH: 32-bit protected mode, paging off, `EBX` = `hvm_start_info`.
    Pvh {
        /// Entry point.
        entry: u64,
        /// Address of `hvm_start_info`.
        start_info: u64,
    },
    /// Multiboot v1: 32-bit protected mode, paging off, `EAX` = 0x2BADB002, `EBX` = the
    /// multiboot information block.
    Multiboot {
        /// Entry point.
        entry: u64,
        /// Address of the multiboot information block.
        info: u64,
    },
    /// Linux 64-bit boot protocol: long mode, identity-mapped first GiB, `RSI` = zero page.
    Linux64 {
        /// Entry point (`startup_64`).
        entry: u64,
    },
}

/// A GDT descriptor from its flags (access byte in bits 0-7, G/DB/L/AVL in bits 12-15),
/// base and limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let base = base as u64;
    let limit = limit as u64;
    let flags = flags as u64;
    ((base & 0xff00_0000) << 32)
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0x000f_0000) << 32)
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0xffff)
}

/// The KVM segment a GDT descriptor describes when loaded with selector `index * 8`.
pub fn segment_from_gdt(entry: u64, index: u8) -> kvm_segment {
    let base = ((entry >> 16) & 0x00ff_ffff) | ((entry >> 32) & 0xff00_0000);
    let raw_limit = (entry & 0xffff) | ((entry >> 32) & 0x000f_0000);
    let granular = (entry >> 55) & 1 == 1;
    let limit = if granular {
        (raw_limit << 12) | 0xfff
    } else {
        raw_limit
    };
    let bit = |n: u32| u8::from((entry >> n) & 1 == 1);
    kvm_segment {
        base,
        limit: u32::try_from(limit).unwrap_or(u32::MAX),
        selector: u16::from(index) * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        present: bit(47),
        dpl: ((entry >> 45) & 3) as u8,
        db: bit(54),
        s: bit(44),
        l: bit(53),
        g: bit(55),
        avl: bit(52),
        unusable: u8::from(bit(47) == 0),
        padding: 0,
    }
}

/// The GDT lull writes at [`GDT_ADDR`] for `mode`: null, code, data, TSS.
pub fn gdt(mode: EntryMode) -> [u64; 4] {
    match mode {
        EntryMode::Pvh { .. } | EntryMode::Multiboot { .. } => [
            0,
            gdt_entry(0xc09b, 0, 0xfffff), // 32-bit code, 4 GiB
            gdt_entry(0xc093, 0, 0xfffff), // data, 4 GiB
            gdt_entry(0x008b, 0, 0x67),    // TSS
        ],
        EntryMode::Linux64 { .. } => [
            0,
            gdt_entry(0xa09b, 0, 0xfffff), // 64-bit code
            gdt_entry(0xc093, 0, 0xfffff), // data
            gdt_entry(0x808b, 0, 0xfffff), // TSS
        ],
    }
}

/// The GDT as bytes.
pub fn gdt_bytes(mode: EntryMode) -> Vec<u8> {
    gdt(mode).iter().flat_map(|e| e.to_le_bytes()).collect()
}

/// Identity page tables for the first GiB (2 MiB pages): (address, bytes) to write.
pub fn identity_page_tables() -> Vec<(u64, Vec<u8>)> {
    let pml4 = (PDPTE_ADDR | 0x03).to_le_bytes().to_vec();
    let pdpte = (PDE_ADDR | 0x03).to_le_bytes().to_vec();
    let pde: Vec<u8> = (0u64..512)
        .flat_map(|i| ((i << 21) | 0x83).to_le_bytes())
        .collect();
    vec![(PML4_ADDR, pml4), (PDPTE_ADDR, pdpte), (PDE_ADDR, pde)]
}

/// Sets segments, descriptor tables and control registers of `sregs` for `mode`.
pub fn configure_sregs(sregs: &mut kvm_sregs, mode: EntryMode) {
    let table = gdt(mode);
    let code = segment_from_gdt(table[1], 1);
    let data = segment_from_gdt(table[2], 2);
    let tss = segment_from_gdt(table[3], 3);
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = u16::try_from(table.len() * 8 - 1).unwrap_or(u16::MAX);
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 0;
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;
    match mode {
        EntryMode::Pvh { .. } | EntryMode::Multiboot { .. } => {
            sregs.cr0 = CR0_PE | CR0_ET;
            sregs.cr3 = 0;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
        EntryMode::Linux64 { .. } => {
            sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
            sregs.cr3 = PML4_ADDR;
            sregs.cr4 = CR4_PAE;
            sregs.efer = EFER_LME | EFER_LMA;
        }
    }
}

/// The general registers at entry for `mode`.
pub fn boot_regs(mode: EntryMode) -> kvm_regs {
    match mode {
        EntryMode::Pvh { entry, start_info } => kvm_regs {
            rflags: RFLAGS_RESERVED,
            rip: entry,
            rbx: start_info,
            ..Default::default()
        },
        EntryMode::Multiboot { entry, info } => kvm_regs {
            rflags: RFLAGS_RESERVED,
            rip: entry,
            rax: u64::from(super::multiboot::BOOT_MAGIC),
            rbx: info,
            ..Default::default()
        },
        EntryMode::Linux64 { entry } => kvm_regs {
            rflags: RFLAGS_RESERVED,
            rip: entry,
            rsp: BOOT_STACK_TOP,
            rbp: BOOT_STACK_TOP,
            rsi: ZERO_PAGE_ADDR,
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_decode_to_flat_segments() {
        let code32 = segment_from_gdt(gdt_entry(0xc09b, 0, 0xfffff), 1);
        assert_eq!(
            (code32.base, code32.limit, code32.selector),
            (0, 0xffff_ffff, 8)
        );
        assert_eq!(
            (code32.type_, code32.db, code32.l, code32.g, code32.present),
            (0xb, 1, 0, 1, 1)
        );
        let code64 = segment_from_gdt(gdt_entry(0xa09b, 0, 0xfffff), 1);
        assert_eq!((code64.l, code64.db), (1, 0));
        let tss = segment_from_gdt(gdt_entry(0x008b, 0x1000, 0x67), 3);
        assert_eq!(
            (tss.base, tss.limit, tss.type_, tss.s, tss.g),
            (0x1000, 0x67, 0xb, 0, 0)
        );
        assert_eq!(segment_from_gdt(0, 0).unusable, 1);
    }

    #[test]
    fn modes_set_the_right_control_registers() {
        let mut s = kvm_sregs::default();
        configure_sregs(
            &mut s,
            EntryMode::Pvh {
                entry: 0x100000,
                start_info: 0x6000,
            },
        );
        assert_eq!((s.cr0 & CR0_PG, s.efer), (0, 0));
        configure_sregs(&mut s, EntryMode::Linux64 { entry: 0x100200 });
        assert_eq!(s.cr3, PML4_ADDR);
        assert_ne!(s.efer & EFER_LMA, 0);
        let r = boot_regs(EntryMode::Pvh {
            entry: 0x100000,
            start_info: 0x6000,
        });
        assert_eq!((r.rip, r.rbx), (0x100000, 0x6000));
        let mb = EntryMode::Multiboot {
            entry: 0x100000,
            info: 0x6000,
        };
        configure_sregs(&mut s, mb);
        assert_eq!((s.cr0 & CR0_PG, s.efer, s.cs.db, s.cs.l), (0, 0, 1, 0));
        let r = boot_regs(mb);
        assert_eq!((r.rip, r.rax, r.rbx), (0x100000, 0x2bad_b002, 0x6000));
    }

    #[test]
    fn page_tables_identity_map_one_gib() {
        let pt = identity_page_tables();
        let pde = &pt[2].1;
        assert_eq!(pde.len(), 4096);
        let last = u64::from_le_bytes(pde[4088..4096].try_into().unwrap());
        assert_eq!(last, (511 << 21) | 0x83);
    }
}
