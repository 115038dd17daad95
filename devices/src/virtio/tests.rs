//! virtio-blk through its MMIO transport, driven as a guest driver would: registers for the
//! handshake, descriptor table and rings written in a `GuestMemoryMmap`, QueueNotify.

use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::*;
use virtio_bindings::virtio_mmio::*;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use std::sync::atomic::{AtomicU64, Ordering};

use super::block::Block;
use super::disk::MemDisk;
use super::mmio::{VirtioMmio, VirtioMmioDevice, MAGIC};
use super::DeviceTimer;
use crate::mmio::MmioDevice;
use crate::rate_limiter::RateLimit;
use crate::testdev::IrqLines;

pub(super) const MEM_SIZE: usize = 1 << 20;
pub(super) const DESC: u64 = 0x1000;
pub(super) const AVAIL: u64 = 0x3000;
pub(super) const USED: u64 = 0x4000;
pub(super) const QSIZE: u16 = 16;
pub(super) const HDR: u64 = 0x10000;
pub(super) const DATA: u64 = 0x20000;
pub(super) const STATUS: u64 = 0x30000;

pub(super) type Transport = VirtioMmio<Block<MemDisk>, GuestMemoryMmap>;

/// A guest driver of one virtio-blk device.
pub(super) struct Driver {
    pub mmio: Transport,
    pub mem: Arc<GuestMemoryMmap>,
    pub avail_idx: u16,
}

/// A descriptor: address, length, device-writable.
pub(super) type Desc = (u64, u32, bool);

impl Driver {
    /// A device on `sectors` zeroed sectors, not yet initialised by the driver.
    pub fn raw(sectors: u64, readonly: bool) -> Self {
        Self::raw_with(Block::new(
            MemDisk::new(sectors),
            readonly,
            b"lull-test-disk",
        ))
    }

    /// A driver of `block`, not yet initialised.
    pub fn raw_with(block: Block<MemDisk>) -> Self {
        let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap());
        Self {
            mmio: VirtioMmio::new(block, mem.clone()),
            mem,
            avail_idx: 0,
        }
    }

    /// A device the driver has brought to DRIVER_OK with one queue of [`QSIZE`].
    pub fn ready(sectors: u64, readonly: bool) -> Self {
        Self::ready_with(Block::new(
            MemDisk::new(sectors),
            readonly,
            b"lull-test-disk",
        ))
    }

    /// A driver of `block`, brought to DRIVER_OK.
    pub fn ready_with(block: Block<MemDisk>) -> Self {
        let mut d = Self::raw_with(block);
        d.w(
            VIRTIO_MMIO_STATUS,
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
        );
        d.w(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        let high = d.r(VIRTIO_MMIO_DEVICE_FEATURES);
        d.w(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        d.w(VIRTIO_MMIO_DRIVER_FEATURES, high);
        let s = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK;
        d.w(VIRTIO_MMIO_STATUS, s);
        assert_eq!(d.r(VIRTIO_MMIO_STATUS), s);
        d.w(VIRTIO_MMIO_QUEUE_SEL, 0);
        d.w(VIRTIO_MMIO_QUEUE_NUM, u32::from(QSIZE));
        d.w(VIRTIO_MMIO_QUEUE_DESC_LOW, DESC as u32);
        d.w(VIRTIO_MMIO_QUEUE_AVAIL_LOW, AVAIL as u32);
        d.w(VIRTIO_MMIO_QUEUE_USED_LOW, USED as u32);
        d.w(VIRTIO_MMIO_QUEUE_READY, 1);
        d.w(VIRTIO_MMIO_STATUS, s | VIRTIO_CONFIG_S_DRIVER_OK);
        d
    }

    pub fn r(&mut self, reg: u32) -> u32 {
        let mut b = [0u8; 4];
        self.mmio.read(u64::from(reg), &mut b);
        u32::from_le_bytes(b)
    }

    pub fn w(&mut self, reg: u32, v: u32) {
        self.mmio.write(u64::from(reg), &v.to_le_bytes());
    }

    pub fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
    }

    /// Writes descriptor `i` of the table.
    pub fn set_desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        set_desc(&self.mem, i, addr, len, flags, next);
    }

    /// Makes descriptor `head` available and notifies.
    pub fn offer(&mut self, head: u16) {
        let slot = AVAIL + 4 + 2 * u64::from(self.avail_idx % QSIZE);
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
        self.w(VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    }

    /// Submits `descs` as one chain from descriptor 0; returns the used element (id, len).
    pub fn submit(&mut self, descs: &[Desc]) -> Option<(u32, u32)> {
        for (i, &(addr, len, write)) in descs.iter().enumerate() {
            let i = u16::try_from(i).unwrap();
            let mut flags = if write { VRING_DESC_F_WRITE as u16 } else { 0 };
            if usize::from(i) + 1 < descs.len() {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            self.set_desc(i, addr, len, flags, i + 1);
        }
        let before = self.used_idx();
        self.offer(0);
        if self.used_idx() == before {
            return None;
        }
        let elem = USED + 4 + 8 * u64::from(before % QSIZE);
        let id: u32 = self.mem.read_obj(GuestAddress(elem)).unwrap();
        let len: u32 = self.mem.read_obj(GuestAddress(elem + 4)).unwrap();
        Some((id, len))
    }

    /// A request of `kind` at `sector` with `data` bytes of data (written by the device if
    /// `device_writes`); returns the status byte and the used length.
    pub fn request(&mut self, kind: u32, sector: u64, data: u32, device_writes: bool) -> (u8, u32) {
        self.mem.write_obj(kind, GuestAddress(HDR)).unwrap();
        self.mem.write_obj(0u32, GuestAddress(HDR + 4)).unwrap();
        self.mem.write_obj(sector, GuestAddress(HDR + 8)).unwrap();
        self.mem.write_obj(0xeeu8, GuestAddress(STATUS)).unwrap();
        let mut chain = vec![(HDR, 16, false)];
        if data > 0 {
            chain.push((DATA, data, device_writes));
        }
        chain.push((STATUS, 1, true));
        let (_, len) = self.submit(&chain).expect("request not answered");
        (self.status_byte(), len)
    }

    pub fn status_byte(&self) -> u8 {
        self.mem.read_obj(GuestAddress(STATUS)).unwrap()
    }

    pub fn data(&self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(DATA)).unwrap();
        v
    }

    pub fn fill_data(&self, bytes: &[u8]) {
        self.mem.write_slice(bytes, GuestAddress(DATA)).unwrap();
    }

    pub fn disk(&self) -> &MemDisk {
        self.mmio.device().disk()
    }
}

