//! virtio-net through its MMIO transport on a [`MemBackend`], driven as a guest driver would:
//! the handshake, two queues whose rings live in a `GuestMemoryMmap`, QueueNotify, and the
//! VMM's `poll_queue` when the backend has frames. Then property tests: whatever a driver
//! puts in the descriptor tables and rings, the device never panics and accounts for every
//! chain and frame.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use virtio_bindings::virtio_config::*;
use virtio_bindings::virtio_mmio::*;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MAC;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use super::mmio::{VirtioMmio, VirtioMmioDevice};
use super::net::{MemBackend, Net, NetStats, HEADER_BYTES, RX_QUEUE, TX_QUEUE};
use super::tests::{Lines, Timers};
use crate::mmio::MmioDevice;
use crate::rate_limiter::RateLimit;

const MEM_SIZE: usize = 1 << 20;
const QSIZE: u16 = 16;
/// Descriptor table, available and used ring of queue `q` (0: RX, 1: TX).
const fn rings(q: u64) -> (u64, u64, u64) {
    (
        0x1000 + q * 0x4000,
        0x2000 + q * 0x4000,
        0x3000 + q * 0x4000,
    )
}
const BUF: u64 = 0x20000;
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

type Transport = VirtioMmio<Net<MemBackend>, GuestMemoryMmap>;

/// A guest driver of one virtio-net device.
struct Driver {
    mmio: Transport,
    mem: Arc<GuestMemoryMmap>,
    avail_idx: [u16; 2],
}

/// A descriptor: address, length, device-writable.
type Desc = (u64, u32, bool);

