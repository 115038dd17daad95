//! The Linux x86 boot protocol's `boot_params` ("zero page") for a bzImage.

use crate::layout::E820Entry;

/// Size of `boot_params`.
pub const ZERO_PAGE_SIZE: usize = 4096;
const E820_ENTRIES_OFFSET: usize = 0x1e8;
const SETUP_HEADER_OFFSET: usize = 0x1f1;
const TYPE_OF_LOADER_OFFSET: usize = 0x210;
const RAMDISK_IMAGE_OFFSET: usize = 0x218;
const RAMDISK_SIZE_OFFSET: usize = 0x21c;
const CMD_LINE_PTR_OFFSET: usize = 0x228;
const E820_TABLE_OFFSET: usize = 0x2d0;
const E820_MAX_ENTRIES: usize = 128;
/// "Undefined" boot loader id: lull has no assigned one.
const LOADER_UNDEFINED: u8 = 0xff;

/// The zero page could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ZeroPageError {
    /// The kernel's setup header is cut short.
    #[error("The bzImage setup header is truncated")]
    ShortHeader,
    /// An address does not fit the 32-bit fields of the boot protocol.
    #[error("{0} lies above 4 GiB, out of reach of the Linux boot protocol")]
    Above4G(&'static str),
    /// Too many memory-map entries.
    #[error("The memory map has more than {E820_MAX_ENTRIES} entries")]
    TooManyE820,
}

/// Builds `boot_params` from the kernel's own setup header (`image[0x1f1..]`), the command line,
/// the initramfs and the memory map.
pub fn build(
    kernel_head: &[u8],
    cmdline_addr: u64,
    initramfs: Option<(u64, u64)>,
    e820: &[E820Entry],
) -> Result<Vec<u8>, ZeroPageError> {
    // The setup header runs from 0x1f1 to 0x202 + the byte at 0x201.
    let header_end =
        0x202 + usize::from(*kernel_head.get(0x201).ok_or(ZeroPageError::ShortHeader)?);
    let header = kernel_head
        .get(SETUP_HEADER_OFFSET..header_end.min(ZERO_PAGE_SIZE))
        .ok_or(ZeroPageError::ShortHeader)?;
    let mut zp = vec![0u8; ZERO_PAGE_SIZE];
    zp[SETUP_HEADER_OFFSET..SETUP_HEADER_OFFSET + header.len()].copy_from_slice(header);
    zp[TYPE_OF_LOADER_OFFSET] = LOADER_UNDEFINED;
    let put32 = |zp: &mut Vec<u8>, off: usize, v: u64, what| -> Result<(), ZeroPageError> {
        let v = u32::try_from(v).map_err(|_| ZeroPageError::Above4G(what))?;
        zp[off..off + 4].copy_from_slice(&v.to_le_bytes());
        Ok(())
    };
    put32(
        &mut zp,
        CMD_LINE_PTR_OFFSET,
        cmdline_addr,
        "The command line",
    )?;
    if let Some((addr, size)) = initramfs {
        put32(&mut zp, RAMDISK_IMAGE_OFFSET, addr, "The initramfs")?;
        put32(&mut zp, RAMDISK_SIZE_OFFSET, size, "The initramfs size")?;
    }
    if e820.len() > E820_MAX_ENTRIES {
        return Err(ZeroPageError::TooManyE820);
    }
    zp[E820_ENTRIES_OFFSET] = u8::try_from(e820.len()).map_err(|_| ZeroPageError::TooManyE820)?;
    for (i, e) in e820.iter().enumerate() {
        let off = E820_TABLE_OFFSET + i * 20;
        zp[off..off + 8].copy_from_slice(&e.addr.to_le_bytes());
        zp[off + 8..off + 16].copy_from_slice(&e.size.to_le_bytes());
        zp[off + 16..off + 20].copy_from_slice(&(e.kind as u32).to_le_bytes());
    }
    Ok(zp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::e820_map;

    #[test]
    fn fields_land_where_linux_reads_them() {
        let mut head = vec![0u8; 1024];
        head[0x201] = 0x66; // header length byte
        head[0x202..0x206].copy_from_slice(b"HdrS");
        let zp = build(
            &head,
            0x20000,
            Some((0x100_0000, 0x500)),
            &e820_map(64 << 20),
        )
        .unwrap();
        assert_eq!(&zp[0x202..0x206], b"HdrS");
        assert_eq!(zp[0x210], 0xff);
        assert_eq!(
            u32::from_le_bytes(zp[0x228..0x22c].try_into().unwrap()),
            0x20000
        );
        assert_eq!(
            u32::from_le_bytes(zp[0x218..0x21c].try_into().unwrap()),
            0x100_0000
        );
        assert_eq!(zp[0x1e8], 3);
        assert!(build(&head[..0x100], 0, None, &[]).is_err());
    }
}
