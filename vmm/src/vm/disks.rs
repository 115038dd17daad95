//! The VM's virtio-blk disks: each `--disk` image becomes a virtio-mmio device in its own
//! window from `layout::VIRTIO_MMIO_BASE`, its interrupt on the next line of
//! `layout::VIRTIO_MMIO_IRQS` through the irqchip's `irq_lines()` (KVM's IOAPIC or lull's).
//!
//! Where requests run: on the vCPU thread whose QueueNotify write exited to lull, inside that
//! MMIO exit. The backend is a synchronous file (pread/pwrite/fdatasync), so a request costs
//! the notifying vCPU its I/O time either way; doing it in place adds no host wake-up at all,
//! where handing it to the VMM thread through an ioeventfd costs a wake-up of that thread per
//! notification, plus, once it has added used buffers, an interrupt that must kick the vCPU
//! (a signal if it is in KVM_RUN) - two cross-thread wake-ups per request on these 2-core
//! hosts, and no overlap gained, as the guest's driver waits for its request anyway.
//! Measured (docs/PERFORMANCE.md, "virtio-blk: where a request runs"): a 4 KiB write costs the
//! device 1.5 us; served through an ioeventfd on the VMM thread it cost one more context
//! switch, one vCPU kick and 11-25 us of VMM-thread CPU per request, for no guest-visible
//! gain. (An asynchronous backend or many queues is when an I/O thread pays.)
//!
//! Durability: FLUSH is `fdatasync`; completed writes are in the host page cache at once, so
//! they are in the file for anyone who reads it after lull exits, and [`Disks::sync`] (called
//! when the VM stops, for any reason including SIGTERM) makes them durable too.

use std::fs::File;
use std::sync::{Arc, Mutex};

use devices::mmio::{MmioBus, MmioBusError, SharedMmioDevice};
use devices::testdev::IrqLines;
use devices::virtio::block::Block;
use devices::virtio::disk::{DiskError, FileDisk};
use devices::virtio::mmio::{VirtioMmio, VirtioMmioDevice, WINDOW_SIZE};
use devices::virtio::throttle::DeviceClock;
use vm_memory::GuestMemoryMmap;

use crate::config::DiskConfig;
use crate::device_timers::DeviceTimers;
use crate::layout::{VIRTIO_MMIO_BASE, VIRTIO_MMIO_IRQS};

/// The opened images, in `--disk` order.
pub struct OpenDisks(Vec<(FileDisk, DiskConfig)>);

/// The disks on the MMIO bus.
pub struct Disks {
    /// The bus every vCPU dispatches MMIO exits to.
    pub bus: MmioBus,
    /// The image files, to [`sync`] when the VM stops.
    pub files: Vec<Arc<File>>,
    /// The devices in `--disk` order (their device-timer ids), for [`DeviceTimers`].
    pub devices: Vec<SharedMmioDevice>,
}

/// Opens every image (early, so that a bad `--disk` fails before KVM is touched).
pub fn open(disks: &[DiskConfig]) -> Result<OpenDisks, DiskError> {
    disks
        .iter()
        .map(|d| Ok((FileDisk::open(&d.path, d.readonly)?, d.clone())))
        .collect::<Result<_, _>>()
        .map(OpenDisks)
}

/// Window base and IOAPIC line of virtio device `index` (disks first, then nets).
pub fn placement(index: usize) -> Option<(u64, u32)> {
    let irq = *VIRTIO_MMIO_IRQS.get(index)?;
    Some((
        VIRTIO_MMIO_BASE + WINDOW_SIZE * u64::try_from(index).ok()?,
        irq,
    ))
}

/// What tells Linux where `count` virtio-mmio devices are: `virtio_mmio.device=<size>@<base>:<irq>`
/// for each, space-separated.
pub fn cmdline_params(count: usize) -> String {
    (0..count)
        .filter_map(placement)
        .map(|(base, irq)| format!("virtio_mmio.device={}K@{base:#x}:{irq}", WINDOW_SIZE >> 10))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The GET_ID answer of a disk: its file name, cut to 20 bytes by the device.
fn serial(cfg: &DiskConfig) -> Vec<u8> {
    cfg.path
        .file_name()
        .map(|n| n.as_encoded_bytes().to_vec())
        .unwrap_or_default()
}

/// Puts every opened disk on a new MMIO bus, with its queues in `mem`, its line on `lines`
/// and its refill timer (if rate-limited) in `timers` under its index.
pub fn attach(
    open: OpenDisks,
    mem: &Arc<GuestMemoryMmap>,
    lines: &Arc<dyn IrqLines>,
    timers: &Arc<DeviceTimers>,
) -> Result<Disks, MmioBusError> {
    let mut bus = MmioBus::new();
    let mut files = Vec::new();
    let mut devices: Vec<SharedMmioDevice> = Vec::new();
    // Device times are CLOCK_MONOTONIC, like the timerfds; the irqchip converts.
    let clock: DeviceClock = Arc::new(crate::sys::clock::monotonic_ns);
    for (index, (disk, cfg)) in open.0.into_iter().enumerate() {
        let Some((base, irq)) = placement(index) else {
            break; // VmConfig::validate caps the count at the lines there are
        };
        files.push(disk.file().clone());
        let block =
            Block::new(disk, cfg.readonly, &serial(&cfg)).with_rate_limit(cfg.rate, clock.clone());
        let transport = VirtioMmio::new(block, mem.clone());
        let mut device = VirtioMmioDevice::new(transport, lines.clone(), irq);
        if cfg.rate.is_limited() {
            device = device.with_timer(timers.handle(u32::try_from(index).unwrap_or(u32::MAX)));
        }
        let device: SharedMmioDevice = Arc::new(Mutex::new(device));
        devices.push(device.clone());
        bus.insert(base, WINDOW_SIZE, device)?;
        tracing::debug!(path = %cfg.path.display(), base, irq, "virtio-blk disk attached");
    }
    Ok(Disks {
        bus,
        files,
        devices,
    })
}

/// Makes every completed write to `files` durable; failures are logged (the VM is over).
pub fn sync(files: &[Arc<File>]) {
    for file in files {
        if let Err(e) = file.sync_data() {
            tracing::warn!("cannot sync a disk image at stop: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_get_consecutive_windows_and_free_lines() {
        assert_eq!(placement(0), Some((0xd000_0000, 5)));
        assert_eq!(placement(3), Some((0xd000_3000, 9)));
        assert_eq!(placement(VIRTIO_MMIO_IRQS.len()), None);
        assert_eq!(
            cmdline_params(2),
            "virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"
        );
        assert_eq!(cmdline_params(0), "");
        let last = placement(VIRTIO_MMIO_IRQS.len() - 1).unwrap().0 + WINDOW_SIZE;
        assert!(last <= crate::layout::IOAPIC_ADDR);
    }
}
