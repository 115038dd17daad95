//! Multiboot (version 1) images: an ELF32 file with a multiboot header in its first 8 KiB,
//! loaded by its program headers and entered as QEMU's `-kernel` enters it.
//!
//! Entry state (Multiboot specification 0.6.96, section 3.2): 32-bit protected mode, paging
//! off, flat 4 GiB code and data segments, `EAX` = [`BOOT_MAGIC`], `EBX` = the guest-physical
//! address of the multiboot information block lull writes at [`INFO_ADDR`]:
//! ```text
//!  INFO_ADDR + 0x000  multiboot_info (flags: mem, boot device, cmdline, mods, mmap, loader name)
//!            + 0x080  module list (16 bytes per module; --initramfs is module 0)
//!            + 0x0a0  boot loader name "lull"
//!            + 0x100  memory map (24 bytes per entry: size 20, base, length, type)
//!            + 0x400  module 0's string (its file name, as QEMU passes it)
//!  CMDLINE_ADDR       "<kernel path> <--cmdline>", as QEMU passes it
//! ```
//! Everything here is a pure function over bytes; `boot::load` writes the results.

use crate::setup::layout::{
    E820Entry, HIMEM_START, LOW_RAM_END, MMIO_HOLE_START, MULTIBOOT_BOOT_DATA,
};
pub use crate::setup::layout::{
    MULTIBOOT_INFO_ADDR as INFO_ADDR, MULTIBOOT_INFO_PAGE as INFO_PAGE,
};

/// The header magic an image carries (`0x1BADB002`).
pub const HEADER_MAGIC: u32 = 0x1BAD_B002;
/// What a multiboot loader puts in `EAX` at entry.
pub const BOOT_MAGIC: u32 = 0x2BAD_B002;
/// The header must lie, 4-byte aligned, within the first 8 KiB of the file.
pub const HEADER_SEARCH: usize = 8192;
const MODS_OFFSET: usize = 0x80;
const NAME_OFFSET: usize = 0xa0;
const MMAP_OFFSET: usize = 0x100;
const MOD_STRING_OFFSET: usize = 0x400;
/// The information block (0x78 bytes, up to the VBE fields) ends before the module list.
const _: () = assert!(0x78 <= MODS_OFFSET);
const LOADER_NAME: &[u8] = b"lull\0";
/// Header flags a loader must understand (bits 0-15) that lull honours: 0 page-align
/// modules, 1 provide memory information. Bit 2 (video mode) is accepted and ignored, as QEMU.
const KNOWN_REQUIRED_FLAGS: u32 = 0b111;
/// Header flag 16: the load addresses are in the header (the "a.out kludge").
const FLAG_ADDRESSES: u32 = 1 << 16;
const INFO_MEM: u32 = 1 << 0;
const INFO_BOOT_DEVICE: u32 = 1 << 1;
const INFO_CMDLINE: u32 = 1 << 2;
const INFO_MODS: u32 = 1 << 3;
const INFO_MMAP: u32 = 1 << 6;
const INFO_LOADER_NAME: u32 = 1 << 9;
/// "No boot device", as QEMU reports it.
const BOOT_DEVICE_NONE: u32 = 0x8000_ffff;
const PT_LOAD: u32 = 1;
const EM_386: u16 = 3;
const ET_EXEC: u16 = 2;

