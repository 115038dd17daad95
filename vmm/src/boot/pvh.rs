//! The PVH boot protocol's `hvm_start_info`, module list and memory map, as bytes.

use crate::layout::E820Entry;

/// Magic of `hvm_start_info` ("xEn3" with the high bit of each byte cleared).
pub const START_INFO_MAGIC: u32 = 0x336e_c578;

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
    /// `hvm_start_info` (version 1, 56 bytes).
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(56);
        b.extend_from_slice(&START_INFO_MAGIC.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes()); // version
        b.extend_from_slice(&0u32.to_le_bytes()); // flags
        let (nr_modules, modlist) = match self.initramfs {
            Some(_) => (1u32, self.modlist_addr),
            None => (0, 0),
        };
        b.extend_from_slice(&nr_modules.to_le_bytes());
        b.extend_from_slice(&modlist.to_le_bytes());
        b.extend_from_slice(&self.cmdline_addr.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes()); // rsdp_paddr: no ACPI
        b.extend_from_slice(&self.memmap_addr.to_le_bytes());
        let entries = u32::try_from(self.memmap.len()).unwrap_or(u32::MAX);
        b.extend_from_slice(&entries.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b
    }

    /// The module list (`hvm_modlist_entry`, 32 bytes each).
    pub fn modlist_bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        if let Some((addr, size)) = self.initramfs {
            b.extend_from_slice(&addr.to_le_bytes());
            b.extend_from_slice(&size.to_le_bytes());
            b.extend_from_slice(&0u64.to_le_bytes()); // no module command line
            b.extend_from_slice(&0u64.to_le_bytes());
        }
        b
    }

    /// The memory map (`hvm_memmap_table_entry`, 24 bytes each).
    pub fn memmap_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.memmap.len() * 24);
        for e in &self.memmap {
            b.extend_from_slice(&e.addr.to_le_bytes());
            b.extend_from_slice(&e.size.to_le_bytes());
            b.extend_from_slice(&(e.kind as u32).to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::e820_map;

    #[test]
    fn layout_matches_the_abi() {
        let si = StartInfo {
            cmdline_addr: 0x20000,
            modlist_addr: 0x6040,
            memmap_addr: 0x6100,
            initramfs: Some((0x0800_0000, 0x1234)),
            memmap: e820_map(128 << 20),
        };
        let h = si.header_bytes();
        assert_eq!(h.len(), 56);
        assert_eq!(&h[0..4], &START_INFO_MAGIC.to_le_bytes());
        assert_eq!(u32::from_le_bytes(h[12..16].try_into().unwrap()), 1);
        assert_eq!(u64::from_le_bytes(h[16..24].try_into().unwrap()), 0x6040);
        assert_eq!(u64::from_le_bytes(h[24..32].try_into().unwrap()), 0x20000);
        assert_eq!(u64::from_le_bytes(h[40..48].try_into().unwrap()), 0x6100);
        assert_eq!(u32::from_le_bytes(h[48..52].try_into().unwrap()), 3);
        assert_eq!(si.modlist_bytes().len(), 32);
        assert_eq!(si.memmap_bytes().len(), 72);
    }
}