impl Driver {
    fn raw_with(net: Net<MemBackend>) -> Self {
        let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap());
        Self {
            mmio: VirtioMmio::new(net, mem.clone()),
            mem,
            avail_idx: [0; 2],
        }
    }

    fn raw() -> Self {
        Self::raw_with(Net::new(MemBackend::default(), MAC))
    }

    /// A driver of `net` brought to DRIVER_OK with both queues of [`QSIZE`].
    fn ready_with(net: Net<MemBackend>) -> Self {
        let mut d = Self::raw_with(net);
        d.w(
            VIRTIO_MMIO_STATUS,
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
        );
        d.w(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        d.w(VIRTIO_MMIO_DRIVER_FEATURES, 1 << VIRTIO_NET_F_MAC);
        d.w(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        d.w(VIRTIO_MMIO_DRIVER_FEATURES, 1);
        let s = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK;
        d.w(VIRTIO_MMIO_STATUS, s);
        assert_eq!(d.r(VIRTIO_MMIO_STATUS), s);
        for q in 0..2u32 {
            let (desc, avail, used) = rings(u64::from(q));
            d.w(VIRTIO_MMIO_QUEUE_SEL, q);
            d.w(VIRTIO_MMIO_QUEUE_NUM, u32::from(QSIZE));
            d.w(VIRTIO_MMIO_QUEUE_DESC_LOW, desc as u32);
            d.w(VIRTIO_MMIO_QUEUE_AVAIL_LOW, avail as u32);
            d.w(VIRTIO_MMIO_QUEUE_USED_LOW, used as u32);
            d.w(VIRTIO_MMIO_QUEUE_READY, 1);
        }
        d.w(VIRTIO_MMIO_STATUS, s | VIRTIO_CONFIG_S_DRIVER_OK);
        d
    }

    fn ready() -> Self {
        Self::ready_with(Net::new(MemBackend::default(), MAC))
    }

    fn r(&mut self, reg: u32) -> u32 {
        let mut b = [0u8; 4];
        self.mmio.read(u64::from(reg), &mut b);
        u32::from_le_bytes(b)
    }

    fn w(&mut self, reg: u32, v: u32) {
        self.mmio.write(u64::from(reg), &v.to_le_bytes());
    }

    fn used_idx(&self, q: usize) -> u16 {
        self.mem
            .read_obj(GuestAddress(rings(q as u64).2 + 2))
            .unwrap()
    }

    /// The used element at position `pos` of queue `q`: (id, len).
    fn used_elem(&self, q: usize, pos: u16) -> (u32, u32) {
        let elem = rings(q as u64).2 + 4 + 8 * u64::from(pos % QSIZE);
        (
            self.mem.read_obj(GuestAddress(elem)).unwrap(),
            self.mem.read_obj(GuestAddress(elem + 4)).unwrap(),
        )
    }

    fn set_desc(&self, q: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = GuestAddress(rings(q as u64).0 + 16 * u64::from(i));
        self.mem.write_obj(addr, at).unwrap();
        self.mem.write_obj(len, at.unchecked_add(8)).unwrap();
        self.mem.write_obj(flags, at.unchecked_add(12)).unwrap();
        self.mem.write_obj(next, at.unchecked_add(14)).unwrap();
    }

    /// Writes `descs` as one chain from descriptor `first` of queue `q`.
    fn chain(&self, q: usize, first: u16, descs: &[Desc]) {
        for (k, &(addr, len, write)) in descs.iter().enumerate() {
            let i = first + u16::try_from(k).unwrap();
            let mut flags = if write { VRING_DESC_F_WRITE as u16 } else { 0 };
            if k + 1 < descs.len() {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            self.set_desc(q, i, addr, len, flags, i + 1);
        }
    }

    /// Makes `head` available on queue `q` without notifying.
    fn post(&mut self, q: usize, head: u16) {
        let avail = rings(q as u64).1;
        let slot = avail + 4 + 2 * u64::from(self.avail_idx[q] % QSIZE);
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.avail_idx[q] = self.avail_idx[q].wrapping_add(1);
        self.mem
            .write_obj(self.avail_idx[q], GuestAddress(avail + 2))
            .unwrap();
    }

    fn notify(&mut self, q: usize) {
        self.w(VIRTIO_MMIO_QUEUE_NOTIFY, q as u32);
    }

    /// Sends `descs` as one TX chain from descriptor 0; the used element, if returned.
    fn send(&mut self, descs: &[Desc]) -> Option<(u32, u32)> {
        self.chain(TX_QUEUE, 0, descs);
        let before = self.used_idx(TX_QUEUE);
        self.post(TX_QUEUE, 0);
        self.notify(TX_QUEUE);
        (self.used_idx(TX_QUEUE) != before).then(|| self.used_elem(TX_QUEUE, before))
    }

    fn backend(&mut self) -> &mut MemBackend {
        self.mmio.device_mut().backend_mut()
    }

    fn stats(&self) -> NetStats {
        self.mmio.device().stats()
    }

    fn bytes(&self, at: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(at)).unwrap();
        v
    }
}

/// An Ethernet frame of `len` bytes whose bytes count up from `seed`.
fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

#[test]
fn identifies_itself_with_its_mac_and_two_queues() {
    let mut d = Driver::raw();
    assert_eq!(d.r(VIRTIO_MMIO_DEVICE_ID), 1);
    let low = d.r(VIRTIO_MMIO_DEVICE_FEATURES);
    assert_ne!(low & (1 << VIRTIO_NET_F_MAC), 0);
    d.w(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    assert_eq!(d.r(VIRTIO_MMIO_DEVICE_FEATURES), 1); // VIRTIO_F_VERSION_1
    for q in 0..2 {
        d.w(VIRTIO_MMIO_QUEUE_SEL, q);
        assert_eq!(d.r(VIRTIO_MMIO_QUEUE_NUM_MAX), 256);
    }
    d.w(VIRTIO_MMIO_QUEUE_SEL, 2);
    assert_eq!(d.r(VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
    let mut config = [0xffu8; 8];
    d.mmio.read(0x100, &mut config);
    assert_eq!(config, [0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0, 0]);
    let mut byte = [0u8; 1];
    d.mmio.read(0x100 + 5, &mut byte);
    assert_eq!(byte, [0x56]);
    d.mmio.write(0x100, &[1, 2, 3, 4, 5, 6]);
    d.mmio.read(0x100, &mut config);
    assert_eq!(&config[..6], &MAC, "the MAC is read-only");
}

#[test]
fn sent_frames_reach_the_backend_header_stripped() {
    let mut d = Driver::ready();
    let f = frame(60, 7);
    // Header and frame in one buffer.
    d.mem
        .write_slice(&[0; HEADER_BYTES], GuestAddress(BUF))
        .unwrap();
    d.mem
        .write_slice(&f, GuestAddress(BUF + HEADER_BYTES as u64))
        .unwrap();
    assert_eq!(d.send(&[(BUF, 72, false)]), Some((0, 0)));
    // The header split over two buffers, the frame over two more.
    assert_eq!(
        d.send(&[
            (BUF, 5, false),
            (BUF + 5, 7, false),
            (BUF + 12, 30, false),
            (BUF + 42, 30, false)
        ]),
        Some((0, 0))
    );
    assert_eq!(d.mmio.device().backend().sent, vec![f.clone(), f]);
    let s = d.stats();
    assert_eq!((s.tx_frames, s.tx_bytes, s.tx_dropped), (2, 120, 0));
    assert!(d.mmio.interrupt_pending());
}

#[test]
fn malformed_transmit_chains_are_returned_unsent() {
    let mut d = Driver::ready();
    // No whole header; a runt (header + 13 bytes); a buffer outside guest memory; only
    // device-writable buffers; an oversized frame.
    let bad: [&[Desc]; 5] = [
        &[(BUF, 8, false)],
        &[(BUF, 25, false)],
        &[(BUF, 12, false), (MEM_SIZE as u64 - 4, 64, false)],
        &[(BUF, 80, true)],
        &[(BUF, 12, false), (BUF, 70_000, false)],
    ];
    for chain in bad {
        assert_eq!(d.send(chain), Some((0, 0)), "{chain:?}");
    }
    assert!(d.mmio.device().backend().sent.is_empty());
    assert_eq!(d.stats().tx_dropped, 5);
    // A refused frame is counted as an error, and the chain still comes back.
    d.backend().refuse_writes = true;
    assert_eq!(d.send(&[(BUF, 72, false)]), Some((0, 0)));
    assert_eq!(d.stats().tx_errors, 1);
    // A head past the queue's size is not a chain: skipped and counted.
    let before = d.used_idx(TX_QUEUE);
    d.post(TX_QUEUE, QSIZE + 1);
    d.notify(TX_QUEUE);
    assert_eq!(d.used_idx(TX_QUEUE), before);
    assert_eq!(d.stats().bad_heads, 1);
}

#[test]
fn received_frames_wait_for_a_buffer_and_get_a_header() {
    let mut d = Driver::ready();
    let f = frame(100, 1);
    d.backend().incoming.push_back(f.clone());
    // No buffer posted: the frame stays in the backend.
    d.mmio.poll_queue(RX_QUEUE as u32);
    assert_eq!(d.used_idx(RX_QUEUE), 0);
    assert_eq!(d.mmio.device().backend().incoming.len(), 1);
    assert!(!d.mmio.interrupt_pending());
    // A buffer split in two (the header spans both): the driver's notification delivers.
    d.chain(RX_QUEUE, 0, &[(BUF, 8, true), (BUF + 8, 1600, true)]);
    d.post(RX_QUEUE, 0);
    d.notify(RX_QUEUE);
    assert_eq!(d.used_idx(RX_QUEUE), 1);
    assert_eq!(d.used_elem(RX_QUEUE, 0), (0, 112));
    let mut header = [0u8; HEADER_BYTES];
    header[10] = 1; // num_buffers
    assert_eq!(d.bytes(BUF, HEADER_BYTES), header);
    assert_eq!(d.bytes(BUF + 12, 100), f);
    assert!(d.mmio.interrupt_pending());
    // Nothing more waiting: a poll with a buffer posted leaves it posted.
    d.chain(RX_QUEUE, 2, &[(BUF + 0x1000, 1600, true)]);
    d.post(RX_QUEUE, 2);
    d.mmio.poll_queue(RX_QUEUE as u32);
    assert_eq!(d.used_idx(RX_QUEUE), 1);
    d.backend().incoming.push_back(frame(60, 9));
    d.mmio.poll_queue(RX_QUEUE as u32);
    assert_eq!(d.used_elem(RX_QUEUE, 1), (2, 72));
    let s = d.stats();
    assert_eq!((s.rx_frames, s.rx_bytes, s.rx_dropped), (2, 160, 0));
}

#[test]
fn frames_that_do_not_fit_are_dropped_and_the_buffer_kept() {
    let mut d = Driver::ready();
    d.chain(RX_QUEUE, 0, &[(BUF, 80, true)]);
    d.post(RX_QUEUE, 0);
    let backend = d.backend();
    backend.incoming.push_back(frame(100, 0)); // 12 + 100 > 80
    backend.incoming.push_back(frame(10, 0)); // a runt
    backend.incoming.push_back(frame(68, 3)); // 12 + 68 = 80: fits
    d.mmio.poll_queue(RX_QUEUE as u32);
    assert_eq!(d.used_idx(RX_QUEUE), 1);
    assert_eq!(d.used_elem(RX_QUEUE, 0), (0, 80));
    assert_eq!(d.bytes(BUF + 12, 68), frame(68, 3));
    assert_eq!(d.stats().rx_dropped, 2);
    // A chain with a buffer outside guest memory is returned unused, the frame kept.
    d.chain(RX_QUEUE, 1, &[(MEM_SIZE as u64 - 8, 1600, true)]);
    d.post(RX_QUEUE, 1);
    d.chain(RX_QUEUE, 2, &[(BUF, 1600, true)]);
    d.post(RX_QUEUE, 2);
    d.backend().incoming.push_back(frame(60, 5));
    d.mmio.poll_queue(RX_QUEUE as u32);
    assert_eq!(d.used_elem(RX_QUEUE, 1), (1, 0));
    assert_eq!(d.used_elem(RX_QUEUE, 2), (2, 72));
    assert_eq!(d.stats().rx_bad_chains, 1);
    assert_eq!(d.stats().rx_frames, 2);
    // Chains with no room for any frame (only device-readable buffers; 25 writable bytes)
    // come back unused, and no frame is read for them.
    d.chain(RX_QUEUE, 3, &[(BUF, 1600, false)]);
    d.post(RX_QUEUE, 3);
    d.chain(RX_QUEUE, 4, &[(BUF, 25, true)]);
    d.post(RX_QUEUE, 4);
    d.backend().incoming.push_back(frame(60, 6));
    d.mmio.poll_queue(RX_QUEUE as u32);
    assert_eq!(d.used_elem(RX_QUEUE, 3), (3, 0));
    assert_eq!(d.used_elem(RX_QUEUE, 4), (4, 0));
    assert_eq!(d.stats().rx_bad_chains, 3);
    assert_eq!(d.stats().rx_dropped, 2);
    assert_eq!(d.mmio.device().backend().incoming.len(), 1);
}

#[test]
fn nothing_moves_before_driver_ok() {
    let mut d = Driver::raw();
    d.backend().incoming.push_back(frame(60, 0));
    d.chain(RX_QUEUE, 0, &[(BUF, 1600, true)]);
    d.post(RX_QUEUE, 0);
    d.mmio.poll_queue(RX_QUEUE as u32);
    d.notify(RX_QUEUE);
    assert_eq!(d.mmio.device().backend().incoming.len(), 1);
    assert_eq!(d.stats(), NetStats::default());
}

#[test]
fn a_poll_raises_the_line_and_a_throttled_frame_waits_for_its_refill() {
    let now = Arc::new(AtomicU64::new(0));
    let clock = now.clone();
    // One frame every 100 ms; the bucket holds one.
    let limit: RateLimit = "ops=10".parse().unwrap();
    let net = Net::new(MemBackend::default(), MAC)
        .with_tx_rate_limit(limit, Arc::new(move || clock.load(Ordering::Relaxed)));
    let d = Driver::ready_with(net);
    for i in 0..2u16 {
        d.chain(TX_QUEUE, i, &[(BUF, 72, false)]);
    }
    d.chain(RX_QUEUE, 0, &[(BUF + 0x1000, 1600, true)]);
    let mem = d.mem.clone();
    let mut driver = d;
    driver.post(TX_QUEUE, 0);
    driver.post(TX_QUEUE, 1);
    driver.post(RX_QUEUE, 0);
    let lines = Arc::new(Lines::default());
    let timers = Arc::new(Timers::default());
    let Driver { mmio, .. } = driver;
    let mut dev = VirtioMmioDevice::new(mmio, lines.clone(), 9).with_timer(timers.clone());
    let used = |q: u64| mem.read_obj::<u16>(GuestAddress(rings(q).2 + 2)).unwrap();
    dev.write(
        u64::from(VIRTIO_MMIO_QUEUE_NOTIFY),
        &(TX_QUEUE as u32).to_le_bytes(),
    );
    assert_eq!(used(1), 1, "the second frame waits");
    assert_eq!(*timers.0.lock().unwrap(), vec![100_000_000]);
    dev.write(u64::from(VIRTIO_MMIO_INTERRUPT_ACK), &1u32.to_le_bytes());
    // A received frame, polled for by the VMM: delivered, the line up again.
    arrive_and_poll(&mut dev, frame(60, 0));
    assert_eq!(used(0), 1);
    dev.write(u64::from(VIRTIO_MMIO_INTERRUPT_ACK), &1u32.to_le_bytes());
    now.store(100_000_000, Ordering::Relaxed);
    dev.timer_fired();
    assert_eq!(used(1), 2);
    let s = dev.transport().device().stats();
    assert_eq!((s.tx_frames, s.throttled, s.refills), (2, 1, 1));
    assert_eq!(
        *lines.0.lock().unwrap(),
        vec![(9, true), (9, false), (9, true), (9, false), (9, true)]
    );
}

/// A frame arrives at the device's backend and the VMM polls the receive queue, as on a tap's
/// readable edge.
fn arrive_and_poll(dev: &mut VirtioMmioDevice<Net<MemBackend>, GuestMemoryMmap>, f: Vec<u8>) {
    dev.transport_mut()
        .device_mut()
        .backend_mut()
        .incoming
        .push_back(f);
    dev.poll_queue(RX_QUEUE as u32);
}

#[test]
fn a_quiesced_device_receives_nothing_until_it_is_released() {
    let mut d = Driver::ready();
    d.chain(RX_QUEUE, 0, &[(BUF, 1600, true)]);
    d.post(RX_QUEUE, 0);
    let mem = d.mem.clone();
    let Driver { mmio, .. } = d;
    let lines = Arc::new(Lines::default());
    let mut dev = VirtioMmioDevice::new(mmio, lines.clone(), 9);
    let used = || mem.read_obj::<u16>(GuestAddress(rings(0).2 + 2)).unwrap();
    dev.quiesce(true);
    let saved = dev.save();
    arrive_and_poll(&mut dev, frame(60, 0));
    dev.timer_fired();
    assert_eq!(used(), 0, "a quiesced device took a frame");
    assert_eq!(dev.save(), saved, "a quiesced device changed its state");
    assert!(lines.0.lock().unwrap().is_empty());
    dev.quiesce(false);
    assert_eq!(
        used(),
        1,
        "the poll missed while quiesced is served at the release"
    );
    assert_eq!(*lines.0.lock().unwrap(), vec![(9, true)]);
}

#[test]
fn a_restored_device_receives_into_the_buffers_posted_before_the_save() {
    let mut d = Driver::ready();
    for (i, at) in [BUF, BUF + 0x1000].into_iter().enumerate() {
        let head = u16::try_from(i).unwrap();
        d.chain(RX_QUEUE, head, &[(at, 1600, true)]);
        d.post(RX_QUEUE, head);
    }
    assert!(d
        .send(&[(BUF + 0x4000, (HEADER_BYTES + 60) as u32, false)])
        .is_some());
    d.backend().incoming.push_back(frame(60, 1));
    d.mmio.poll_queue(RX_QUEUE as u32);
    assert_eq!(d.used_idx(RX_QUEUE), 1);
    let text = serde_json::to_string(&d.mmio.save()).unwrap();
    // A new device on a copy of guest memory, restored from the saved text.
    let mut copy = Driver::raw();
    copy.mem
        .write_slice(&d.bytes(0, MEM_SIZE), GuestAddress(0))
        .unwrap();
    copy.avail_idx = d.avail_idx;
    copy.mmio
        .restore(&serde_json::from_str(&text).unwrap())
        .unwrap();
    for drv in [&mut d, &mut copy] {
        drv.backend().incoming.push_back(frame(80, 7));
        drv.mmio.poll_queue(RX_QUEUE as u32);
        assert_eq!(
            drv.used_idx(RX_QUEUE),
            2,
            "the second posted buffer took the frame"
        );
        assert!(drv
            .send(&[(BUF + 0x4000, (HEADER_BYTES + 60) as u32, false)])
            .is_some());
    }
    assert_eq!(copy.used_elem(RX_QUEUE, 1), d.used_elem(RX_QUEUE, 1));
    assert_eq!(copy.bytes(BUF + 0x1000, 1600), d.bytes(BUF + 0x1000, 1600));
    assert_eq!(copy.used_idx(TX_QUEUE), d.used_idx(TX_QUEUE));
    assert_eq!(copy.backend().sent, d.backend().sent[1..]);
    assert_eq!(copy.mmio.save(), d.mmio.save());
}

/// Addresses mostly in a small data area, sometimes anywhere (outside guest memory, near the
/// top of the address space); never on the rings, so that used indexes stay the device's.
fn addr() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (0x20000u64..0x20400).prop_map(|a| a & !0x7),
        1 => 0x20000u64..(MEM_SIZE as u64 + 0x1000),
        1 => any::<u64>(),
    ]
}

fn len() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => prop::sample::select(vec![0u32, 1, 8, 12, 14, 26, 64, 1514, 1526, 4096]),
        1 => any::<u32>(),
    ]
}