/// Writes descriptor `i` of the table in `mem`.
pub(super) fn set_desc(mem: &GuestMemoryMmap, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
    let at = GuestAddress(DESC + 16 * u64::from(i));
    mem.write_obj(addr, at).unwrap();
    mem.write_obj(len, at.unchecked_add(8)).unwrap();
    mem.write_obj(flags, at.unchecked_add(12)).unwrap();
    mem.write_obj(next, at.unchecked_add(14)).unwrap();
}

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

#[test]
fn identifies_itself_and_reports_capacity_and_features() {
    let mut d = Driver::raw(8, true);
    assert_eq!(d.r(VIRTIO_MMIO_MAGIC_VALUE), MAGIC);
    assert_eq!(d.r(VIRTIO_MMIO_VERSION), 2);
    assert_eq!(d.r(VIRTIO_MMIO_DEVICE_ID), 2);
    let low = d.r(VIRTIO_MMIO_DEVICE_FEATURES);
    assert_ne!(low & (1 << VIRTIO_BLK_F_RO), 0);
    assert_ne!(low & (1 << VIRTIO_BLK_F_FLUSH), 0);
    d.w(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    assert_eq!(d.r(VIRTIO_MMIO_DEVICE_FEATURES), 1); // VIRTIO_F_VERSION_1
    assert_eq!(d.r(VIRTIO_MMIO_QUEUE_NUM_MAX), 256);
    d.w(VIRTIO_MMIO_QUEUE_SEL, 1);
    assert_eq!(d.r(VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
    let mut cap = [0u8; 8];
    d.mmio.read(0x100, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 8);
    let mut byte = [0u8; 1];
    d.mmio.read(0x100 + 12, &mut byte);
    assert_eq!(byte, [254]); // seg_max
    assert!(Driver::raw(8, false).r(VIRTIO_MMIO_DEVICE_FEATURES) & (1 << VIRTIO_BLK_F_RO) == 0);
    // Narrow register accesses read 0.
    let mut half = [0xffu8; 2];
    d.mmio.read(0, &mut half);
    assert_eq!(half, [0, 0]);
}

#[test]
fn features_ok_needs_version_1_and_offered_bits_only() {
    let mut d = Driver::raw(8, false);
    d.w(VIRTIO_MMIO_STATUS, 3);
    d.w(VIRTIO_MMIO_STATUS, 3 | VIRTIO_CONFIG_S_FEATURES_OK);
    assert_eq!(
        d.r(VIRTIO_MMIO_STATUS),
        3,
        "legacy driver (no VERSION_1) refused"
    );
    d.w(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    d.w(VIRTIO_MMIO_DRIVER_FEATURES, 1 | 2);
    d.w(VIRTIO_MMIO_STATUS, 3 | VIRTIO_CONFIG_S_FEATURES_OK);
    assert_eq!(
        d.r(VIRTIO_MMIO_STATUS),
        3,
        "a feature never offered refused"
    );
    d.w(VIRTIO_MMIO_DRIVER_FEATURES, 1);
    d.w(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
    d.w(VIRTIO_MMIO_DRIVER_FEATURES, 1 << VIRTIO_BLK_F_FLUSH);
    d.w(VIRTIO_MMIO_STATUS, 3 | VIRTIO_CONFIG_S_FEATURES_OK);
    assert_eq!(d.r(VIRTIO_MMIO_STATUS), 3 | VIRTIO_CONFIG_S_FEATURES_OK);
    assert_eq!(d.mmio.driver_features(), 1 << 32 | 1 << VIRTIO_BLK_F_FLUSH);
    // After FEATURES_OK the accepted set is frozen; a reset clears everything.
    d.w(VIRTIO_MMIO_DRIVER_FEATURES, 0);
    assert_eq!(d.mmio.driver_features(), 1 << 32 | 1 << VIRTIO_BLK_F_FLUSH);
    d.w(VIRTIO_MMIO_STATUS, 0);
    assert_eq!(d.r(VIRTIO_MMIO_STATUS), 0);
    assert_eq!(d.mmio.driver_features(), 0);
}

#[test]
fn writes_read_back_flush_and_get_id() {
    let mut d = Driver::ready(64, false);
    let pattern: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
    d.fill_data(&pattern);
    assert_eq!(d.request(VIRTIO_BLK_T_OUT, 3, 1024, false), (OK, 1));
    assert_eq!(&d.disk().bytes[3 * 512..5 * 512], &pattern[..]);
    d.fill_data(&[0; 1024]);
    assert_eq!(d.request(VIRTIO_BLK_T_IN, 3, 1024, true), (OK, 1025));
    assert_eq!(d.data(1024), pattern);
    assert_eq!(d.request(VIRTIO_BLK_T_FLUSH, 0, 0, false), (OK, 1));
    assert_eq!(d.disk().flushes, 1);
    assert_eq!(d.request(VIRTIO_BLK_T_GET_ID, 0, 20, true), (OK, 21));
    assert_eq!(&d.data(20)[..14], b"lull-test-disk");
    assert_eq!(&d.data(20)[14..], &[0; 6]);
    let stats = d.mmio.device().stats();
    assert_eq!(
        (stats.reads, stats.writes, stats.flushes, stats.errors),
        (1, 1, 1, 0)
    );
}

#[test]
fn bad_requests_get_error_statuses() {
    let mut d = Driver::ready(8, false);
    // Unsupported type (discard).
    assert_eq!(d.request(11, 0, 0, false).0, UNSUPP);
    // Past the end, straddling the end, sector overflow, partial sector.
    assert_eq!(d.request(VIRTIO_BLK_T_IN, 8, 512, true).0, IOERR);
    assert_eq!(d.request(VIRTIO_BLK_T_OUT, 7, 1024, false).0, IOERR);
    assert_eq!(d.request(VIRTIO_BLK_T_IN, u64::MAX / 2, 512, true).0, IOERR);
    assert_eq!(d.request(VIRTIO_BLK_T_OUT, 0, 100, false).0, IOERR);
    assert_eq!(d.disk().bytes, vec![0; 8 * 512]);
    // Read-only: writes fail, reads and flushes work.
    let mut ro = Driver::ready(8, true);
    ro.fill_data(&[0xaa; 512]);
    assert_eq!(ro.request(VIRTIO_BLK_T_OUT, 0, 512, false).0, IOERR);
    assert_eq!(ro.disk().bytes, vec![0; 8 * 512]);
    assert_eq!(ro.request(VIRTIO_BLK_T_IN, 0, 512, true).0, OK);
    assert_eq!(ro.request(VIRTIO_BLK_T_FLUSH, 0, 0, false).0, OK);
}

#[test]
fn malformed_chains_are_answered_or_returned() {
    let mut d = Driver::ready(8, false);
    d.mem.write_obj(VIRTIO_BLK_T_IN, GuestAddress(HDR)).unwrap();
    // Header too short.
    assert_eq!(
        d.submit(&[(HDR, 8, false), (DATA, 512, true), (STATUS, 1, true)]),
        Some((0, 1))
    );
    assert_eq!(d.status_byte(), IOERR);
    // Header in a device-writable buffer (wrong direction): no readable header.
    assert_eq!(
        d.submit(&[(HDR, 16, true), (STATUS, 1, true)]),
        Some((0, 1))
    );
    assert_eq!(d.status_byte(), IOERR);
    // A readable buffer after a writable one.
    assert_eq!(
        d.submit(&[
            (HDR, 16, false),
            (DATA, 512, true),
            (DATA, 512, false),
            (STATUS, 1, true)
        ]),
        Some((0, 1))
    );
    assert_eq!(d.status_byte(), IOERR);
    // Readable data outside guest memory.
    d.mem
        .write_obj(VIRTIO_BLK_T_OUT, GuestAddress(HDR))
        .unwrap();
    assert_eq!(
        d.submit(&[
            (HDR, 16, false),
            (MEM_SIZE as u64, 512, false),
            (STATUS, 1, true)
        ]),
        Some((0, 1))
    );
    assert_eq!(d.status_byte(), IOERR);
    // No writable byte at all, or the status outside memory: returned with length 0.
    assert_eq!(d.submit(&[(HDR, 16, false)]), Some((0, 0)));
    assert_eq!(
        d.submit(&[(HDR, 16, false), (u64::MAX - 4, 1, true)]),
        Some((0, 0))
    );
    assert_eq!(d.mmio.device().stats().dropped, 2);
    // A loop (descriptor 0 -> 1 -> 0): the walk ends after the queue's size of descriptors.
    d.set_desc(0, HDR, 16, VRING_DESC_F_NEXT as u16, 1);
    d.set_desc(
        1,
        STATUS,
        1,
        (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE) as u16,
        0,
    );
    let before = d.used_idx();
    d.offer(0);
    assert_eq!(d.used_idx(), before.wrapping_add(1));
    // A head index past the queue's size is not a chain: nothing is used.
    let before = d.used_idx();
    d.offer(QSIZE + 3);
    assert_eq!(d.used_idx(), before);
    assert_eq!(d.mmio.device().stats().bad_heads, 1);
}

#[test]
fn notifications_wait_for_driver_ok_and_valid_rings() {
    let mut d = Driver::raw(8, false);
    d.set_desc(0, HDR, 16, 0, 0);
    d.offer(0);
    assert_eq!(d.used_idx(), 0);
    let mut d = Driver::ready(8, false);
    d.w(VIRTIO_MMIO_QUEUE_READY, 0);
    // Not ready: its used ring may be moved, here out of guest memory; then it is never used.
    d.w(VIRTIO_MMIO_QUEUE_USED_LOW, 0xfff0_0000);
    d.w(VIRTIO_MMIO_QUEUE_READY, 1);
    d.set_desc(0, STATUS, 1, VRING_DESC_F_WRITE as u16, 0);
    d.offer(0);
    assert!(!d.mmio.interrupt_pending());
}

/// The levels a device drove its lines to, in order.
#[derive(Default)]
pub(super) struct Lines(pub Mutex<Vec<(u32, bool)>>);
impl IrqLines for Lines {
    fn set_level(&self, line: u32, asserted: bool) {
        self.0.lock().unwrap().push((line, asserted));
    }
}

#[test]
fn interrupt_line_follows_interrupt_status() {
    let d = Driver::ready(8, false);
    let lines = Arc::new(Lines::default());
    let mut dev = VirtioMmioDevice::new(d.mmio, lines.clone(), 5);
    let mem = d.mem;
    mem.write_obj(VIRTIO_BLK_T_FLUSH, GuestAddress(HDR))
        .unwrap();
    set_desc(&mem, 0, HDR, 16, VRING_DESC_F_NEXT as u16, 1);
    set_desc(&mem, 1, STATUS, 1, VRING_DESC_F_WRITE as u16, 0);
    for idx in 1..=2u16 {
        mem.write_obj(0u16, GuestAddress(AVAIL + 4 + 2 * u64::from(idx - 1)))
            .unwrap();
        mem.write_obj(idx, GuestAddress(AVAIL + 2)).unwrap();
        dev.write(u64::from(VIRTIO_MMIO_QUEUE_NOTIFY), &0u32.to_le_bytes());
    }
    let mut status = [0u8; 4];
    dev.read(u64::from(VIRTIO_MMIO_INTERRUPT_STATUS), &mut status);
    assert_eq!(u32::from_le_bytes(status), VIRTIO_MMIO_INT_VRING);
    dev.write(u64::from(VIRTIO_MMIO_INTERRUPT_ACK), &1u32.to_le_bytes());
    assert!(!dev.transport().interrupt_pending());
    // Raised once for both completions (the line was still high), lowered at the ack.
    assert_eq!(*lines.0.lock().unwrap(), vec![(5, true), (5, false)]);
}

/// The timer requests a device made, in order.
#[derive(Default)]
pub(super) struct Timers(pub Mutex<Vec<u64>>);

impl DeviceTimer for Timers {
    fn request(&self, deadline: u64) {
        self.0.lock().unwrap().push(deadline);
    }
}

#[test]
fn a_throttled_request_waits_in_the_queue_for_its_refill_timer() {
    let now = Arc::new(AtomicU64::new(0));
    let clock = now.clone();
    // 4 KiB per 10 ms: one 4 KiB write every 10 ms after the first.
    let limit: RateLimit = "bandwidth=400K,refill=10ms".parse().unwrap();
    let block = Block::new(MemDisk::new(64), false, b"limited")
        .with_rate_limit(limit, Arc::new(move || clock.load(Ordering::Relaxed)));
    let d = Driver::ready_with(block);
    let lines = Arc::new(Lines::default());
    let timers = Arc::new(Timers::default());
    let mut dev = VirtioMmioDevice::new(d.mmio, lines.clone(), 5).with_timer(timers.clone());
    let mem = d.mem;
    let write = |mem: &GuestMemoryMmap, first_desc: u16, sector: u64| {
        let hdr = HDR + 0x100 * u64::from(first_desc);
        mem.write_obj(VIRTIO_BLK_T_OUT, GuestAddress(hdr)).unwrap();
        mem.write_obj(sector, GuestAddress(hdr + 8)).unwrap();
        set_desc(
            mem,
            first_desc,
            hdr,
            16,
            VRING_DESC_F_NEXT as u16,
            first_desc + 1,
        );
        set_desc(
            mem,
            first_desc + 1,
            DATA,
            4096,
            VRING_DESC_F_NEXT as u16,
            first_desc + 2,
        );
        let status = STATUS + u64::from(first_desc);
        set_desc(mem, first_desc + 2, status, 1, VRING_DESC_F_WRITE as u16, 0);
    };
    let used = |mem: &GuestMemoryMmap| mem.read_obj::<u16>(GuestAddress(USED + 2)).unwrap();
    let notify = |dev: &mut VirtioMmioDevice<_, _>| {
        dev.write(u64::from(VIRTIO_MMIO_QUEUE_NOTIFY), &0u32.to_le_bytes());
    };
    let stats =
        |dev: &VirtioMmioDevice<Block<MemDisk>, GuestMemoryMmap>| dev.transport().device().stats();
    // Two writes offered together: the first goes, the second waits in the queue.
    for (i, head) in [0u16, 3].into_iter().enumerate() {
        write(&mem, head, i as u64 * 8);
        mem.write_obj(head, GuestAddress(AVAIL + 4 + 2 * i as u64))
            .unwrap();
    }
    // The bucket holds 4000 bytes of 4096 less header and status: the first write is
    // oversized (let through full), the second waits for the debt to be repaid.
    mem.write_obj(2u16, GuestAddress(AVAIL + 2)).unwrap();
    notify(&mut dev);
    assert_eq!(used(&mem), 1);
    let asked = timers.0.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    let at = asked[0];
    assert!((10_000_000..=20_100_000).contains(&at), "{at}");
    assert_eq!(stats(&dev).throttled, 1);
    // A notification before the refill changes nothing and asks for no second timer.
    now.store(at - 1, Ordering::Relaxed);
    notify(&mut dev);
    assert_eq!(used(&mem), 1);
    assert_eq!(timers.0.lock().unwrap().len(), 1);
    dev.write(u64::from(VIRTIO_MMIO_INTERRUPT_ACK), &1u32.to_le_bytes());
    // The timer fires: the waiting write completes and the line goes up again.
    now.store(at, Ordering::Relaxed);
    dev.timer_fired();
    assert_eq!(used(&mem), 2);
    assert!(dev.transport().interrupt_pending());
    assert_eq!(stats(&dev).writes, 2);
    assert_eq!(stats(&dev).refills, 1);
    assert_eq!(timers.0.lock().unwrap().len(), 1, "nothing left waiting");
    assert_eq!(
        *lines.0.lock().unwrap(),
        vec![(5, true), (5, false), (5, true)]
    );
}
