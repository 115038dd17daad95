//! Fuzz drivers for lull: each module turns arbitrary bytes into a sequence of guest (or user)
//! actions against one component and checks that component's invariants after every step, so
//! a finding is a broken promise, not only a crash.
//!
//! | target   | component                                   | invariants checked                      |
//! |----------|---------------------------------------------|-----------------------------------------|
//! | `lapic`  | `devices::lapic::Lapic` (xAPIC MMIO, x2APIC and TSC-deadline MSRs, clock, injection) | PPR from TPR/ISR; injected vector above PPR; deadlines >= now + min delay; periodic steps >= min period; host timer covers the model's deadline (no lost timer); fires bounded by the clamp |
//! | `ioapic` | `devices::ioapic::IoApic` (IOREGSEL/IOWIN, lines, EOIs) | no reserved bits; edge pins have no remote IRR; an asserted, unmasked level pin is delivered or awaiting EOI; deliveries only from unmasked pins |
//! | `serial` | the port bus with the 16550A, CMOS, i8042, test-exit ports | output bytes counted = bytes in the sink; unclaimed ports read all ones; FIFO room bounded |
//! | `timer`  | `timer::model::PullModel` on 1-40 vCPUs through `timer::testing::Sim` | hierarchy snapshot invariants; no early, double or cancelled fire; remote fires only for idle CPUs; stale handles inert; every timer fires (no lost timer) |
//! | `loader` | `vmm::boot::load` and the zero-page builder on arbitrary kernel bytes | no panic; a loaded image has a known format; refusals match `format_of`; command-line limits enforced; the zero page is one page |
//! | `cli`    | `lull run` flags, the JSON config, sizes and serial modes | no panic; accepted configs validate; sizes and serial modes round-trip |
//!
//! Each `fuzz_targets/<name>.rs` is one line that calls `<module>::run`. `tests/replay.rs`
//! replays the inputs kept in `regressions/<name>/` (seeds and past crashes) through the same
//! `run` under `cargo test`; a crash found is also written as a unit test in the crate it
//! concerns (see `docs/RELIABILITY.md`).

pub mod chip;
pub mod cli;
pub mod ioapic;
pub mod lapic;
pub mod loader;
pub mod serial;
pub mod timer_model;
