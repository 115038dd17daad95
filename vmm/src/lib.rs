//! The lull VMM library: CLI and configuration, KVM set-up, guest loading, the irqchip in both
//! modes, the idle core, vCPU threads and the VMM thread. Every `unsafe` of the project lives
//! in [`sys`].
//!
//! Layers, each importing only the ones below it:
//!
//! ```text
//!  main ─► api (--api-socket: the management API) ─► vm (build, run, report) ─► vcpu (state machine, KVM adapter, generic exits)
//!     ─► irqchip (IrqChip/VcpuIrq: kernel | user) ─► idle (pure decisions: core, halt_poll,
//!     inject, quota, global_load) ─► state (stop, shared counters) ─► sys (every unsafe)
//! ```
//! Leaf modules used across layers: `boot`, `cpuid`, `layout` (guest set-up), `config`,
//! `metrics`, `net_port`, `ratelimit`, `host_stats`, `console`, `seccomp`, `size`, `sync`; the `kit` crate
//! locates the guest kit. `main` is the `lull` binary, a package of its own (`lull/`) with the
//! rest of the command line and `lull bench` (the `bench` crate), which this library does not
//! depend on.

pub mod api;
pub mod boot;
pub mod config;
pub mod console;
pub mod cpuid;
pub mod device_timers;
pub mod exit_code;
pub mod host_stats;
pub mod idle;
pub mod irqchip;
pub use kit;
pub mod layout;
pub mod metrics;
pub mod net_port;
pub mod ratelimit;
pub mod seccomp;
pub mod size;
pub mod state;
pub mod sync;
pub mod sys;
pub mod vcpu;
pub mod vm;