/// (addr, len, flags, next) for each descriptor of a table.
fn table() -> impl Strategy<Value = Vec<(u64, u32, u16, u16)>> {
    prop::collection::vec(
        (addr(), len(), 0u16..8, 0u16..(QSIZE + 2)),
        usize::from(QSIZE),
    )
}

proptest! {
    #[test]
    fn arbitrary_chains_and_frames_never_panic(
        tables in (table(), table()),
        heads in prop::collection::vec((0usize..2, 0u16..(QSIZE + 2)), 1..12),
        frames in prop::collection::vec(0usize..2000, 0..8),
    ) {
        let mut d = Driver::ready();
        for (q, t) in [tables.0, tables.1].iter().enumerate() {
            for (i, (a, l, f, n)) in t.iter().enumerate() {
                d.set_desc(q, u16::try_from(i).unwrap(), *a, *l, *f, *n);
            }
        }
        let total_frames = frames.len() as u64;
        for (k, len) in frames.iter().enumerate() {
            d.backend().incoming.push_back(frame(*len, k as u8));
        }
        let mut used = [0u64; 2];
        for (q, head) in heads {
            let before = d.used_idx(q);
            d.post(q, head);
            if q == RX_QUEUE && head % 2 == 0 {
                d.mmio.poll_queue(0);
            } else {
                d.notify(q);
            }
            let after = d.used_idx(q);
            prop_assert!(after.wrapping_sub(before) <= QSIZE);
            used[q] += u64::from(after.wrapping_sub(before));
        }
        let s = d.stats();
        // Every returned chain is counted once; every frame is delivered, dropped or waits.
        prop_assert_eq!(used[TX_QUEUE], s.tx_frames + s.tx_dropped + s.tx_errors);
        prop_assert_eq!(used[RX_QUEUE], s.rx_frames + s.rx_bad_chains);
        let waiting = d.mmio.device().backend().incoming.len() as u64;
        prop_assert_eq!(total_frames, s.rx_frames + s.rx_dropped + waiting);
        prop_assert_eq!(d.mmio.device().backend().sent.len() as u64, s.tx_frames);
    }
}
