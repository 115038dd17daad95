//! The per-vCPU counters every layer of a vCPU thread counts in (exits, the chip, the idle
//! manager). They are declared once, with the report's read-out of them, in `lull_schema`
//! (`VcpuCounters` -> `VcpuReadout`): a new counter is one field there.

pub use lull_schema::{PlacementCounters, VcpuCounters, WakeupCounters, LATENESS_BUCKETS};
