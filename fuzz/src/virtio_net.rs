//! The `virtio_net` target: lull's real virtio-net device behind its real virtio-mmio
//! transport and bus adapter (`devices::virtio`), on an in-memory backend, driven by a guest
//! that writes anything anywhere (register accesses of any offset and width, descriptor
//! tables and rings of both queues built from arbitrary descriptors, raw bytes over any of it,
//! available indexes out of step, notifications of any queue) and by a host that hands it
//! frames of any length (runts and oversized ones included) and polls it as the VMM thread
//! does when a tap is readable.
//!
//! After every step:
//! - the interrupt line is high exactly while InterruptStatus is not zero, and it only ever
//!   changes level;
//! - FEATURES_OK stands only for a feature set the device offered that includes VERSION_1;
//! - no frame is lost silently: every frame handed in was delivered, dropped (counted) or
//!   still waits in the backend; every frame sent reached the backend whole and is a valid
//!   length; the backend got exactly the frames counted as sent;
//! - one notification, poll or timer serves at most the queue's size of chains per queue;
//! - with an `ops=` transmit rate limit (on a fake clock the input advances), the device never
//!   sends more frames than the bucket's size plus what refilled since the start, and it asks
//!   for a refill timer only for an instant after the clock's now.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use devices::mmio::MmioDevice;
use devices::rate_limiter::RateLimit;
use devices::virtio::mmio::{VirtioMmio, VirtioMmioDevice};
use devices::virtio::net::{
    MemBackend, Net, NetStats, ETH_HEADER_BYTES, FRAME_MAX, RX_DROPS_PER_PASS,
};
use devices::virtio::DeviceTimer;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::virtio_mmio_driver::{
    check_transport, le, Line, FEATURES_OK, LINE, MEM_SIZE, REGISTERS,
};

/// Descriptor table, available ring and used ring of each queue (0: RX, 1: TX).
const RINGS: [(u32, u32, u32); 2] = [(0x0, 0x1000, 0x2000), (0x3000, 0x4000, 0x5000)];
const MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];

#[derive(Arbitrary, Debug)]
enum Op {
    /// A 32-bit write of a known register.
    Write { reg: u8, value: u32 },
    /// Any write in the window.
    WildWrite { offset: u16, len: u8, value: u64 },
    /// Any read in the window.
    Read { offset: u16, len: u8 },
    /// The whole handshake to DRIVER_OK, both queues of `2^size_log` at the usual rings.
    Handshake {
        size_log: u8,
        features_high: u32,
        features_low: u32,
    },
    /// One descriptor of either table.
    Desc {
        queue: bool,
        index: u8,
        addr: u8,
        len: u8,
        wild_len: u32,
        flags: u8,
        next: u8,
    },
    /// A well-formed frame to send (header and frame, maybe split), offered and notified.
    Send { head: u8, len: u16, split: bool },
    /// A well-formed receive buffer (maybe split) offered, the driver notifying or not.
    PostRx {
        head: u8,
        len: u16,
        split: bool,
        notify: bool,
    },
    /// The host has a frame for the guest.
    Frame { len: u16, seed: u8 },
    /// The VMM thread polls (the tap became readable).
    Poll,
    /// Raw bytes anywhere in guest memory.
    Poke { at: u16, bytes: [u8; 8] },
    /// Puts `head` in the next available slot of a queue and bumps its available index.
    Offer { queue: bool, head: u16 },
    /// Sets a queue's available index to anything.
    AvailIdx { queue: bool, idx: u16 },
    /// QueueNotify.
    Notify(u8),
    /// InterruptACK.
    Ack(u32),
    /// The host's queue refuses (or takes again) the frames the guest sends.
    RefuseWrites(bool),
    /// The fake clock moves on by this many microseconds.
    Advance(u16),
    /// The refill timer fires (whether or not one was asked for, and whenever).
    TimerFired,
}

/// The transmit rate limits an input may choose (index by its first byte; none most often).
const LIMITS: [&str; 3] = ["", "ops=1000,refill=5ms", "ops=50"];

/// The device's fake clock and the refill timers it asked for.
#[derive(Default)]
struct Timers {
    now: AtomicU64,
}

impl DeviceTimer for Timers {
    fn request(&self, deadline: u64) {
        assert!(
            deadline > self.now.load(Ordering::Relaxed),
            "a refill timer asked for at or before now"
        );
    }
}

struct Fuzz {
    dev: VirtioMmioDevice<Net<MemBackend>, GuestMemoryMmap>,
    mem: Arc<GuestMemoryMmap>,
    line: Arc<Line>,
    avail_idx: [u16; 2],
    timers: Arc<Timers>,
    limit: RateLimit,
    /// Frames handed to the backend so far.
    frames_in: u64,
}

/// A descriptor's length from the input: the sizes the device cares about (a header, a byte,
/// a frame's head, a page's worth, an Ethernet header, 8, 0), or any.
fn desc_len(len: u8, wild_len: u32) -> u32 {
    match len % 8 {
        0 => 12,
        1 => 1,
        2 => 64,
        3 => 1024,
        4 => 14,
        5 => 8,
        6 => 0,
        _ => wild_len,
    }
}

