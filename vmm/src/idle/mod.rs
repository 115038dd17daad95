//! The idle manager of `--irqchip user`: what a vCPU does between HLT and sleeping, and when
//! lull makes it sleep although the guest would run.
//!
//! - [`halt_poll`]: poll for a wake-up for a while before blocking, timer-aware.
//! - [`inject`]: synchronized idle injection, every vCPU of the VM forced idle in the same
//!   windows (power capping); guest timers falling in a window are held until it ends.
//! - [`quota`]: a per-VM CPU budget per period, enforced by parking vCPUs until the next period;
//!   periods start at a random phase so VMs started together interleave.
//! - [`global_load`]: a synthetic load of device/housekeeping deadlines (global timers), to
//!   exercise the timer models.
//! - [`core`]: the per-vCPU decisions (hold before entry, poll/block/resume at HLT, how a
//!   wake-up counts) as pure functions, tested with a fake clock; [`vcpu_timer`]: what a
//!   vCPU's timers carry.
//! - [`placement`]: timer-aware wake placement (bind a short sleeper to its host CPU);
//!   [`vcpu_placement`]: a vCPU thread's side of it (its affinity, its counters).
//! - [`halt`]: the halt of a vCPU, top to bottom: holds, HLT and INIT carried out as the
//!   core decides, over the chip's narrow [`halt::IdleChip`] interface.
//! - [`shared`]: the idle manager's VM-wide state ([`IdleShared`]).
//!
//! Each knob has a textual form shared by the command line and the JSON config
//! ([`crate::config::knob`]).

pub mod core;
pub mod global_load;
pub mod halt;
pub mod halt_poll;
pub mod inject;
pub mod placement;
pub mod quota;
pub mod shared;
pub mod vcpu_placement;
pub mod vcpu_timer;

pub use shared::IdleShared;
