//! Guest set-up before the first entry: the guest's memory map ([`layout`]), the CPUID each
//! vCPU sees ([`cpuid`]), and loading the kernel, its command line and the boot structures
//! ([`boot`]: PVH, bzImage, multiboot).

pub mod boot;
pub mod cpuid;
pub mod layout;
