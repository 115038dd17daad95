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
//!
//! Sharing: every image is `flock`ed when it is opened, for the VM's life (the lock goes with
//! the last descriptor of the open file): exclusive for a writable disk, shared for
//! `readonly=on`. Two writers of one image, in one lull (the same file given twice) or in two,
//! would interleave their sectors in each other's file systems; the second is refused and
//! told who holds the image (from /proc/locks). Readers may share an image with each other,
//! never with a writer. A lock only binds programs that take it (QEMU and Cloud Hypervisor
//! do, with their own kind of lock).

use std::fs::{File, TryLockError};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use devices::mmio::{MmioBus, MmioBusError, SharedMmioDevice};
use devices::testdev::IrqLines;
use devices::virtio::block::Block;
use devices::virtio::disk::{DiskError, FileDisk};
use devices::virtio::mmio::{SharedTransport, VirtioMmio, VirtioMmioDevice, WINDOW_SIZE};
use devices::virtio::throttle::DeviceClock;
use vm_memory::GuestMemoryMmap;

use crate::config::DiskConfig;
use crate::setup::layout::{VIRTIO_MMIO_BASE, VIRTIO_MMIO_IRQS};
use crate::state::device_timers::DeviceTimers;

/// The opened images, in `--disk` order.
pub struct OpenDisks(Vec<(FileDisk, DiskConfig)>);

