//! The PVH boot protocol's `hvm_start_info`, module list and memory map, as linux-loader's
//! structures, which `load` writes through its `PvhBootConfigurator`.

use linux_loader::configurator::BootParams;
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info, XEN_HVM_START_MAGIC_VALUE,
};
use vm_memory::GuestAddress;

use crate::setup::layout::E820Entry;

/// Magic of `hvm_start_info` ("xEn3" with the high bit of each byte cleared).
pub const START_INFO_MAGIC: u32 = XEN_HVM_START_MAGIC_VALUE;

/// Where each PVH structure goes and what it points to.
#[derive(Debug, Clone)]
pub struct StartInfo {
    /// Guest-physical address of the NUL-terminated command line.
    pub cmdline_addr: u64,
    /// Guest-physical address of the module list (used when `initramfs` is set).
    pub modlist_addr: u64,
    /// Guest-physical address of the memory map.
    pub memmap_addr: u64,
    /// The initramfs: address and size.
    pub initramfs: Option<(u64, u64)>,
    /// The memory map.
    pub memmap: Vec<E820Entry>,
}

impl StartInfo {
    /// `hvm_start_info` (version 1).
    pub fn header(&self) -> hvm_start_info {
        let (nr_modules, modlist_paddr) = match self.initramfs {
            Some(_) => (1, self.modlist_addr),
            None => (0, 0),
        };
        hvm_start_info {
            magic: START_INFO_MAGIC,
            version: 1,
            nr_modules,
            modlist_paddr,
            cmdline_paddr: self.cmdline_addr,
            rsdp_paddr: 0, // no ACPI
            memmap_paddr: self.memmap_addr,
            memmap_entries: u32::try_from(self.memmap.len()).unwrap_or(u32::MAX),
            ..hvm_start_info::default()
        }
    }

    /// The module list: the initramfs, if any, with no module command line.
    pub fn modules(&self) -> Vec<hvm_modlist_entry> {
        let entry = |(paddr, size)| hvm_modlist_entry {
            paddr,
            size,
            ..hvm_modlist_entry::default()
        };
        self.initramfs.into_iter().map(entry).collect()
    }

    /// The memory map.
    pub fn memmap(&self) -> Vec<hvm_memmap_table_entry> {
        let entry = |e: &E820Entry| hvm_memmap_table_entry {
            addr: e.addr,
            size: e.size,
            type_: e.kind as u32,
            reserved: 0,
        };
        self.memmap.iter().map(entry).collect()
    }

    /// All three, placed for linux-loader's `PvhBootConfigurator`: the start info at
    /// `info_addr`, the memory map and the module list (if any) at their addresses.
    pub fn boot_params(&self, info_addr: GuestAddress) -> BootParams {
        let mut params = BootParams::new(&self.header(), info_addr);
        params.set_sections(&self.memmap(), GuestAddress(self.memmap_addr));
        let modules = self.modules();
        if !modules.is_empty() {
            params.set_modules(&modules, GuestAddress(self.modlist_addr));
        }
        params
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::layout::e820_map;

    #[test]
    fn layout_matches_the_abi() {
        let si = StartInfo {
            cmdline_addr: 0x20000,
            modlist_addr: 0x6040,
            memmap_addr: 0x6100,
            initramfs: Some((0x0800_0000, 0x1234)),
            memmap: e820_map(128 << 20),
        };
        let params = si.boot_params(GuestAddress(0x6000));
        let h = &params.header;
        assert_eq!(h.len(), 56);
        assert_eq!(&h[0..4], &START_INFO_MAGIC.to_le_bytes());
        assert_eq!(u32::from_le_bytes(h[12..16].try_into().unwrap()), 1);
        assert_eq!(u64::from_le_bytes(h[16..24].try_into().unwrap()), 0x6040);
        assert_eq!(u64::from_le_bytes(h[24..32].try_into().unwrap()), 0x20000);
        assert_eq!(u64::from_le_bytes(h[40..48].try_into().unwrap()), 0x6100);
        assert_eq!(u32::from_le_bytes(h[48..52].try_into().unwrap()), 3);
        assert_eq!(params.modules.as_ref().map(Vec::len), Some(32));
        assert_eq!(params.modules_start, Some(GuestAddress(0x6040)));
        assert_eq!(params.sections.as_ref().map(Vec::len), Some(72));
        assert_eq!(params.sections_start, Some(GuestAddress(0x6100)));
        assert_eq!(params.header_start, GuestAddress(0x6000));
    }
}
