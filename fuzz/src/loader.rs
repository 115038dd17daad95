//! The `loader` target: `vmm::setup::boot::load` (format detection, linux-loader's ELF and bzImage
//! loaders, command line, initramfs placement, MP table, PVH start info, zero page, page
//! tables) on arbitrary kernel and initramfs bytes, an arbitrary command line and CPU count,
//! into 32 MiB of plain guest memory; plus the zero-page builder on arbitrary setup headers.
//!
//! Checks: nothing panics; an image that loads has a format `format_of` recognises, and a
//! refused one is refused with an error (`BootError`), never a crash; the command-line checks
//! hold (too long or NUL: refused).

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use vm_memory::{ByteValued, GuestMemoryMmap};
use vmm::setup::boot::{self, BootError, BootSpec, KernelFormat};
use vmm::setup::layout::{CMDLINE_ADDR, CMDLINE_MAX};

/// Guest RAM of every run (lull's minimum).
const MEMORY: u64 = 32 << 20;

/// How the kernel bytes are dressed so the fuzzer reaches both loaders quickly.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Shape {
    Raw,
    Elf64,
    BzImage { setup_sects: u8, version: u16 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    shape: Shape,
    cpus: u8,
    cmdline: String,
    initramfs: Option<Vec<u8>>,
    kernel: Vec<u8>,
}

fn memory() -> &'static GuestMemoryMmap {
    static MEM: OnceLock<GuestMemoryMmap> = OnceLock::new();
    MEM.get_or_init(|| {
        vmm::vm::kvm::create_guest_memory(MEMORY)
            .unwrap_or_else(|e| panic!("cannot allocate guest memory: {e}"))
    })
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lull-fuzz-loader-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir.join(name)
}

fn write_file(path: &PathBuf, bytes: &[u8]) {
    let mut f = std::fs::File::create(path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
    f.write_all(bytes)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

fn dress(shape: Shape, mut kernel: Vec<u8>) -> Vec<u8> {
    match shape {
        Shape::Raw => {}
        Shape::Elf64 => {
            if kernel.len() < 64 {
                kernel.resize(64, 0);
            }
            kernel[..5].copy_from_slice(b"\x7fELF\x02");
        }
        Shape::BzImage {
            setup_sects,
            version,
        } => {
            if kernel.len() < 0x400 {
                kernel.resize(0x400, 0);
            }
            kernel[0x1f1] = setup_sects;
            kernel[0x202..0x206].copy_from_slice(b"HdrS");
            kernel[0x206..0x208].copy_from_slice(&version.to_le_bytes());
        }
    }
    kernel
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(input) = Input::arbitrary(&mut u) else {
        return;
    };
    let kernel = dress(input.shape, input.kernel);

    // The zero-page builder alone, on the same header bytes.
    let e820 = vmm::setup::layout::e820_map(MEMORY);
    if let Ok(zp) = boot::zeropage::build(&kernel, CMDLINE_ADDR, None, &e820) {
        // Up to 0x202 the setup header is the kernel's, untouched by lull's fields.
        let head = &zp.as_slice()[0x1f1..0x202];
        assert_eq!(
            head,
            &kernel[0x1f1..0x202],
            "the setup header is the kernel's"
        );
    }

    let kernel_path = scratch("kernel");
    write_file(&kernel_path, &kernel);
    let initramfs_path = input.initramfs.as_ref().map(|bytes| {
        let path = scratch("initramfs");
        write_file(&path, bytes);
        path
    });
    let spec = BootSpec {
        kernel: &kernel_path,
        initramfs: initramfs_path.as_deref(),
        cmdline: &input.cmdline,
        cpus: u32::from(input.cpus),
        memory: MEMORY,
    };
    let format = boot::format_of(&kernel);
    match boot::load(memory(), &spec) {
        Ok(_) => {
            assert!(format.is_some(), "an image of unknown format loaded");
            assert!(input.cmdline.len() < CMDLINE_MAX && !input.cmdline.contains('\0'));
        }
        Err(BootError::UnknownFormat(_)) => assert_eq!(format, None),
        Err(BootError::NoPvhNote(_)) => assert_eq!(format, Some(KernelFormat::Elf)),
        Err(BootError::CmdlineTooLong(_) | BootError::CmdlineNul) => {
            assert!(input.cmdline.len() >= CMDLINE_MAX || input.cmdline.contains('\0'));
        }
        Err(_) => {}
    }
}
