//! lull's timers: per-CPU timer bases and the hierarchical *pull* model for idle vCPUs.
//!
//! Pure Rust, no KVM, no `unsafe`. The pieces, bottom-up:
//!
//! * [`Clock`]: monotonic nanoseconds ([`MonotonicClock`], [`FakeClock`] for tests).
//! * [`TimerBase`]: one per vCPU thread. *Pinned* timers (the LAPIC timer) live in a queue
//!   only the owner touches: arm/cancel costs no lock and no syscall. *Global* timers (device
//!   and housekeeping deadlines) live in a [`GlobalQueue`] another thread may expire while
//!   the owner is idle. Handles cancel and re-arm in O(log n).
//! * [`Hierarchy`]: Linux's `timer_migration` scheme. Idle CPUs hand their first global
//!   expiry up a tree of groups; one running *migrator* per group pulls them, so an idle vCPU
//!   is not woken for timers someone else can run. See the [`hierarchy`] module docs.
//! * [`model`]: `pull`, `push` and `central` behind [`CpuTimers`] / [`TimerModel`], so a VM
//!   picks one at start-up. Host timers sit behind [`HostTimer`] (the VMM's timerfds and POSIX
//!   timers for real, [`FakeHostTimer`] for tests: this crate programs no host timer);
//!   [`Metrics`] counts arms, expiries, kicks and empty wake-ups; the [`Waker`] hook tells the
//!   VMM to kick a vCPU. A blocked vCPU waits on its *wake timer*
//!   ([`CpuTimers::set_wake_timer`]), which other threads re-arm when its wake-up duty moves
//!   (see the [`model`] module docs).
//! * [`slack`]: timer slack for global timers, which may expire anywhere in their range.
//!
//! State transitions emit `tracing` events with target `timer::tmigr`.
//!
//! # Testing
//!
//! * `cargo test -p timer`: unit tests, property tests (random operation sequences on 1..=70
//!   vCPUs checking the hierarchy invariants and every timer's fate after each step, run-time
//!   growth), a concurrent growth test and a multi-threaded vCPU stress test.
//! * `make loom-tests` (part of `make test`): the loom models, built with `--cfg loom`.
//!   `tests/loom.rs`: concurrent activate/deactivate, remote expiry vs. a new timer, root
//!   growth, and the demonstration of why `seq` is needed; `hierarchy/state.rs`: the real
//!   `set_active`/`set_inactive` racing on one word, with and without `seq`;
//!   `tests/loom_retarget.rs`: the real `PullModel`/`PullCpu` in the wake-up duty's
//!   retarget race (a CPU going idle last while another activates and re-arms the sleeper's
//!   host wake-up). `LOOM_MAX_PREEMPTIONS=6` searches deeper.
//! * `tests/all_idle.rs`: the all-idle VM of issue 15 in simulation (pull vs. push wake-ups).
//! * `resources/bench/bench-timer.sh` (`make bench-timer`): criterion benchmarks.
//! * Feature `testing` (off by default; always on in the crate's own tests): `timer::testing`, a
//!   simulated VMM that drives the pull model and checks every timer's fate. The property
//!   tests and the `timer` fuzz target (`fuzz/`) both use it.
//!
//! # Example: a vCPU's idle timer is pulled by a running one
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use timer::{build, AfterFire, CpuId, FakeHostTimer, HostTimer, ModelKind, TimerKind, NEVER};
//!
//! // The VMM's kick: here we only record who would be kicked.
//! let kicked = Arc::new(Mutex::new(Vec::new()));
//! let k = Arc::clone(&kicked);
//! let waker = Arc::new(move |cpu: CpuId| k.lock().unwrap().push(cpu));
//! // Two vCPUs on NUMA node 0; host ticks are fakes (the VMM arms real ones).
//! let mut m = build::<&str>(ModelKind::Pull, &[0, 0], &mut |_| {
//!     Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>
//! }, waker)?;
//!
//! // vCPU 1 arms its LAPIC timer (pinned) and a device deadline (global), then halts.
//! m.cpus[1].arm(TimerKind::Pinned, 5_000, "lapic");
//! m.cpus[1].arm(TimerKind::Global, 1_000, "virtio-blk");
//! let timeout = m.cpus[1].idle(0);
//! assert_eq!(timeout, 5_000); // it blocks until its own LAPIC timer, not the device one
//! // vCPU 0 is the migrator: it is kicked to re-arm its host tick for vCPU 1's deadline.
//! assert_eq!(*kicked.lock().unwrap(), vec![0]);
//!
//! // vCPU 0 keeps running; at its exits/host tick it runs its timers and pulls vCPU 1's.
//! assert_eq!(m.cpus[0].run(0, &mut |_| AfterFire::Done), 1_000); // arm host tick for 1000
//! let mut fired = Vec::new();
//! m.cpus[0].run(1_000, &mut |f| {
//!     fired.push((f.cpu, f.payload, f.remote));
//!     AfterFire::NotifyOwner // e.g. an interrupt for vCPU 1 is now pending
//! });
//! assert_eq!(fired, vec![(1, "virtio-blk", true)]);
//! assert_eq!(*kicked.lock().unwrap(), vec![0, 1]);
//!
//! // vCPU 1 wakes (kicked or at its timeout), activates, runs its own timers.
//! m.cpus[1].wake(5_000);
//! m.cpus[1].run(5_000, &mut |f| { assert_eq!(f.payload, "lapic"); AfterFire::Done });
//! assert_eq!(m.cpus[1].run(5_000, &mut |_| AfterFire::Done), NEVER);
//! assert_eq!(m.shared.metrics().remote_expiries, 1);
//! # Ok::<(), timer::ModelError>(())
//! ```
#![forbid(unsafe_code)]

pub mod base;
pub mod clock;
pub mod hierarchy;
pub mod host;
mod lock;
pub mod metrics;
pub mod model;
mod queue;
pub mod slack;
mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use base::{AfterFire, CpuId, Fired, GlobalQueue, TimerBase, TimerHandle, TimerKind};
pub use clock::{Clock, FakeClock, MonotonicClock, Nanos, VmTime, NEVER};
pub use hierarchy::{
    Hierarchy, HierarchyConfig, HierarchyError, IdleUpdate, RemoteExpiry, RemoteOutcome,
};
pub use host::{FakeHostTimer, HostTimer, HostTimerError};
pub use lock::lock;
pub use metrics::{Metrics, TimerMetrics};
pub use model::{build, CpuTimers, Model, ModelError, ModelKind, TimerModel, Waker};
