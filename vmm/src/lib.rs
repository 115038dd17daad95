//! The lull VMM library: configuration, the management API, guest set-up, the irqchip in both
//! modes, the idle manager, vCPU threads and the VMM thread. Every `unsafe` of the project
//! lives in [`host::sys`], and the compiler holds it there: `#![deny(unsafe_code)]` here,
//! allowed on `host::sys` only.
//!
//! Layers, each importing only the ones below it (docs/ARCHITECTURE.md draws the same picture):
//!
//! ```text
//!  api      --api-socket: the management API; vm.boot runs vm on a thread
//!  vm       build, run and report one VM (disks, nets, devices, the VMM thread's loop)
//!  snapshot the snapshot format: manifest, memory file, vCPU state files
//!  vcpu     one vCPU's state machine, the KVM adapter, generic exits, the device buses
//!  irqchip  IrqChip/VcpuIrq: kernel (KVM's LAPIC) | user (lull's LAPICs, IOAPIC, timers)
//!  idle     the halt of a vCPU (halt.rs) and the pure decisions it carries out
//!  state    what vCPU threads share: stop, counters, device timers, the nets' port
//!  setup    before the first entry: memory layout, CPUID, boot (PVH, bzImage, multiboot)
//!  host     sys (every unsafe), seccomp, host statistics, the console
//! ```
//! Leaves used across layers: `config` (and `size`), `metrics`, `ratelimit` (log limits for
//! guest-triggered lines), `exit_code`, `sync` (std or loom); the `kit` crate locates the
//! guest kit. The `lull` binary is a package of its own (`lull/`): the command line and
//! `lull bench` (the `bench` crate), which this library does not depend on.

#![deny(unsafe_code)]

pub mod api;
pub mod config;
pub mod exit_code;
pub mod host;
pub mod idle;
pub mod irqchip;
pub use kit;
pub mod metrics;
pub mod ratelimit;
pub mod setup;
pub mod size;
pub mod snapshot;
pub mod state;
pub mod sync;
pub mod vcpu;
pub mod vm;
