//! The bounds of a VM configuration lull accepts.

use crate::size::ByteSize;

/// Largest config file (and `vm.create` body) lull reads: 1 MiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Smallest guest memory lull accepts.
pub const MIN_MEMORY: ByteSize = ByteSize::mib(32);
/// Largest guest memory lull accepts.
pub const MAX_MEMORY: ByteSize = ByteSize(64 << 30);
/// Largest vCPU count: APIC IDs 0..N-1 plus the IOAPIC's ID N must fit below the broadcast ID.
pub const MAX_CPUS: u32 = 254;
/// Most disks one VM takes (one MMIO window and one IOAPIC line each, see `layout`).
pub const MAX_DISKS: usize = MAX_VIRTIO_DEVICES;
/// Most virtio devices (disks and network devices together) one VM takes: they share the
/// windows and lines (`setup::layout::VIRTIO_MMIO_IRQS` has exactly this many lines, so the
/// compiler keeps the two equal).
pub const MAX_VIRTIO_DEVICES: usize = 8;
/// Largest `--timer-slack`: 10 ms (a guest timer may come late by the whole slack).
pub const MAX_TIMER_SLACK_NS: u64 = 10_000_000;