/// Why a `--disk` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DiskOpenError {
    /// The image itself.
    #[error(transparent)]
    Image(#[from] DiskError),
    /// Another open of the image holds a conflicting lock.
    #[error(
        "Disk image {path} is in use{holder}: a writable disk needs the image to itself (a \
         `readonly=on` disk shares it with other readers only); stop the other user or give \
         a copy"
    )]
    Locked {
        /// The image.
        path: PathBuf,
        /// Who holds it, as a phrase (` by process 123 (lull)`), or empty if unknown.
        holder: String,
    },
    /// The lock could not be taken for another reason.
    #[error("Cannot lock disk image {path}: {source}")]
    Lock {
        /// The image.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The disks on the MMIO bus.
pub struct Disks {
    /// The bus every vCPU dispatches MMIO exits to.
    pub bus: MmioBus,
    /// The image files, to [`sync`] when the VM stops.
    pub files: Vec<Arc<File>>,
    /// The devices in `--disk` order (their device-timer ids), for [`DeviceTimers`].
    pub devices: Vec<SharedMmioDevice>,
    /// The same devices' transports, for a snapshot.
    pub transports: Vec<SharedTransport>,
    /// Each disk's requests that failed because its image shrank, in `--disk` order.
    pub shrink_errors: Vec<Arc<AtomicU64>>,
}

/// Opens and locks every image (early, so that a bad `--disk` fails before KVM is touched).
pub fn open(disks: &[DiskConfig]) -> Result<OpenDisks, DiskOpenError> {
    disks
        .iter()
        .map(|d| {
            let disk = FileDisk::open(&d.path, d.readonly)?;
            lock(disk.file(), &d.path, d.readonly)?;
            Ok((disk, d.clone()))
        })
        .collect::<Result<_, _>>()
        .map(OpenDisks)
}

/// Takes the image's flock: shared if `readonly`, else exclusive; never waits.
fn lock(file: &File, path: &Path, readonly: bool) -> Result<(), DiskOpenError> {
    let taken = if readonly {
        file.try_lock_shared()
    } else {
        file.try_lock()
    };
    match taken {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(DiskOpenError::Locked {
            path: path.to_path_buf(),
            holder: file
                .metadata()
                .ok()
                .and_then(|m| lock_holder(m.ino()))
                .map(describe_holder)
                .unwrap_or_default(),
        }),
        Err(TryLockError::Error(source)) => Err(DiskOpenError::Lock {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The process holding a flock on inode `ino`, from /proc/locks.
fn lock_holder(ino: u64) -> Option<u32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    holder_in(&locks, ino)
}

/// The pid of the first FLOCK line of `locks` (/proc/locks' text) on inode `ino`.
pub fn holder_in(locks: &str, ino: u64) -> Option<u32> {
    // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (kind, pid, id) = (fields.get(1)?, fields.get(4)?, fields.get(5)?);
        let inode = id.rsplit(':').next()?.parse::<u64>().ok()?;
        (*kind == "FLOCK" && inode == ino).then(|| pid.parse().ok())?
    })
}

/// ` by this lull (the image is given twice)` or ` by process PID (NAME)`.
fn describe_holder(pid: u32) -> String {
    if pid == std::process::id() {
        return " by this lull: the image is given as two disks".to_string();
    }
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    format!(" by process {pid} ({})", name.trim())
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
    let mut transports: Vec<SharedTransport> = Vec::new();
    let mut shrink_errors = Vec::new();
    // Device times are CLOCK_MONOTONIC, like the timerfds; the irqchip converts.
    let clock: DeviceClock = Arc::new(crate::host::sys::clock::monotonic_ns);
    for (index, (disk, cfg)) in open.0.into_iter().enumerate() {
        let Some((base, irq)) = placement(index) else {
            break; // VmConfig::validate caps the count at the lines there are
        };
        files.push(disk.file().clone());
        shrink_errors.push(disk.shrink_errors().clone());
        let block =
            Block::new(disk, cfg.readonly, &serial(&cfg)).with_rate_limit(cfg.rate, clock.clone());
        let transport = VirtioMmio::new(block, mem.clone());
        let mut device = VirtioMmioDevice::new(transport, lines.clone(), irq);
        if cfg.rate.is_limited() {
            device = device.with_timer(timers.handle(u32::try_from(index).unwrap_or(u32::MAX)));
        }
        let device = Arc::new(Mutex::new(device));
        transports.push(device.clone());
        devices.push(device.clone());
        bus.insert(base, WINDOW_SIZE, device)?;
        tracing::debug!(path = %cfg.path.display(), base, irq, "virtio-blk disk attached");
    }
    Ok(Disks {
        bus,
        files,
        devices,
        transports,
        shrink_errors,
    })
}

/// Requests of all disks that failed because an image shrank.
pub fn shrink_error_total(counters: &[Arc<AtomicU64>]) -> u64 {
    counters.iter().map(|c| c.load(Ordering::Relaxed)).sum()
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
    fn the_holder_of_a_flock_is_found_by_inode() {
        let locks = "1: POSIX  ADVISORY  WRITE 77 fd:01:42 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF\n\
                     3: FLOCK  ADVISORY  READ 99 00:1f:42 0 EOF\n";
        assert_eq!(holder_in(locks, 5678), Some(1234));
        assert_eq!(holder_in(locks, 42), Some(99));
        assert_eq!(holder_in(locks, 7), None);
        assert_eq!(holder_in("", 7), None);
    }

    #[test]
    fn writers_exclude_each_other_and_readers_share() {
        let path = std::env::temp_dir().join(format!("lull-lock-{}.img", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let disk = |ro: bool| {
            format!(
                "path={}{}",
                path.display(),
                if ro { ",readonly=on" } else { "" }
            )
        };
        let cfg = |specs: &[bool]| {
            specs
                .iter()
                .map(|ro| disk(*ro).parse().unwrap())
                .collect::<Vec<DiskConfig>>()
        };
        let err = open(&cfg(&[false, false])).err().unwrap();
        assert!(
            matches!(&err, DiskOpenError::Locked { holder, .. } if holder.contains("this lull")),
            "{err}"
        );
        assert!(open(&cfg(&[false, true])).is_err());
        assert!(open(&cfg(&[true, false])).is_err());
        let readers = open(&cfg(&[true, true])).unwrap();
        assert!(open(&cfg(&[false])).is_err());
        drop(readers);
        assert!(open(&cfg(&[false])).is_ok(), "the lock outlived its disks");
        std::fs::remove_file(&path).unwrap();
    }

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
        assert!(last <= crate::setup::layout::IOAPIC_ADDR);
    }
}
