//! The run report lull writes as JSON (`lull run --metrics`, the management API's
//! `vm.counters`), as one set of serde types: lull serializes them, `lull bench` and the
//! integration tests deserialize them. Pure data (serde only, no KVM), so that every crate
//! that reads or writes the report can share it. A counter set the report reads from live
//! atomics is declared here once with its read-out (`counter_set!`): `VcpuCounters` is what a
//! vCPU thread bumps, `VcpuReadout` what the report lists; `TimerCounters` and `TimerMetrics`
//! the same for a timer model.
//!
//! The field names and order are the report's JSON keys, stable: renaming a field renames a
//! key every reader of a stored report depends on.
//!
//! Reading is lenient: a key a report lacks reads as its default (0, empty, null), as the
//! bench's readers always took it, so that `lull bench --lull OLD` still reads the reports of
//! an older lull. The integration tests check the other way, that what lull writes reads back
//! to the same bytes.
//!
//! ```text
//!  RunReport ── timers: TimerMetrics          (timer model's counters)
//!            ├─ idle_inject, cpu_quota, global_timers (idle manager's settings and work)
//!            ├─ device_timers: DeviceTimersReport ── devices: [DeviceTimerReport]
//!            ├─ nets: [NetReport] ── NetStats   (a virtio-net device's counters)
//!            ├─ vcpus: [VcpuReadout] ── wakeups, placement
//!            └─ threads: [ThreadStat]
//! ```

#![forbid(unsafe_code)]

mod counter_set;
mod net;
mod run;
mod timer;
mod vcpu;

pub use counter_set::ReadOut;
pub use net::{NetReport, NetStats};
pub use run::{
    DeviceTimerReport, DeviceTimersReport, GlobalTimersReport, IdleInjectReport, QuotaReport,
    RunReport, ThreadStat,
};
pub use timer::{TimerCounters, TimerMetrics};
pub use vcpu::{
    PlacementCounters, PlacementReadout, VcpuCounters, VcpuReadout, WakeupCounters, WakeupReadout,
    LATENESS_BUCKETS,
};
