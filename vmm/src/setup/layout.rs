//! Where things live in guest-physical memory (see docs/GUEST-ABI.md).

use crate::config::MAX_VIRTIO_DEVICES;

/// The GDT lull writes for the boot CPU.
pub const GDT_ADDR: u64 = 0x500;
/// An empty IDT (limit 0) for the boot CPU.
pub const IDT_ADDR: u64 = 0x520;
/// PVH `hvm_start_info`.
pub const PVH_INFO_ADDR: u64 = 0x6000;
/// PVH module list (the initramfs).
pub const PVH_MODLIST_ADDR: u64 = 0x6040;
/// PVH memory map.
pub const PVH_MEMMAP_ADDR: u64 = 0x6100;
/// Linux boot protocol "zero page" (`boot_params`).
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Initial stack for the 64-bit boot path.
pub const BOOT_STACK_TOP: u64 = 0x8ff0;
/// Page-map level 4 of the identity map (64-bit boot path).
pub const PML4_ADDR: u64 = 0x9000;
/// Page-directory-pointer table of the identity map.
pub const PDPTE_ADDR: u64 = 0xa000;
/// Page directory of the identity map (2 MiB pages, first 1 GiB).
pub const PDE_ADDR: u64 = 0xb000;
/// Kernel command line.
pub const CMDLINE_ADDR: u64 = 0x20000;
/// Most bytes of command line lull passes (Linux's x86 COMMAND_LINE_SIZE).
pub const CMDLINE_MAX: usize = 2048;
/// Start of the extended BIOS data area; the MP table lives here.
pub const EBDA_START: u64 = 0x9fc00;
/// End of conventional memory below 1 MiB.
pub const LOW_RAM_END: u64 = EBDA_START;
/// Where the kernel and high memory begin.
pub const HIMEM_START: u64 = 0x10_0000;
/// Start of the 32-bit MMIO hole (IOAPIC, LAPIC, firmware area).
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
/// End of the 32-bit MMIO hole.
pub const MMIO_HOLE_END: u64 = 1 << 32;
/// First virtio-mmio window (one `devices::virtio::mmio::WINDOW_SIZE` page per device, in
/// `--disk` order, then `--net` order), in the MMIO hole and far below the IOAPIC and LAPIC
/// pages.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// The IOAPIC input of each virtio-mmio device, in window order: ISA lines the MP table
/// declares (edge, active high) that no other lull device uses (COM1 is 4, the RTC 8). One
/// per device the configuration accepts (`config::MAX_VIRTIO_DEVICES`).
pub const VIRTIO_MMIO_IRQS: [u32; MAX_VIRTIO_DEVICES] = [5, 6, 7, 9, 10, 11, 14, 15];
/// IOAPIC MMIO base.
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;
/// LAPIC MMIO base.
pub const LAPIC_ADDR: u64 = 0xfee0_0000;
/// KVM's TSS area (three pages just below the BIOS ROM), needed on Intel hosts.
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;
/// KVM's identity-map page for real-mode emulation, just below the TSS.
pub const KVM_IDENTITY_MAP_ADDR: u64 = 0xfffb_c000;

/// A range of guest memory lull writes at boot, for every protocol or for some.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootData {
    /// First byte.
    pub start: u64,
    /// First byte after it.
    pub end: u64,
    /// What lull keeps there.
    pub what: &'static str,
}

/// Where lull writes the multiboot information block and its tables (one page).
pub const MULTIBOOT_INFO_ADDR: u64 = 0x6000;
/// Size of the page at [`MULTIBOOT_INFO_ADDR`].
pub const MULTIBOOT_INFO_PAGE: usize = 0x1000;

/// What lull writes in conventional memory (below [`LOW_RAM_END`]) when it boots a multiboot
/// image: the GDT and IDT, the multiboot information page, the command line. (The MP table
/// lives in the EBDA, which is not RAM in the memory map.)
pub const MULTIBOOT_BOOT_DATA: [BootData; 3] = [
    BootData {
        start: GDT_ADDR,
        end: IDT_ADDR + 8,
        what: "lull's GDT and IDT",
    },
    BootData {
        start: MULTIBOOT_INFO_ADDR,
        end: MULTIBOOT_INFO_ADDR + MULTIBOOT_INFO_PAGE as u64,
        what: "the multiboot information page",
    },
    BootData {
        start: CMDLINE_ADDR,
        end: CMDLINE_ADDR + CMDLINE_MAX as u64,
        what: "the command line",
    },
];

/// The guest RAM ranges (start, length) for `memory` bytes: below the MMIO hole, then above 4 GiB.
pub fn ram_ranges(memory: u64) -> Vec<(u64, u64)> {
    if memory <= MMIO_HOLE_START {
        vec![(0, memory)]
    } else {
        vec![
            (0, MMIO_HOLE_START),
            (MMIO_HOLE_END, memory - MMIO_HOLE_START),
        ]
    }
}

/// An e820 / PVH memory-map entry type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum E820Kind {
    /// Usable RAM.
    Ram = 1,
    /// Reserved.
    Reserved = 2,
}

/// One memory-map entry: start, length, kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// What it is.
    pub kind: E820Kind,
}

/// The memory map the guest sees for `memory` bytes of RAM.
pub fn e820_map(memory: u64) -> Vec<E820Entry> {
    let mut map = vec![
        E820Entry {
            addr: 0,
            size: LOW_RAM_END,
            kind: E820Kind::Ram,
        },
        E820Entry {
            addr: LOW_RAM_END,
            size: HIMEM_START - LOW_RAM_END,
            kind: E820Kind::Reserved,
        },
    ];
    for (start, len) in ram_ranges(memory) {
        let begin = start.max(HIMEM_START);
        let end = start + len;
        if end > begin {
            map.push(E820Entry {
                addr: begin,
                size: end - begin,
                kind: E820Kind::Ram,
            });
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_memory_is_one_range_and_map_skips_bios_area() {
        assert_eq!(ram_ranges(256 << 20), vec![(0, 256 << 20)]);
        let map = e820_map(256 << 20);
        assert_eq!(map.len(), 3);
        assert_eq!(
            map[2],
            E820Entry {
                addr: HIMEM_START,
                size: (256 << 20) - HIMEM_START,
                kind: E820Kind::Ram
            }
        );
    }

    #[test]
    fn large_memory_splits_around_the_hole() {
        let mem = 4u64 << 30;
        assert_eq!(
            ram_ranges(mem),
            vec![(0, MMIO_HOLE_START), (1 << 32, mem - MMIO_HOLE_START)]
        );
        let total: u64 = e820_map(mem)
            .iter()
            .filter(|e| e.kind == E820Kind::Ram)
            .map(|e| e.size)
            .sum();
        assert_eq!(total, mem - (HIMEM_START - LOW_RAM_END));
    }
}
