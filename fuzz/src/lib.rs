//! Fuzz drivers for lull: each module turns arbitrary bytes into a sequence of guest (or user)
//! actions against one component and checks that component's invariants after every step, so
//! a finding is a broken promise, not only a crash.
//!
//! | target   | component                                   | invariants checked                      |
//! |----------|---------------------------------------------|-----------------------------------------|
//! | `lapic`  | 2-4 vCPUs of lull's real user irqchip (`vmm::irqchip::user::UserIrqChip` on a fake clock, any timer model, PV EOI): `before_entry` on a fake `CpuPort`, real `VcpuExit`s (LAPIC/IOAPIC MMIO, LAPIC/PV EOI MSRs, IPIs, EOIs, windows) through `handle_exit`/`exit_done` | ISR, TPR, PPR (SDM 11.8.3.1) and acceptance against the target's own record of injections, EOIs and TPR writes; CR8 given to KVM = TPR[7:4]; IPI targets by the SDM's destination rules, `route` (and lowest priority) checked against them; one injection per entry, of the highest pending vector, never while the guest cannot take it; window request iff something deliverable; no due timer at entry; no lost timer (host tick armed by the LAPIC deadline); deadlines >= now + min delay, periodic steps >= min period; fires bounded by the clamp; a posted IPI/NMI is never lost; EOI (register or PV flag) retires the highest ISR; PV flag only when KVM's rules allow; KVM's APIC base = the LAPIC's |
//! | `lapic_idle` | the `lapic` target's vCPUs on a chip with halt polling, timer advance, idle injection, CPU quota and global timers on (the clock moves on while a vCPU spins; the target steps past idle-injection and quota holds) | the `lapic` target's, and no hold the target did not foresee; nothing early (an unreached deadline survives an entry) |
//! | `ioapic` | `devices::ioapic::IoApic` (IOREGSEL/IOWIN, lines, EOIs) | no reserved bits; edge pins have no remote IRR; an asserted, unmasked level pin is delivered or awaiting EOI; deliveries only from unmasked pins |
//! | `serial` | lull's real port bus (`vmm::vm::devices::console` + `pio_bus_with_cmos`, interrupt line on a real `UserIrqChip`) through vCPU 0's real exit path, host console input, IOAPIC/LAPIC programming and entries | output bytes counted = bytes in the sink; exactly the documented ports claimed, the rest read all ones; FIFO room bounded; only 0xf4 exits (odd status), only 0x64 resets; at most one injection per entry, never while closed |
//! | `timer`  | `timer::model::PullModel` on 1-40 vCPUs through `timer::testing::Sim` | hierarchy snapshot invariants; no early, double or cancelled fire; remote fires only for idle CPUs; stale handles inert; every timer fires (no lost timer) |
//! | `loader` | `vmm::setup::boot::load` and the zero-page builder on arbitrary kernel bytes | no panic; a loaded image has a known format; refusals match `format_of`; command-line limits enforced; the zero page is one page |
//! | `cli`    | `lull run` flags, the JSON config, sizes and serial modes | no panic; accepted configs validate; sizes and serial modes round-trip |
//! | `virtio_blk` | `devices::virtio` (virtio-blk on a memory disk behind the virtio-mmio transport and its bus adapter) on a `GuestMemoryMmap`: register accesses, descriptor tables, rings and raw bytes from the input | no panic; the line is high iff InterruptStatus is not zero, and only changes level; FEATURES_OK only for an offered set with VERSION_1; the disk keeps its size, a read-only disk its contents; a notification serves at most the queue's size of chains |
//! | `virtio_net` | `devices::virtio` (virtio-net on an in-memory backend behind the virtio-mmio transport and its bus adapter) on a `GuestMemoryMmap`: register accesses, both queues' descriptor tables and rings, raw bytes, frames of any length from the host, VMM polls, transmit rate limit | no panic; the line is high iff InterruptStatus is not zero, and only changes level; FEATURES_OK only for an offered set with VERSION_1; every received frame delivered, dropped (counted) or waiting; sent frames reach the backend whole, of valid length, as counted; a pass serves at most a queue's worth of chains; the `ops=` limit holds |
//! | `api`    | one client connection of the management API: `vmm::api::conn::Conn` (incremental HTTP framing, keep-alive, limits) over `http` and `routes`, on pipelined requests split at arbitrary points | no panic; refusals are 4xx/501; a prefix parses to "need more" or the same request; fed in pieces (input-sized, bytewise) equals fed whole; answers are well-formed HTTP/1.1 with Content-Length, one per request (plus at most one refusal), only the last says close; at most MAX_REQUESTS; a routed `vm.create` validates |
//! | `snapshot` | a snapshot's manifest and a vCPU state file (`vmm::snapshot`'s reader) | no panic; an accepted manifest is of this format and lull version, its regions fill its memory, its vCPU files are lull's names in order; an accepted vCPU file has the manifest's size and checksum and holds its own vCPU |
//!
//! `chip` builds the real irqchip the `lapic` and `serial` targets drive, so a bug in lull's
//! glue (what `vmm` does between a KVM exit and the devices) shows in them, not only a bug in
//! the device models. `virtio_mmio_driver` holds what the two virtio drivers share (guest
//! memory size, registers, the interrupt line's recorder).
//!
//! Each `fuzz_targets/<name>.rs` is one line that calls `<module>::run`. `tests/replay.rs`
//! replays the inputs kept in `regressions/<name>/` (seeds and past crashes) through the same
//! `run` under `cargo test`; a crash found is also written as a unit test in the crate it
//! concerns (see `docs/RELIABILITY.md`).

pub mod api;
pub mod chip;
pub mod cli;
pub mod ioapic;
pub mod lapic;
pub mod loader;
pub mod serial;
pub mod snapshot;
pub mod timer_model;
pub mod virtio_blk;
pub mod virtio_mmio_driver;
pub mod virtio_net;
