//! The `snapshot` target: arbitrary bytes as a snapshot's manifest and a state file (split at
//! the first NUL byte), read as each vCPU's and as the VM's, through the reader's checks
//! (`vmm::snapshot`).
//!
//! Checks: nothing panics; a manifest that is accepted is of this format and lull version,
//! its regions add up to its memory size and are the layout of its memory size, it lists one
//! vCPU file per vCPU and names every file by a plain name, each once (so no name can leave
//! the snapshot directory); a vCPU file that is accepted has the manifest's
//! size and checksum and holds the state of the vCPU at its place; so does an accepted VM
//! state file. An accepted devices file lists one virtio device per disk and net of the
//! manifest; each of its states is restored onto a real virtio-blk transport over a small
//! guest memory (and its serial state onto a UART): a state the transport accepts saves back
//! to itself, and a notification after it never panics. The state bytes are also read as a
//! saved LAPIC and a saved IOAPIC (what `--irqchip user` snapshots hold, and what the checksum
//! keeps this target from reaching through a vCPU file) and restored: a state that is refused
//! changes nothing, one that is taken reads back as it was saved (a TSC deadline may have
//! expired at the restore) and arms no timer in the past.

use std::path::Path;
use std::sync::Arc;

use devices::ioapic::{IoApic, IoApicState};
use devices::lapic::{Lapic, LapicConfig, LapicState, LapicTimerChange, TimerMode};
use devices::serial::SerialPort;
use devices::virtio::block::Block;
use devices::virtio::disk::MemDisk;
use devices::virtio::mmio::VirtioMmio;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm::snapshot::devices::DevicesState;
use vmm::snapshot::manifest::is_plain_name;
use vmm::snapshot::{fnv64, parse_devices, parse_kvm_vm, parse_vcpu, Manifest, FORMAT_VERSION};

/// The host vendor the manifests are checked against.
const VENDOR: &str = "GenuineIntel";

/// Runs one input.
pub fn run(data: &[u8]) {
    let (manifest, vcpu) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    restore_chips(vcpu);
    let Ok(m) = Manifest::parse(manifest, VENDOR) else {
        return;
    };
    assert_eq!(m.format_version, FORMAT_VERSION);
    assert_eq!(m.lull_version, vmm_version());
    assert_eq!(m.cpu_vendor, VENDOR);
    let total = m
        .regions
        .iter()
        .try_fold(0u64, |s, r| s.checked_add(r.bytes));
    assert_eq!(total, Some(m.memory_bytes), "regions must fill the memory");
    assert_eq!(usize::try_from(m.config.cpus).ok(), Some(m.vcpus.len()));
    let names: Vec<&str> = m.file_names().collect();
    for name in &names {
        assert!(
            is_plain_name(name),
            "{name:?} leaves the snapshot directory"
        );
    }
    let distinct: std::collections::BTreeSet<&&str> = names.iter().collect();
    assert_eq!(distinct.len(), names.len(), "a file named twice");
    let layout = vmm::setup::layout::ram_ranges(m.config.memory.0);
    let regions: Vec<(u64, u64)> = m.regions.iter().map(|r| (r.guest_addr, r.bytes)).collect();
    assert_eq!(regions, layout, "regions that are not the memory's layout");
    for (i, entry) in m.vcpus.iter().enumerate() {
        if let Ok(state) = parse_vcpu(i, entry, Path::new(&entry.file), vcpu) {
            assert_eq!(usize::try_from(state.id).ok(), Some(i));
            assert_eq!(u64::try_from(vcpu.len()).ok(), Some(entry.bytes));
            assert_eq!(fnv64(vcpu), entry.fnv64);
        }
    }
    let entry = &m.kvm_vm;
    if parse_kvm_vm(entry, Path::new(&entry.file), vcpu).is_ok() {
        assert_eq!(u64::try_from(vcpu.len()).ok(), Some(entry.bytes));
        assert_eq!(fnv64(vcpu), entry.fnv64);
    }
    let entry = &m.devices;
    if let Ok(state) = parse_devices(entry, Path::new(&entry.file), vcpu, &m.config) {
        assert_eq!(u64::try_from(vcpu.len()).ok(), Some(entry.bytes));
        assert_eq!(fnv64(vcpu), entry.fnv64);
        assert_eq!(
            state.virtio.len(),
            m.config.disks.len() + m.config.nets.len()
        );
        restore_devices(&state);
    }
}

/// An interrupt that goes nowhere.
struct NoIrq;
impl devices::serial::Trigger for NoIrq {
    type E = ();
    fn trigger(&self) -> Result<(), ()> {
        Ok(())
    }
}

/// Restores every saved device onto a fresh one (the ones a restoring VM would build, on a
/// small memory, no rate limit): no panic; what is accepted saves back unchanged and
/// survives a notify, and what is refused (a limiter's state among them) changes nothing.
fn restore_devices(state: &DevicesState) {
    if let Ok(port) = SerialPort::from_saved(NoIrq, std::io::sink(), &state.serial) {
        assert_eq!(port.save(), state.serial);
    }
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 16)]) else {
        return;
    };
    let mem = Arc::new(mem);
    for saved in &state.virtio {
        let block = Block::new(MemDisk::new(8), false, b"fuzz");
        let mut transport = VirtioMmio::new(block, mem.clone());
        let before = transport.save();
        match transport.restore(saved) {
            Ok(()) => {
                assert_eq!(
                    &transport.save(),
                    saved,
                    "a restored transport saves back what it took"
                );
                transport.write(0x50, &0u32.to_le_bytes());
            }
            Err(_) => assert_eq!(transport.save(), before, "a refused state changed nothing"),
        }
    }
}

/// The restoring clock's now.
const NOW: u64 = 1_000_000_000;

/// `bytes` as a saved LAPIC (into a BSP's and an AP's) and a saved IOAPIC.
fn restore_chips(bytes: &[u8]) {
    if let Ok(state) = serde_json::from_slice::<LapicState>(bytes) {
        for bsp in [false, true] {
            let config = LapicConfig {
                apic_id: 1,
                bsp,
                ..LapicConfig::default()
            };
            let Ok(mut lapic) = Lapic::new(config) else {
                panic!("the default LAPIC configuration is refused");
            };
            let before = lapic.save(NOW);
            match lapic.restore(&state, NOW) {
                Err(_) => assert_eq!(lapic.save(NOW), before, "a refused state changed it"),
                Ok(change) => {
                    if let LapicTimerChange::Arm { deadline_ns } = change {
                        assert!(deadline_ns >= NOW, "a timer armed in the past");
                        assert_eq!(lapic.timer_deadline(), Some(deadline_ns));
                    }
                    if state.timer.mode != TimerMode::TscDeadline {
                        assert_eq!(lapic.save(NOW), state, "a taken state reads back changed");
                    }
                }
            }
        }
    }
    if let Ok(state) = serde_json::from_slice::<IoApicState>(bytes) {
        let mut ioapic = IoApic::new(0);
        let before = ioapic.save();
        match ioapic.restore(&state) {
            Err(_) => assert_eq!(ioapic.save(), before, "a refused state changed it"),
            Ok(()) => assert_eq!(ioapic.save(), state, "a taken state reads back changed"),
        }
    }
}

/// The version of the `vmm` crate the manifests must name (the workspace's).
fn vmm_version() -> &'static str {
    vmm::snapshot::LULL_VERSION
}