/// Why a multiboot image cannot be loaded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MultibootError {
    /// No valid multiboot header in the first 8 KiB.
    #[error("No multiboot header (magic 0x1BADB002 with a valid checksum) in the first 8 KiB: lull boots ELF32 images only if they are multiboot kernels")]
    NoHeader,
    /// The header asks for something lull does not do.
    #[error("The multiboot header requires features {0:#x} lull does not support (it honours flags 0-2)")]
    UnsupportedFlags(u32),
    /// The a.out kludge.
    #[error("The multiboot header sets flag 16 (load addresses in the header); lull loads only the ELF program headers: link the image as an ELF32 without that flag")]
    AddressKludge,
    /// The ELF header is not that of an i386 executable.
    #[error("Not a little-endian i386 ELF32 executable: {0}")]
    BadElf(&'static str),
    /// The file ends before a structure it describes.
    #[error("The image is truncated: {0} lies beyond the end of the file")]
    Truncated(&'static str),
    /// The file is larger than the RAM it could be loaded into.
    #[error("The image file ({size} bytes) is larger than the guest RAM it could load into ({high:#x} bytes)")]
    FileTooLarge {
        /// File size.
        size: u64,
        /// End of the RAM below the MMIO hole.
        high: u64,
    },
    /// A segment ends past the top of guest RAM (below the MMIO hole): more RAM helps.
    #[error("Segment at {addr:#x}+{size:#x} ends past the top of guest RAM at {high:#x}: increase --memory")]
    BeyondRam {
        /// Physical address.
        addr: u64,
        /// Size in memory.
        size: u64,
        /// End of usable RAM.
        high: u64,
    },
    /// A segment reaches the 32-bit MMIO hole, which no --memory turns into RAM.
    #[error("Segment at {addr:#x}+{size:#x} reaches the 32-bit MMIO hole at {MMIO_HOLE_START:#x} (IOAPIC, LAPIC): link the image below it")]
    InMmioHole {
        /// Physical address.
        addr: u64,
        /// Size in memory.
        size: u64,
    },
    /// A segment overlaps the EBDA and the VGA/BIOS area, which are no RAM in the memory map.
    #[error("Segment at {addr:#x}+{size:#x} overlaps [{LOW_RAM_END:#x}, {HIMEM_START:#x}) (the EBDA with lull's MP table, then the VGA and BIOS area), which is not RAM in the guest's memory map: link the image below {LOW_RAM_END:#x} or at 1 MiB or above")]
    NotRam {
        /// Physical address.
        addr: u64,
        /// Size in memory.
        size: u64,
    },
    /// A segment overlaps a structure lull writes in low memory at boot.
    #[error("Segment at {addr:#x}+{size:#x} overlaps {what} at [{start:#x}, {end:#x}), which lull writes there at boot: link the image to leave that range free")]
    OverlapsBootData {
        /// Physical address.
        addr: u64,
        /// Size in memory.
        size: u64,
        /// What lull keeps there.
        what: &'static str,
        /// Its first byte.
        start: u64,
        /// The first byte after it.
        end: u64,
    },
    /// No loadable segment.
    #[error("The ELF32 image has no loadable (PT_LOAD) segment")]
    NoSegments,
    /// The entry point is not inside a loaded segment.
    #[error("The entry point {0:#x} is outside every loaded segment")]
    EntryOutside(u64),
    /// A boot table does not fit its page.
    #[error("The multiboot {0} does not fit in lull's boot information page")]
    InfoTooLarge(&'static str),
}

/// A multiboot header found in an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Its offset in the file.
    pub offset: usize,
    /// Its flags.
    pub flags: u32,
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    let bytes = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

fn le16(b: &[u8], at: usize) -> Option<u16> {
    let bytes = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes(bytes.try_into().ok()?))
}

/// The first valid multiboot header in `head` (the file's first bytes), if any.
pub fn find_header(head: &[u8]) -> Option<Header> {
    let end = head.len().min(HEADER_SEARCH);
    (0..end.saturating_sub(11)).step_by(4).find_map(|offset| {
        let magic = le32(head, offset)?;
        let flags = le32(head, offset + 4)?;
        let checksum = le32(head, offset + 8)?;
        (magic == HEADER_MAGIC && magic.wrapping_add(flags).wrapping_add(checksum) == 0)
            .then_some(Header { offset, flags })
    })
}

/// True if `head` starts an ELF32 file with a multiboot header.
pub fn is_multiboot_elf32(head: &[u8]) -> bool {
    const ELFCLASS32: u8 = 1;
    head.len() >= 5
        && &head[..4] == b"\x7fELF"
        && head[4] == ELFCLASS32
        && find_header(head).is_some()
}

/// One ELF32 `PT_LOAD` segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Physical load address.
    pub paddr: u64,
    /// Offset of its bytes in the file.
    pub offset: u64,
    /// Bytes taken from the file.
    pub filesz: u64,
    /// Bytes in memory (the rest is zeroed).
    pub memsz: u64,
}

/// A parsed multiboot ELF32 image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Entry point.
    pub entry: u64,
    /// Segments to load.
    pub segments: Vec<Segment>,
}

impl Image {
    /// The first byte after the highest segment.
    pub fn end(&self) -> u64 {
        self.segments
            .iter()
            .map(|s| s.paddr + s.memsz)
            .max()
            .unwrap_or(0)
    }
}

