//! Timer bases and the hierarchical pull model (see `docs/ARCHITECTURE.md`).
#![forbid(unsafe_code)]

pub mod base;
pub mod clock;
mod queue;
mod sync;

pub use base::{AfterFire, CpuId, Fired, GlobalQueue, TimerBase, TimerHandle, TimerKind};
pub use clock::{Clock, FakeClock, MonotonicClock, Nanos, NEVER};
pub mod hierarchy;
pub use hierarchy::{Hierarchy, HierarchyConfig, HierarchyError, IdleUpdate, RemoteExpiry};
pub mod host;
pub mod metrics;
pub mod model;
pub use host::{FakeHostTimer, HostTimer, HostTimerError, TimerFdHost};
pub use metrics::{Metrics, MetricsSnapshot};
pub use model::{build, CpuTimers, Model, ModelError, ModelKind, TimerModel, Waker};