/// A frame from the tap: mostly Ethernet-sized; an oversized one now and then.
fn frame(len: u16, seed: u8) -> Vec<u8> {
    let len = if len & 0x8000 != 0 {
        usize::from(len)
    } else {
        usize::from(len) % 2048
    };
    (0..len)
        .map(|i| seed.wrapping_add(i.to_le_bytes()[0]))
        .collect()
}

/// A buffer address: mostly one of 32 slots of 1 KiB in the data area (`shape` / 8), else one
/// that straddles the end of guest memory, or one far outside it.
fn buffer(shape: u8) -> u64 {
    match shape % 8 {
        6 => MEM_SIZE as u64 - 8,
        7 => u64::MAX - 0x100,
        _ => 0x6000 + u64::from(shape / 8) * 0x400,
    }
}

/// Chains of queue `q` the device has returned or skipped.
fn served(s: NetStats, q: usize) -> u64 {
    if q == 0 {
        s.rx_frames + s.rx_bad_chains + s.bad_heads
    } else {
        s.tx_frames + s.tx_dropped + s.tx_errors + s.bad_heads
    }
}

impl Fuzz {
    fn write32(&mut self, reg: u16, value: u32) {
        self.dev.write(u64::from(reg), &value.to_le_bytes());
    }

    fn stats(&self) -> NetStats {
        self.dev.transport().device().stats()
    }

    fn backend(&mut self) -> &mut MemBackend {
        self.dev.transport_mut().device_mut().backend_mut()
    }