/// Where a segment of `size` bytes at `addr` may not go: outside RAM (`[0, LOW_RAM_END)` and
/// `[1 MiB, ram_top)`, as the memory map says), or over what lull writes in low memory.
pub fn check_placement(addr: u64, size: u64, ram_top: u64) -> Result<(), MultibootError> {
    let end = addr.saturating_add(size);
    if end > MMIO_HOLE_START {
        return Err(MultibootError::InMmioHole { addr, size });
    }
    if end > ram_top {
        return Err(MultibootError::BeyondRam {
            addr,
            size,
            high: ram_top,
        });
    }
    if addr < HIMEM_START && end > LOW_RAM_END {
        return Err(MultibootError::NotRam { addr, size });
    }
    match MULTIBOOT_BOOT_DATA
        .iter()
        .find(|d| addr < d.end && d.start < end)
    {
        Some(d) => Err(MultibootError::OverlapsBootData {
            addr,
            size,
            what: d.what,
            start: d.start,
            end: d.end,
        }),
        None => Ok(()),
    }
}

/// Parses a whole multiboot ELF32 file and checks where its segments go
/// ([`check_placement`]).
pub fn parse(file: &[u8], ram_top: u64) -> Result<Image, MultibootError> {
    let header = find_header(file).ok_or(MultibootError::NoHeader)?;
    if header.flags & FLAG_ADDRESSES != 0 {
        return Err(MultibootError::AddressKludge);
    }
    let unknown = header.flags & 0xffff & !KNOWN_REQUIRED_FLAGS;
    if unknown != 0 {
        return Err(MultibootError::UnsupportedFlags(unknown));
    }
    if file.len() < 52 {
        return Err(MultibootError::Truncated("the ELF header"));
    }
    if &file[..4] != b"\x7fELF" || file[4] != 1 {
        return Err(MultibootError::BadElf("not ELFCLASS32"));
    }
    if file[5] != 1 {
        return Err(MultibootError::BadElf("not little-endian"));
    }
    if le16(file, 16) != Some(ET_EXEC) {
        return Err(MultibootError::BadElf("not an executable (ET_EXEC)"));
    }
    if le16(file, 18) != Some(EM_386) {
        return Err(MultibootError::BadElf("machine is not i386 (EM_386)"));
    }
    let field = |at| le32(file, at).ok_or(MultibootError::Truncated("the ELF header"));
    let entry = u64::from(field(24)?);
    let phoff = usize::try_from(field(28)?).map_err(|_| MultibootError::BadElf("e_phoff"))?;
    let phentsize = usize::from(le16(file, 42).unwrap_or(0));
    let phnum = usize::from(le16(file, 44).unwrap_or(0));
    if phentsize < 32 {
        return Err(MultibootError::BadElf(
            "program header entries shorter than 32 bytes",
        ));
    }
    let mut segments = Vec::new();
    for i in 0..phnum {
        let at = phentsize
            .checked_mul(i)
            .and_then(|o| o.checked_add(phoff))
            .ok_or(MultibootError::Truncated("the program headers"))?;
        let ph = |off: usize| {
            le32(file, at + off).ok_or(MultibootError::Truncated("the program headers"))
        };
        if ph(0)? != PT_LOAD {
            continue;
        }
        let seg = Segment {
            offset: u64::from(ph(4)?),
            paddr: u64::from(ph(12)?),
            filesz: u64::from(ph(16)?),
            memsz: u64::from(ph(20)?),
        };
        if seg.memsz == 0 {
            continue;
        }
        if seg.filesz > seg.memsz {
            return Err(MultibootError::BadElf(
                "a segment's file size exceeds its memory size",
            ));
        }
        if seg.offset + seg.filesz > file.len() as u64 {
            return Err(MultibootError::Truncated("a segment's bytes"));
        }
        check_placement(seg.paddr, seg.memsz, ram_top)?;
        segments.push(seg);
    }
    if segments.is_empty() {
        return Err(MultibootError::NoSegments);
    }
    if !segments
        .iter()
        .any(|s| entry >= s.paddr && entry < s.paddr + s.memsz)
    {
        return Err(MultibootError::EntryOutside(entry));
    }
    Ok(Image { entry, segments })
}

