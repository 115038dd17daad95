//! The lull VMM library: configuration, the management API, guest set-up, the irqchip in both
//! modes, the idle manager, vCPU threads and the VMM thread. Every `unsafe` of the project
//! lives in [`host::sys`], and the compiler holds it there: `#![deny(unsafe_code)]` here,
//! allowed on `host::sys` only.
//!
//! Layers, top to bottom: a layer imports only the layers below it and the leaves, a leaf
//! only other leaves (docs/ARCHITECTURE.md draws the same picture).
//!
//! ```text
//!  api       --api-socket: the management API; vm.boot runs vm on a thread
//!  exit_code lull's exit statuses, from a run's stop reason or a VM's error
//!  vm        build, run and report one VM (disks, nets, devices, the VMM thread's loop)
//!  snapshot  the snapshot format: manifest, memory file, vCPU state files
//!  vcpu      one vCPU's state machine, the KVM adapter, generic exits, the device buses
//!  irqchip   IrqChip/VcpuIrq: kernel (KVM's LAPIC) | user (lull's LAPICs, IOAPIC, timers)
//!  idle      the halt of a vCPU (halt.rs) and the pure decisions it carries out
//!  metrics   the run's report, read from the vCPUs' counters
//!  state     what vCPU threads share: stop, counters, device timers, the nets' port
//!  setup     before the first entry: memory layout, CPUID, boot (PVH, bzImage, multiboot)
//!  host      sys (every unsafe), seccomp, host statistics, the console
//! ```
//! Leaves, used by any layer: `config` (with `size`: the flags, the config file and the API's
//! bodies, their values and bounds), `ratelimit` (log limits for guest-triggered lines); the lock helper every layer uses is
//! `timer::lock`. The `kit` crate locates the guest kit. The `lull` binary is a package of its
//! own (`lull/`): the command line and `lull bench` (the `bench` crate), which this library
//! does not depend on.
//!
//! `make check-cycles` holds the code to this order (resources/check_layers.py reads the next
//! line): it fails when a layer imports a layer at or above it, when a leaf imports a layer,
//! on any import cycle between these modules, and on a module the line leaves out. An import
//! counts as written (`use crate::m::..`, `crate::m::..` in code, `super::..` out of the
//! module, a `pub use`), whatever module defines the item; `#[cfg(test)]` modules are not
//! layered.
//! `layers: api > exit_code > vm > snapshot > vcpu > irqchip > idle > metrics > state > setup > host; leaves: config size ratelimit`

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
pub mod vcpu;
pub mod vm;
