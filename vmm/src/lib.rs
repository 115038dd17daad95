//! The lull VMM library: CLI and configuration, KVM set-up, guest loading, vCPU threads and
//! the VMM thread. Every `unsafe` of the project lives in this crate.

pub mod boot;
pub mod cli;
pub mod config;
pub mod console;
pub mod cpuid;
pub mod exit_code;
pub mod host_stats;
pub mod idle;
pub mod irqchip;
pub mod kvm_vm;
pub mod layout;
pub mod metrics;
pub mod ratelimit;
pub mod seccomp;
pub mod size;
pub mod test_devices;
pub mod vcpu;
pub mod vm;
pub mod vmm_loop;

/// The guest kit: where it is, its default guest and command line (the `kit` crate).
pub use kit;