/// Top of the RAM a multiboot image may occupy for `memory` bytes of guest RAM.
pub fn ram_top(memory: u64) -> u64 {
    memory.min(MMIO_HOLE_START)
}

/// The command line a multiboot image sees: the program name, a space, lull's command line
/// (QEMU passes `"<kernel file> <-append>"`).
pub fn command_line(program: &str, cmdline: &str) -> String {
    format!("{program} {cmdline}")
}

/// What goes into the multiboot information page.
#[derive(Debug, Clone)]
pub struct BootInfo<'a> {
    /// Guest RAM size.
    pub memory: u64,
    /// Address of the NUL-terminated command line.
    pub cmdline_addr: u64,
    /// The memory map.
    pub memmap: &'a [E820Entry],
    /// Module 0 (the initramfs): address, size, string (its file name).
    pub module: Option<(u64, u64, &'a str)>,
}

fn put32(page: &mut [u8], at: usize, value: u32) {
    page[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn addr32(addr: u64, what: &'static str) -> Result<u32, MultibootError> {
    u32::try_from(addr).map_err(|_| MultibootError::InfoTooLarge(what))
}

/// The page to write at [`INFO_ADDR`]: the information block and its tables.
pub fn info_page(info: &BootInfo<'_>) -> Result<Vec<u8>, MultibootError> {
    let mut page = vec![0u8; INFO_PAGE];
    let base = |off: usize| INFO_ADDR + off as u64;
    let mut flags = INFO_MEM | INFO_BOOT_DEVICE | INFO_CMDLINE | INFO_MMAP | INFO_LOADER_NAME;
    // mem_lower: KiB of RAM from 0 (640 KiB less the EBDA); mem_upper: KiB from 1 MiB to the
    // first hole.
    let lower = info
        .memmap
        .iter()
        .find(|e| e.addr == 0 && e.kind == crate::setup::layout::E820Kind::Ram)
        .map_or(0, |e| e.size / 1024);
    let upper = ram_top(info.memory).saturating_sub(HIMEM_START) / 1024;
    put32(&mut page, 4, addr32(lower, "mem_lower")?);
    put32(&mut page, 8, addr32(upper, "mem_upper")?);
    put32(&mut page, 12, BOOT_DEVICE_NONE);
    put32(&mut page, 16, addr32(info.cmdline_addr, "command line")?);
    if let Some((start, size, name)) = info.module {
        flags |= INFO_MODS;
        let name = name.as_bytes();
        if name.len() + 1 > INFO_PAGE - MOD_STRING_OFFSET || name.contains(&0) {
            return Err(MultibootError::InfoTooLarge("module name"));
        }
        page[MOD_STRING_OFFSET..MOD_STRING_OFFSET + name.len()].copy_from_slice(name);
        put32(&mut page, 20, 1);
        put32(&mut page, 24, addr32(base(MODS_OFFSET), "module list")?);
        put32(&mut page, MODS_OFFSET, addr32(start, "module")?);
        put32(&mut page, MODS_OFFSET + 4, addr32(start + size, "module")?);
        put32(
            &mut page,
            MODS_OFFSET + 8,
            addr32(base(MOD_STRING_OFFSET), "module name")?,
        );
    }
    let mmap_len = info.memmap.len() * 24;
    if MMAP_OFFSET + mmap_len > MOD_STRING_OFFSET {
        return Err(MultibootError::InfoTooLarge("memory map"));
    }
    for (i, e) in info.memmap.iter().enumerate() {
        let at = MMAP_OFFSET + i * 24;
        put32(&mut page, at, 20);
        page[at + 4..at + 12].copy_from_slice(&e.addr.to_le_bytes());
        page[at + 12..at + 20].copy_from_slice(&e.size.to_le_bytes());
        put32(&mut page, at + 20, e.kind as u32);
    }
    put32(&mut page, 44, addr32(mmap_len as u64, "memory map")?);
    put32(&mut page, 48, addr32(base(MMAP_OFFSET), "memory map")?);
    page[NAME_OFFSET..NAME_OFFSET + LOADER_NAME.len()].copy_from_slice(LOADER_NAME);
    put32(&mut page, 64, addr32(base(NAME_OFFSET), "loader name")?);
    put32(&mut page, 0, flags);
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::layout::e820_map;

    /// A minimal multiboot ELF32: header, one PT_LOAD at `paddr` of `filesz` bytes.
    fn image(paddr: u32, filesz: u32, memsz: u32, entry: u32, flags: u32) -> Vec<u8> {
        let mut f = vec![0u8; 0x200];
        f[..7].copy_from_slice(b"\x7fELF\x01\x01\x01");
        f[16..18].copy_from_slice(&ET_EXEC.to_le_bytes());
        f[18..20].copy_from_slice(&EM_386.to_le_bytes());
        f[24..28].copy_from_slice(&entry.to_le_bytes());
        f[28..32].copy_from_slice(&52u32.to_le_bytes());
        f[42..44].copy_from_slice(&32u16.to_le_bytes());
        f[44..46].copy_from_slice(&1u16.to_le_bytes());
        let ph = 52;
        f[ph..ph + 4].copy_from_slice(&PT_LOAD.to_le_bytes());
        f[ph + 4..ph + 8].copy_from_slice(&0x100u32.to_le_bytes());
        f[ph + 12..ph + 16].copy_from_slice(&paddr.to_le_bytes());
        f[ph + 16..ph + 20].copy_from_slice(&filesz.to_le_bytes());
        f[ph + 20..ph + 24].copy_from_slice(&memsz.to_le_bytes());
        f[0x100..0x104].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        f[0x104..0x108].copy_from_slice(&flags.to_le_bytes());
        let sum = 0u32.wrapping_sub(HEADER_MAGIC).wrapping_sub(flags);
        f[0x108..0x10c].copy_from_slice(&sum.to_le_bytes());
        f
    }

    #[test]
    fn finds_header_and_parses_segments() {
        let f = image(0x10_0000, 0x100, 0x2000, 0x10_0010, 0);
        assert_eq!(
            find_header(&f),
            Some(Header {
                offset: 0x100,
                flags: 0
            })
        );
        assert!(is_multiboot_elf32(&f));
        let img = parse(&f, 64 << 20).unwrap();
        assert_eq!(img.entry, 0x10_0010);
        assert_eq!(img.end(), 0x10_2000);
        assert_eq!(img.segments[0].filesz, 0x100);
    }

    #[test]
    fn bad_images_are_refused_with_a_reason() {
        let mut f = image(0x10_0000, 0x100, 0x100, 0x10_0000, 0);
        f[0x108] ^= 1; // checksum
        assert_eq!(parse(&f, 64 << 20), Err(MultibootError::NoHeader));
        assert!(!is_multiboot_elf32(&f));
        let f = image(0x10_0000, 0x100, 0x100, 0x10_0000, 0);
        assert_eq!(
            parse(&f[..0x180], 64 << 20),
            Err(MultibootError::Truncated("a segment's bytes"))
        );
        let f = image(0x3ff_ff00, 0x100, 0x200, 0x3ff_ff00, 0);
        assert!(matches!(
            parse(&f, 64 << 20),
            Err(MultibootError::BeyondRam { .. })
        ));
        let f = image(0x10_0000, 0x100, 0x100, 0x20_0000, 0);
        assert_eq!(
            parse(&f, 64 << 20),
            Err(MultibootError::EntryOutside(0x20_0000))
        );
        let f = image(0x10_0000, 0x100, 0x100, 0x10_0000, FLAG_ADDRESSES);
        assert_eq!(parse(&f, 64 << 20), Err(MultibootError::AddressKludge));
        let f = image(0x10_0000, 0x100, 0x100, 0x10_0000, 1 << 5);
        assert_eq!(
            parse(&f, 64 << 20),
            Err(MultibootError::UnsupportedFlags(1 << 5))
        );
        let mut f = image(0x10_0000, 0x100, 0x100, 0x10_0000, 0);
        f[18] = 62; // EM_X86_64
        assert!(matches!(
            parse(&f, 64 << 20),
            Err(MultibootError::BadElf(_))
        ));
        // Huge counts and offsets never panic.
        let mut f = image(0x10_0000, 0x100, 0x100, 0x10_0000, 0);
        f[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        f[44..46].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(parse(&f, 64 << 20).is_err());
    }

    #[test]
    fn a_segment_below_1_mib_loads_where_ram_is_free() {
        // A real-mode test image at 0x8000: conventional RAM, clear of lull's structures.
        let f = image(0x8000, 0x100, 0x1000, 0x8000, 0);
        let img = parse(&f, 64 << 20).unwrap();
        assert_eq!((img.entry, img.end()), (0x8000, 0x9000));
        assert_eq!(check_placement(0, 0x500, 64 << 20), Ok(()));
        assert_eq!(check_placement(0x7000, 0x1000, 64 << 20), Ok(()));
        assert_eq!(
            check_placement(0x2_0800, LOW_RAM_END - 0x2_0800, 64 << 20),
            Ok(())
        );
    }

    #[test]
    fn a_misplaced_segment_is_refused_with_the_true_reason() {
        let top = 64 << 20;
        // Over the information page at 0x6000: named, with its range.
        let err = check_placement(0x5000, 0x2000, top).unwrap_err();
        assert_eq!(
            err,
            MultibootError::OverlapsBootData {
                addr: 0x5000,
                size: 0x2000,
                what: "the multiboot information page",
                start: INFO_ADDR,
                end: INFO_ADDR + INFO_PAGE as u64,
            }
        );
        assert!(!err.to_string().contains("--memory"));
        for (addr, what) in [
            (0x510, "lull's GDT and IDT"),
            (0x2_0000, "the command line"),
        ] {
            assert!(matches!(
                check_placement(addr, 0x10, top),
                Err(MultibootError::OverlapsBootData { what: w, .. }) if w == what
            ));
        }
        // Into the EBDA / VGA / BIOS range: not RAM, whatever --memory says.
        let err = check_placement(0x9_0000, 0x1_0000, top).unwrap_err();
        assert_eq!(
            err,
            MultibootError::NotRam {
                addr: 0x9_0000,
                size: 0x1_0000
            }
        );
        assert!(!err.to_string().contains("--memory"));
        assert!(matches!(
            check_placement(0xf_0000, 0x2_0000, top),
            Err(MultibootError::NotRam { .. })
        ));
        // Past the top of RAM: more RAM helps; into the MMIO hole: it does not.
        assert!(check_placement(top - 0x10, 0x20, top)
            .unwrap_err()
            .to_string()
            .contains("increase --memory"));
        let err = check_placement(MMIO_HOLE_START - 0x10, 0x20, MMIO_HOLE_START).unwrap_err();
        assert_eq!(
            err,
            MultibootError::InMmioHole {
                addr: MMIO_HOLE_START - 0x10,
                size: 0x20
            }
        );
        assert!(!err.to_string().contains("--memory"));
    }

    #[test]
    fn truncated_or_corrupted_images_never_panic() {
        let f = image(0x10_0000, 0x100, 0x2000, 0x10_0010, 0);
        for len in 0..f.len() {
            let _ = parse(&f[..len], 64 << 20);
        }
        for at in 0..f.len() {
            for value in [0x00, 0x7f, 0x80, 0xff] {
                let mut g = f.clone();
                g[at] = value;
                if let Ok(img) = parse(&g, 64 << 20) {
                    assert!(img.segments.iter().all(|s| s.paddr >= HIMEM_START
                        && s.paddr + s.memsz <= 64 << 20
                        && s.offset + s.filesz <= g.len() as u64));
                }
            }
        }
    }

    #[test]
    fn info_page_matches_the_specification() {
        let map = e820_map(128 << 20);
        let page = info_page(&BootInfo {
            memory: 128 << 20,
            cmdline_addr: 0x20000,
            memmap: &map,
            module: Some((0x700_0000, 0x1234, "initrd.img")),
        })
        .unwrap();
        let r = |at: usize| u32::from_le_bytes(page[at..at + 4].try_into().unwrap());
        assert_eq!(r(0), 0x24f);
        assert_eq!((r(4), r(8)), (639, (127 << 20) / 1024));
        assert_eq!(r(16), 0x20000);
        assert_eq!((r(20), r(24)), (1, 0x6080));
        assert_eq!(
            (r(0x80), r(0x84), r(0x88)),
            (0x700_0000, 0x700_1234, 0x6400)
        );
        assert_eq!(&page[0x400..0x40b], b"initrd.img\0");
        assert_eq!((r(44), r(48)), (72, 0x6100));
        assert_eq!((r(0x100), r(0x100 + 20)), (20, 1));
        assert_eq!(r(64), 0x60a0);
        assert_eq!(command_line("x.elf", "a=1"), "x.elf a=1");
    }
}