    /// Runs `f` and checks it served at most a queue's worth of chains on each queue.
    fn bounded(&mut self, f: impl FnOnce(&mut Self)) {
        let before = self.stats();
        f(self);
        let after = self.stats();
        for q in 0..2 {
            let n = served(after, q) - served(before, q);
            assert!(n <= 2 * 256, "one pass served {n} chains of queue {q}");
        }
        assert!(
            after.rx_dropped - before.rx_dropped <= 2 * RX_DROPS_PER_PASS as u64,
            "one pass dropped {} frames",
            after.rx_dropped - before.rx_dropped
        );
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Write { reg, value } => {
                let reg = REGISTERS[usize::from(reg) % REGISTERS.len()];
                self.bounded(|f| f.write32(reg, value));
            }
            Op::WildWrite { offset, len, value } => {
                let data = le(value, usize::from(len % 9));
                self.bounded(|f| f.dev.write(u64::from(offset % 0x200), &data));
            }
            Op::Read { offset, len } => {
                let mut data = vec![0u8; usize::from(len % 9)];
                self.dev.read(u64::from(offset % 0x200), &mut data);
            }
            Op::Handshake {
                size_log,
                features_high,
                features_low,
            } => self.handshake(size_log, features_high, features_low),
            Op::Desc {
                queue,
                index,
                addr,
                len,
                wild_len,
                flags,
                next,
            } => {
                let len = desc_len(len, wild_len);
                let q = usize::from(queue);
                self.desc(q, index, buffer(addr), len, u16::from(flags & 7), next);
            }
            Op::Send { head, len, split } => self.chain(1, head, len, split, 0, true),
            Op::PostRx {
                head,
                len,
                split,
                notify,
            } => self.chain(0, head, len, split, 2, notify),
            Op::Frame { len, seed } => {
                self.backend().incoming.push_back(frame(len, seed));
                self.frames_in += 1;
            }
            Op::Poll => self.bounded(|f| f.dev.poll_queue(0)),
            Op::Poke { at, bytes } => {
                let _ = self.mem.write_slice(&bytes, GuestAddress(u64::from(at)));
            }
            Op::Offer { queue, head } => self.offer(usize::from(queue), head),
            Op::AvailIdx { queue, idx } => self.set_avail_idx(usize::from(queue), idx),
            Op::Notify(queue) => self.bounded(|f| f.write32(0x050, u32::from(queue % 3))),
            Op::Ack(value) => self.write32(0x064, value),
            Op::RefuseWrites(refuse) => self.backend().refuse_writes = refuse,
            Op::Advance(us) => {
                self.timers
                    .now
                    .fetch_add(u64::from(us) * 1000, Ordering::Relaxed);
            }
            Op::TimerFired => self.bounded(|f| f.dev.timer_fired()),
        }
    }

    /// The guest sets queue `q`'s available index to `idx` (without offering a chain).
    fn set_avail_idx(&mut self, q: usize, idx: u16) {
        self.avail_idx[q] = idx;
        let _ = self
            .mem
            .write_obj(idx, GuestAddress(u64::from(RINGS[q].1) + 2));
    }

    fn desc(&self, q: usize, index: u8, addr: u64, len: u32, flags: u16, next: u8) {
        let at = u64::from(RINGS[q].0) + 16 * u64::from(index % 32);
        let _ = self.mem.write_obj(addr, GuestAddress(at));
        let _ = self.mem.write_obj(len, GuestAddress(at + 8));
        let _ = self.mem.write_obj(flags, GuestAddress(at + 12));
        let _ = self
            .mem
            .write_obj(u16::from(next % 32), GuestAddress(at + 14));
    }

    fn offer(&mut self, q: usize, head: u16) {
        let avail = u64::from(RINGS[q].1);
        let slot = avail + 4 + 2 * u64::from(self.avail_idx[q] % 256);
        let _ = self.mem.write_obj(head, GuestAddress(slot));
        self.avail_idx[q] = self.avail_idx[q].wrapping_add(1);
        let _ = self
            .mem
            .write_obj(self.avail_idx[q], GuestAddress(avail + 2));
    }

    /// A chain of one or two buffers of `len` bytes in all at descriptor `head` of queue `q`
    /// (`flags` on every buffer), offered, then notified if `notify`.
    fn chain(&mut self, q: usize, head: u8, len: u16, split: bool, flags: u16, notify: bool) {
        const NEXT: u16 = 1;
        let h = head % 16;
        let len = u32::from(len) % 2048;
        let slot = (h * 16) % 240;
        if split {
            self.desc(q, h, buffer(slot), len / 2, NEXT | flags, h + 1);
            self.desc(q, h + 1, buffer(slot + 8), len - len / 2, flags, 0);
        } else {
            self.desc(q, h, buffer(slot), len, flags, 0);
        }
        if q == 1 {
            // A zero header (the first 12 bytes), then the frame.
            let _ = self.mem.write_slice(&[0u8; 12], GuestAddress(buffer(slot)));
        }
        self.offer(q, u16::from(h));
        if notify {
            self.bounded(|f| f.write32(0x050, u32::try_from(q).unwrap_or(0)));
        }
    }

    fn handshake(&mut self, size_log: u8, features_high: u32, features_low: u32) {
        self.write32(0x070, 0);
        self.write32(0x070, 3);
        self.write32(0x024, 0);
        self.write32(0x020, features_low);
        self.write32(0x024, 1);
        self.write32(0x020, features_high);
        self.write32(0x070, 3 | FEATURES_OK);
        for (q, (desc, avail, used)) in RINGS.iter().enumerate() {
            self.write32(0x030, u32::try_from(q).unwrap_or(0));
            self.write32(0x038, 1 << (size_log % 9));
            self.write32(0x080, *desc);
            self.write32(0x090, *avail);
            self.write32(0x0a0, *used);
            self.write32(0x044, 1);
            self.avail_idx[q] = self
                .mem
                .read_obj(GuestAddress(u64::from(*avail) + 2))
                .unwrap_or(0);
        }
        self.bounded(|f| f.write32(0x070, 3 | FEATURES_OK | 4));
    }

    fn check(&self) {
        let transport = self.dev.transport();
        check_transport(transport, &self.line);
        let s = self.stats();
        let backend = transport.device().backend();
        let waiting = backend.incoming.len() as u64;
        assert_eq!(
            self.frames_in,
            s.rx_frames + s.rx_dropped + waiting,
            "a received frame was lost: {s:?}, {waiting} waiting"
        );
        assert_eq!(backend.sent.len() as u64, s.tx_frames);
        assert!(backend
            .sent
            .iter()
            .all(|f| (ETH_HEADER_BYTES..=FRAME_MAX).contains(&f.len())));
        if self.limit.ops_per_sec > 0 {
            let depth = if self.limit.refill_ns == 0 {
                100_000_000
            } else {
                self.limit.refill_ns
            };
            let size = (self.limit.ops_per_sec * depth / 1_000_000_000).max(1);
            let now = self.timers.now.load(Ordering::Relaxed);
            let refilled = now * self.limit.ops_per_sec / 1_000_000_000;
            let admitted = s.tx_frames + s.tx_dropped + s.tx_errors;
            assert!(
                admitted <= size + refilled + 1,
                "{admitted} frames sent by {now} ns with {:?}",
                self.limit
            );
        }
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(which) = u.arbitrary::<u8>() else {
        return;
    };
    let limit = match LIMITS.get(usize::from(which % 8)) {
        Some(text) => match text.parse::<RateLimit>() {
            Ok(limit) => limit,
            Err(_) => return,
        },
        None => RateLimit::default(),
    };
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE)]) else {
        return;
    };
    let mem = Arc::new(mem);
    let line = Arc::new(Line::default());
    let timers = Arc::new(Timers::default());
    let clock = timers.clone();
    let net = Net::new(MemBackend::default(), MAC)
        .with_tx_rate_limit(limit, Arc::new(move || clock.now.load(Ordering::Relaxed)));
    let transport = VirtioMmio::new(net, mem.clone());
    let mut fuzz = Fuzz {
        dev: VirtioMmioDevice::new(transport, line.clone(), LINE).with_timer(timers.clone()),
        mem,
        line,
        avail_idx: [0; 2],
        timers,
        limit,
        frames_in: 0,
    };
    while let Ok(op) = u.arbitrary::<Op>() {
        fuzz.step(op);
        fuzz.check();
        if u.is_empty() {
            break;
        }
    }
}
