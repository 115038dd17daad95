//! The Linux x86 boot protocol's `boot_params` ("zero page") for a bzImage, as linux-loader's
//! [`boot_params`], which `load` writes through its `LinuxBootConfigurator`.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use vm_memory::ByteValued;

use crate::setup::layout::E820Entry;

/// Size of `boot_params`.
pub const ZERO_PAGE_SIZE: usize = std::mem::size_of::<boot_params>();
const SETUP_HEADER_OFFSET: usize = 0x1f1;
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
) -> Result<boot_params, ZeroPageError> {
    // The setup header runs from 0x1f1 to 0x202 + the byte at 0x201. It is copied as bytes, as
    // long as the kernel says it is: linux-loader's `setup_header` is the newest protocol's,
    // longer than an older kernel's, whose bytes past its own header are not header fields.
    let header_end =
        0x202 + usize::from(*kernel_head.get(0x201).ok_or(ZeroPageError::ShortHeader)?);
    let header = kernel_head
        .get(SETUP_HEADER_OFFSET..header_end.min(ZERO_PAGE_SIZE))
        .ok_or(ZeroPageError::ShortHeader)?;
    let mut zp = boot_params::default();
    zp.as_mut_slice()[SETUP_HEADER_OFFSET..SETUP_HEADER_OFFSET + header.len()]
        .copy_from_slice(header);
    zp.hdr.type_of_loader = LOADER_UNDEFINED;
    let below_4g = |v: u64, what| u32::try_from(v).map_err(|_| ZeroPageError::Above4G(what));
    zp.hdr.cmd_line_ptr = below_4g(cmdline_addr, "The command line")?;
    if let Some((addr, size)) = initramfs {
        zp.hdr.ramdisk_image = below_4g(addr, "The initramfs")?;
        zp.hdr.ramdisk_size = below_4g(size, "The initramfs size")?;
    }
    if e820.len() > E820_MAX_ENTRIES {
        return Err(ZeroPageError::TooManyE820);
    }
    zp.e820_entries = u8::try_from(e820.len()).map_err(|_| ZeroPageError::TooManyE820)?;
    for (slot, e) in zp.e820_table.iter_mut().zip(e820) {
        *slot = boot_e820_entry {
            addr: e.addr,
            size: e.size,
            r#type: e.kind as u32,
        };
    }
    Ok(zp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::layout::e820_map;

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
        let zp = zp.as_slice();
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
