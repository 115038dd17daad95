//! Loading a guest into memory and deciding how its boot CPU enters it.
//!
//! The kernel format is detected from the file: an ELF64 with a PVH note is entered through PVH
//! (32-bit, paging off); a bzImage through the Linux 64-bit boot protocol. Everything else the
//! guest needs at boot (command line, initramfs, memory map, MP table, GDT) is written here.

pub mod cpu_state;
pub mod mptable;
pub mod multiboot;
pub mod pvh;
pub mod zeropage;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{self, BootConfigurator, BootParams};
use linux_loader::loader::{self, KernelLoader, PvhBootCapability};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::setup::layout::{
    self, CMDLINE_ADDR, CMDLINE_MAX, EBDA_START, GDT_ADDR, HIMEM_START, IDT_ADDR, MMIO_HOLE_START,
    PVH_INFO_ADDR, PVH_MEMMAP_ADDR, PVH_MODLIST_ADDR, ZERO_PAGE_ADDR,
};
pub use cpu_state::EntryMode;

/// The kernel file formats lull boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    /// ELF64 (entered through its PVH note).
    Elf,
    /// Linux bzImage.
    BzImage,
    /// ELF32 with a multiboot (v1) header.
    Multiboot,
}

/// Why a guest could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The kernel file cannot be opened or read.
    #[error("Cannot read kernel {path}: {source}")]
    ReadKernel {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The kernel is neither an ELF64 nor a bzImage.
    #[error("{0} is not a kernel lull can boot: expected an ELF64 with a PVH note (vmlinux), a bzImage, or an ELF32 multiboot kernel")]
    UnknownFormat(PathBuf),
    /// An ELF without the PVH entry note.
    #[error("{0} has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): build the kernel with CONFIG_PVH=y, or boot its bzImage")]
    NoPvhNote(PathBuf),
    /// An ELF64 with a multiboot header and no PVH note.
    #[error("{0} is an ELF64 multiboot kernel; multiboot kernels boot as ELF32 (as under QEMU): convert it with `objcopy -O elf32-i386`")]
    Elf64Multiboot(PathBuf),
    /// linux-loader refused the image.
    #[error("Cannot load kernel {path}: {source} (is it truncated, or larger than --memory?)")]
    Load {
        /// The file.
        path: PathBuf,
        /// Why.
        source: loader::Error,
    },
    /// The initramfs cannot be read.
    #[error("Cannot read initramfs {path}: {source}")]
    ReadInitramfs {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The initramfs does not fit between the kernel and the end of low memory.
    #[error("The initramfs ({size} bytes) does not fit in guest memory above the kernel: increase --memory")]
    InitramfsTooLarge {
        /// Its size.
        size: u64,
    },
    /// The command line is too long.
    #[error("The kernel command line is {0} bytes; the limit is {max}", max = CMDLINE_MAX - 1)]
    CmdlineTooLong(usize),
    /// The command line contains a NUL byte.
    #[error("The kernel command line contains a NUL byte")]
    CmdlineNul,
    /// A multiboot image cannot be loaded.
    #[error("Cannot load multiboot kernel {path}: {reason}")]
    Multiboot {
        /// The file.
        path: PathBuf,
        /// Why (part of the message, not a separate error in the chain).
        reason: multiboot::MultibootError,
    },
    /// The MP table cannot be built.
    #[error(transparent)]
    MpTable(#[from] mptable::MpTableError),
    /// The zero page cannot be built.
    #[error(transparent)]
    ZeroPage(#[from] zeropage::ZeroPageError),
    /// Writing a boot structure to guest memory failed.
    #[error("Cannot write {what} to guest memory: {source}")]
    WriteMemory {
        /// The structure.
        what: &'static str,
        /// Why.
        source: vm_memory::GuestMemoryError,
    },
    /// linux-loader's boot configurator could not write a boot structure to guest memory.
    #[error("Cannot write {what} to guest memory: {source}")]
    Configure {
        /// The structure.
        what: &'static str,
        /// Why.
        source: configurator::Error,
    },
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct BootSpec<'a> {
    /// Kernel file.
    pub kernel: &'a Path,
    /// Initramfs file.
    pub initramfs: Option<&'a Path>,
    /// Kernel command line.
    pub cmdline: &'a str,
    /// vCPU count (for the MP table).
    pub cpus: u32,
    /// Guest RAM size.
    pub memory: u64,
}

/// Checks, before any KVM work, that the kernel is a readable file of a known format and the
/// initramfs a readable file.
pub fn probe(kernel: &Path, initramfs: Option<&Path>) -> Result<KernelFormat, BootError> {
    let mut file = File::open(kernel).map_err(|source| BootError::ReadKernel {
        path: kernel.to_path_buf(),
        source,
    })?;
    let format = detect_format(kernel, &mut file)?;
    if let Some(path) = initramfs {
        File::open(path)
            .and_then(|f| f.metadata())
            .map_err(|source| BootError::ReadInitramfs {
                path: path.to_path_buf(),
                source,
            })?;
    }
    Ok(format)
}

/// Detects the kernel format from the file's first bytes.
pub fn detect_format(path: &Path, file: &mut File) -> Result<KernelFormat, BootError> {
    let read_err = |source| BootError::ReadKernel {
        path: path.to_path_buf(),
        source,
    };
    let mut head = [0u8; multiboot::HEADER_SEARCH];
    file.seek(SeekFrom::Start(0)).map_err(read_err)?;
    let n = read_up_to(file, &mut head).map_err(read_err)?;
    format_of(&head[..n]).ok_or_else(|| BootError::UnknownFormat(path.to_path_buf()))
}

/// The format of a kernel whose file starts with `head`.
pub fn format_of(head: &[u8]) -> Option<KernelFormat> {
    const ELFCLASS64: u8 = 2;
    if head.len() >= 5 && &head[..4] == b"\x7fELF" && head[4] == ELFCLASS64 {
        Some(KernelFormat::Elf)
    } else if head.get(0x202..0x206) == Some(b"HdrS") {
        Some(KernelFormat::BzImage)
    } else if multiboot::is_multiboot_elf32(head) {
        Some(KernelFormat::Multiboot)
    } else {
        None
    }
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut total = 0;
    while total < buf.len() {
        match file.read(&mut buf[total..])? {
            0 => break,
            n => total += n,
        }
    }
    Ok(total)
}

fn write(
    mem: &GuestMemoryMmap,
    addr: u64,
    bytes: &[u8],
    what: &'static str,
) -> Result<(), BootError> {
    mem.write_slice(bytes, GuestAddress(addr))
        .map_err(|source| BootError::WriteMemory { what, source })
}

/// Loads the guest described by `spec` into `mem`; returns how the boot CPU enters it.
pub fn load(mem: &GuestMemoryMmap, spec: &BootSpec<'_>) -> Result<EntryMode, BootError> {
    let path = spec.kernel;
    let mut file = File::open(path).map_err(|source| read_kernel_err(path, source))?;
    let format = detect_format(path, &mut file)?;
    write_cmdline(mem, spec.cmdline)?;
    let (kernel_end, mode) = match format {
        KernelFormat::Elf => load_elf(mem, path, &mut file)?,
        KernelFormat::BzImage => load_bzimage(mem, path, &mut file)?,
        KernelFormat::Multiboot => load_multiboot(mem, path, &mut file, spec.memory)?,
    };
    // Initramfs at the top of low memory, page aligned.
    let initramfs = match spec.initramfs {
        None => None,
        Some(ipath) => Some(load_initramfs(mem, ipath, kernel_end, spec.memory)?),
    };
    let e820 = layout::e820_map(spec.memory);
    write_cpu_tables(mem, spec.cpus, mode)?;
    match mode {
        EntryMode::Pvh { .. } => write_pvh_start_info(mem, initramfs, e820)?,
        EntryMode::Multiboot { info, .. } => {
            write_multiboot_info(mem, spec, info, initramfs, &e820)?;
        }
        EntryMode::Linux64 { .. } => write_zero_page(mem, path, &mut file, initramfs, &e820)?,
    }
    Ok(mode)
}

fn read_kernel_err(path: &Path, source: std::io::Error) -> BootError {
    BootError::ReadKernel {
        path: path.to_path_buf(),
        source,
    }
}

fn load_err(path: &Path, source: loader::Error) -> BootError {
    BootError::Load {
        path: path.to_path_buf(),
        source,
    }
}

/// Checks the command line and writes it, NUL-terminated, at `CMDLINE_ADDR`.
fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &str) -> Result<(), BootError> {
    if cmdline.len() >= CMDLINE_MAX {
        return Err(BootError::CmdlineTooLong(cmdline.len()));
    }
    if cmdline.contains('\0') {
        return Err(BootError::CmdlineNul);
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    write(mem, CMDLINE_ADDR, &bytes, "the command line")
}

/// Loads an ELF64 kernel entered through its PVH note; returns its end and entry mode. One
/// without the note is refused, and told apart from an ELF64 multiboot kernel.
fn load_elf(
    mem: &GuestMemoryMmap,
    path: &Path,
    file: &mut File,
) -> Result<(u64, EntryMode), BootError> {
    let res = loader::Elf::load(mem, None, file, Some(GuestAddress(HIMEM_START)))
        .map_err(|source| load_err(path, source))?;
    let PvhBootCapability::PvhEntryPresent(entry) = res.pvh_boot_cap else {
        let mut head = vec![0u8; multiboot::HEADER_SEARCH];
        let n = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| read_up_to(file, &mut head))
            .unwrap_or(0);
        if multiboot::find_header(&head[..n]).is_some() {
            return Err(BootError::Elf64Multiboot(path.to_path_buf()));
        }
        return Err(BootError::NoPvhNote(path.to_path_buf()));
    };
    let mode = EntryMode::Pvh {
        entry: entry.0,
        start_info: PVH_INFO_ADDR,
    };
    Ok((res.kernel_end, mode))
}

/// Loads a bzImage's protected-mode kernel; returns its end and the 64-bit entry mode.
fn load_bzimage(
    mem: &GuestMemoryMmap,
    path: &Path,
    file: &mut File,
) -> Result<(u64, EntryMode), BootError> {
    let res = loader::BzImage::load(mem, None, file, Some(GuestAddress(HIMEM_START)))
        .map_err(|source| load_err(path, source))?;
    let mode = EntryMode::Linux64 {
        entry: res.kernel_load.0 + 0x200,
    };
    Ok((res.kernel_end, mode))
}

/// Writes what every boot CPU finds: the MP table, the GDT for `mode` and an empty IDT.
fn write_cpu_tables(mem: &GuestMemoryMmap, cpus: u32, mode: EntryMode) -> Result<(), BootError> {
    write(mem, EBDA_START, &mptable::build(cpus)?, "the MP table")?;
    write(mem, GDT_ADDR, &cpu_state::gdt_bytes(mode), "the GDT")?;
    write(mem, IDT_ADDR, &0u64.to_le_bytes(), "the IDT")
}

/// Writes the PVH start info, module list and memory map through linux-loader.
fn write_pvh_start_info(
    mem: &GuestMemoryMmap,
    initramfs: Option<(u64, u64)>,
    e820: Vec<layout::E820Entry>,
) -> Result<(), BootError> {
    let info = pvh::StartInfo {
        cmdline_addr: CMDLINE_ADDR,
        modlist_addr: PVH_MODLIST_ADDR,
        memmap_addr: PVH_MEMMAP_ADDR,
        initramfs,
        memmap: e820,
    };
    PvhBootConfigurator::write_bootparams(&info.boot_params(GuestAddress(PVH_INFO_ADDR)), mem)
        .map_err(|source| BootError::Configure {
            what: "the PVH start info",
            source,
        })
}

/// Writes a multiboot kernel's command line (its path first, as QEMU passes it) over the plain
/// one, and its information page at `info`.
fn write_multiboot_info(
    mem: &GuestMemoryMmap,
    spec: &BootSpec<'_>,
    info: u64,
    initramfs: Option<(u64, u64)>,
    e820: &[layout::E820Entry],
) -> Result<(), BootError> {
    let path = spec.kernel;
    let program = path.to_string_lossy();
    let line = multiboot::command_line(&program, spec.cmdline);
    if line.len() >= CMDLINE_MAX {
        return Err(BootError::CmdlineTooLong(line.len()));
    }
    let mut bytes = line.into_bytes();
    bytes.push(0);
    write(mem, CMDLINE_ADDR, &bytes, "the command line")?;
    let names = spec.initramfs.map(|p| p.to_string_lossy().into_owned());
    let page = multiboot::info_page(&multiboot::BootInfo {
        memory: spec.memory,
        cmdline_addr: CMDLINE_ADDR,
        memmap: e820,
        module: initramfs.zip(names.as_deref()).map(|((a, s), n)| (a, s, n)),
    })
    .map_err(|reason| BootError::Multiboot {
        path: path.to_path_buf(),
        reason,
    })?;
    write(mem, info, &page, "the multiboot information")
}

/// Writes a bzImage's zero page (its own setup header, re-read from the file) through
/// linux-loader, and the identity page tables its 64-bit entry needs.
fn write_zero_page(
    mem: &GuestMemoryMmap,
    path: &Path,
    file: &mut File,
    initramfs: Option<(u64, u64)>,
    e820: &[layout::E820Entry],
) -> Result<(), BootError> {
    let mut head = vec![0u8; 0x400];
    file.seek(SeekFrom::Start(0))
        .map_err(|source| read_kernel_err(path, source))?;
    let n = read_up_to(file, &mut head).map_err(|source| read_kernel_err(path, source))?;
    let zp = zeropage::build(&head[..n], CMDLINE_ADDR, initramfs, e820)?;
    let params = BootParams::new(&zp, GuestAddress(ZERO_PAGE_ADDR));
    LinuxBootConfigurator::write_bootparams(&params, mem).map_err(|source| {
        BootError::Configure {
            what: "the zero page",
            source,
        }
    })?;
    for (addr, bytes) in cpu_state::identity_page_tables() {
        write(mem, addr, &bytes, "the page tables")?;
    }
    Ok(())
}

/// Reads, checks and loads a multiboot ELF32 image; returns its end and entry mode.
fn load_multiboot(
    mem: &GuestMemoryMmap,
    path: &Path,
    file: &mut File,
    memory: u64,
) -> Result<(u64, EntryMode), BootError> {
    let read_err = |source| BootError::ReadKernel {
        path: path.to_path_buf(),
        source,
    };
    let top = multiboot::ram_top(memory);
    let size = file.metadata().map_err(read_err)?.len();
    if size > top {
        return Err(BootError::Multiboot {
            path: path.to_path_buf(),
            reason: multiboot::MultibootError::FileTooLarge { size, high: top },
        });
    }
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(0)).map_err(read_err)?;
    file.read_to_end(&mut bytes).map_err(read_err)?;
    let image = multiboot::parse(&bytes, top).map_err(|reason| BootError::Multiboot {
        path: path.to_path_buf(),
        reason,
    })?;
    const ZEROS: [u8; 4096] = [0; 4096];
    for seg in &image.segments {
        // parse() checked that offset + filesz lies within the file and the segment in RAM.
        let start = usize::try_from(seg.offset).unwrap_or(usize::MAX);
        let len = usize::try_from(seg.filesz).unwrap_or(usize::MAX);
        let data = bytes
            .get(start..start.saturating_add(len))
            .ok_or(BootError::Multiboot {
                path: path.to_path_buf(),
                reason: multiboot::MultibootError::Truncated("a segment's bytes"),
            })?;
        write(mem, seg.paddr, data, "a multiboot segment")?;
        let mut addr = seg.paddr + seg.filesz;
        while addr < seg.paddr + seg.memsz {
            let n = (seg.paddr + seg.memsz - addr).min(ZEROS.len() as u64);
            let n_usize = usize::try_from(n).unwrap_or(ZEROS.len());
            write(mem, addr, &ZEROS[..n_usize], "a multiboot segment")?;
            addr += n;
        }
    }
    let mode = EntryMode::Multiboot {
        entry: image.entry,
        info: multiboot::INFO_ADDR,
    };
    Ok((image.end(), mode))
}

fn load_initramfs(
    mem: &GuestMemoryMmap,
    path: &Path,
    kernel_end: u64,
    memory: u64,
) -> Result<(u64, u64), BootError> {
    let read_err = |source| BootError::ReadInitramfs {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(read_err)?;
    let size = file.metadata().map_err(read_err)?.len();
    let top = memory.min(MMIO_HOLE_START);
    let addr = top
        .checked_sub(size)
        .map(|a| a & !0xfff)
        .filter(|a| *a >= kernel_end.max(HIMEM_START) && size > 0)
        .ok_or(BootError::InitramfsTooLarge { size })?;
    let len = usize::try_from(size).map_err(|_| BootError::InitramfsTooLarge { size })?;
    mem.read_exact_volatile_from(GuestAddress(addr), &mut file, len)
        .map_err(|source| BootError::WriteMemory {
            what: "the initramfs",
            source,
        })?;
    Ok((addr, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_detected_from_magic() {
        let mut elf = vec![0u8; 64];
        elf[..5].copy_from_slice(b"\x7fELF\x02");
        assert_eq!(format_of(&elf), Some(KernelFormat::Elf));
        elf[4] = 1; // ELF32
        assert_eq!(format_of(&elf), None);
        // ELF32 with a multiboot header (magic, flags 0, checksum) within the first 8 KiB.
        elf.resize(0x2000, 0);
        elf[0x1ff0..0x1ff4].copy_from_slice(&multiboot::HEADER_MAGIC.to_le_bytes());
        let sum = 0u32.wrapping_sub(multiboot::HEADER_MAGIC);
        elf[0x1ff8..0x1ffc].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(format_of(&elf), Some(KernelFormat::Multiboot));
        let mut bz = vec![0u8; 0x300];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert_eq!(format_of(&bz), Some(KernelFormat::BzImage));
        assert_eq!(format_of(b"hello"), None);
        assert_eq!(format_of(&[]), None);
    }
}
