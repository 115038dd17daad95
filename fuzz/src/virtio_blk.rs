//! The `virtio_blk` target: lull's real virtio-blk device behind its real virtio-mmio
//! transport and bus adapter (`devices::virtio`), driven by a guest that writes anything
//! anywhere: register accesses of any offset and width, descriptor tables and rings built
//! from arbitrary descriptors (loops, bad indexes, indirect tables, buffers outside memory,
//! wrong directions), raw bytes over any of it, available indexes out of step, notifications
//! of any queue.
//!
//! After every step:
//! - the interrupt line is high exactly while InterruptStatus is not zero, and it only ever
//!   changes level (no repeated raise or lower);
//! - FEATURES_OK stands only for a feature set the device offered that includes VERSION_1;
//! - the disk keeps its size, and a read-only disk keeps its contents;
//! - one notification serves at most the queue's size of chains;
//! - with an `ops=` rate limit (chosen by the input, on a fake clock the input advances, its
//!   refill timer fired whenever the input says), the device never admits more requests than
//!   the bucket's size plus what refilled since the start, and it asks for a refill timer
//!   only for an instant after the clock's now.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arbitrary::{Arbitrary, Unstructured};
use devices::mmio::MmioDevice;
use devices::rate_limiter::RateLimit;
use devices::virtio::block::{Block, BlockStats};
use devices::virtio::disk::MemDisk;
use devices::virtio::mmio::{VirtioMmio, VirtioMmioDevice};
use devices::virtio::DeviceTimer;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::virtio_mmio_driver::{
    check_transport, le, Line, FEATURES_OK, LINE, MEM_SIZE, REGISTERS,
};

const DESC: u32 = 0x0;
const AVAIL: u32 = 0x1000;
const USED: u32 = 0x2000;
const DISK_SECTORS: u64 = 16;

#[derive(Arbitrary, Debug)]
enum Op {
    /// A 32-bit write of a known register.
    Write { reg: u8, value: u32 },
    /// Any write in the window.
    WildWrite { offset: u16, len: u8, value: u64 },
    /// Any read in the window.
    Read { offset: u16, len: u8 },
    /// The whole handshake to DRIVER_OK with a queue of `2^size_log` at the usual rings.
    Handshake {
        size_log: u8,
        features_high: u32,
        features_low: u32,
    },
    /// One descriptor of the table: an address and a length from useful shapes or wild.
    Desc {
        index: u8,
        addr: u8,
        len: u8,
        wild_len: u32,
        flags: u8,
        next: u8,
    },
    /// A request header in buffer slot `slot`.
    Header { slot: u8, kind: u8, sector: u8 },
    /// A well-formed request chain at descriptor `head` (header, data in one or two buffers,
    /// status), offered and notified: the mutations of the other ops then break it.
    Request {
        head: u8,
        kind: u8,
        sector: u8,
        data: u8,
        split: bool,
    },
    /// Raw bytes anywhere in guest memory.
    Poke { at: u16, bytes: [u8; 8] },
    /// Puts `head` in the next available slot and bumps the available index.
    Offer { head: u16 },
    /// Sets the available index to anything.
    AvailIdx(u16),
    /// QueueNotify.
    Notify(u8),
    /// InterruptACK.
    Ack(u32),
    /// The fake clock moves on by this many microseconds.
    Advance(u16),
    /// The refill timer fires (whether or not one was asked for, and whenever).
    TimerFired,
}

/// The rate limits an input may choose (index by its first byte; none most often).
const LIMITS: [&str; 4] = [
    "",
    "ops=1000,refill=5ms",
    "ops=50",
    "bandwidth=8K,refill=1ms",
];

/// The device's fake clock and the refill timers it asked for.
#[derive(Default)]
struct Timers {
    now: AtomicU64,
    asked: Mutex<Vec<u64>>,
}

impl DeviceTimer for Timers {
    fn request(&self, deadline: u64) {
        assert!(
            deadline > self.now.load(Ordering::Relaxed),
            "a refill timer asked for at or before now"
        );
        timer::lock(&self.asked).push(deadline);
    }
}

struct Fuzz {
    dev: VirtioMmioDevice<Block<MemDisk>, GuestMemoryMmap>,
    mem: Arc<GuestMemoryMmap>,
    line: Arc<Line>,
    readonly: bool,
    initial: Vec<u8>,
    avail_idx: u16,
    timers: Arc<Timers>,
    limit: RateLimit,
}

impl Fuzz {
    fn write32(&mut self, reg: u16, value: u32) {
        self.dev.write(u64::from(reg), &value.to_le_bytes());
    }

    fn stats(&self) -> BlockStats {
        self.dev.transport().device().stats()
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Write { reg, value } => {
                self.write32(REGISTERS[usize::from(reg) % REGISTERS.len()], value);
            }
            Op::WildWrite { offset, len, value } => {
                let data = le(value, usize::from(len % 9));
                self.dev.write(u64::from(offset % 0x200), &data);
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
                index,
                addr,
                len,
                wild_len,
                flags,
                next,
            } => {
                let len = match len % 8 {
                    0 => 16,
                    1 => 1,
                    2 => 512,
                    3 => 1024,
                    4 => 20,
                    5 => 8,
                    6 => 0,
                    _ => wild_len,
                };
                self.desc(index, buffer(addr), len, u16::from(flags & 7), next);
            }
            Op::Header { slot, kind, sector } => self.header(slot, kind, sector),
            Op::Request {
                head,
                kind,
                sector,
                data,
                split,
            } => self.request(head, kind, sector, data, split),
            Op::Poke { at, bytes } => {
                let _ = self.mem.write_slice(&bytes, GuestAddress(u64::from(at)));
            }
            Op::Offer { head } => {
                let slot = u64::from(AVAIL) + 4 + 2 * u64::from(self.avail_idx % 256);
                let _ = self.mem.write_obj(head, GuestAddress(slot));
                self.avail_idx = self.avail_idx.wrapping_add(1);
                let _ = self
                    .mem
                    .write_obj(self.avail_idx, GuestAddress(u64::from(AVAIL) + 2));
            }
            Op::AvailIdx(idx) => {
                self.avail_idx = idx;
                let _ = self.mem.write_obj(idx, GuestAddress(u64::from(AVAIL) + 2));
            }
            Op::Notify(queue) => {
                let before = served(self.stats());
                self.write32(0x050, u32::from(queue % 3));
                let after = served(self.stats());
                assert!(
                    after - before <= 256,
                    "one notification served {} chains",
                    after - before
                );
            }
            Op::Ack(value) => self.write32(0x064, value),
            Op::Advance(us) => {
                self.timers
                    .now
                    .fetch_add(u64::from(us) * 1000, Ordering::Relaxed);
            }
            Op::TimerFired => self.dev.timer_fired(),
        }
    }

    fn desc(&self, index: u8, addr: u64, len: u32, flags: u16, next: u8) {
        let at = u64::from(DESC) + 16 * u64::from(index % 32);
        let _ = self.mem.write_obj(addr, GuestAddress(at));
        let _ = self.mem.write_obj(len, GuestAddress(at + 8));
        let _ = self.mem.write_obj(flags, GuestAddress(at + 12));
        let _ = self
            .mem
            .write_obj(u16::from(next % 32), GuestAddress(at + 14));
    }

    fn header(&self, slot: u8, kind: u8, sector: u8) {
        let at = buffer(slot & !7);
        let _ = self.mem.write_obj(u32::from(kind % 12), GuestAddress(at));
        let _ = self
            .mem
            .write_obj(u64::from(sector % 20), GuestAddress(at + 8));
    }

    fn request(&mut self, head: u8, kind: u8, sector: u8, data: u8, split: bool) {
        const NEXT: u16 = 1;
        const WRITE: u16 = 2;
        let h = head % 16;
        let kind = [0u8, 1, 4, 8, 11][usize::from(kind % 5)];
        self.header(h * 8, kind, sector);
        let len = 512 * u32::from(data % 5);
        let dir = if kind == 1 { 0 } else { WRITE };
        let mut i = h;
        self.desc(i, buffer(h * 8), 16, NEXT, i + 1);
        if len > 0 {
            let parts: &[u32] = if split {
                &[len / 2, len - len / 2]
            } else {
                &[len]
            };
            for (k, part) in parts.iter().enumerate() {
                i += 1;
                let slot = (h * 8 + 8 * (u8::try_from(k).unwrap_or(0) + 1)) % 248;
                self.desc(i, buffer(slot), *part, NEXT | dir, i + 1);
            }
        }
        i += 1;
        self.desc(i, buffer(248), 1, WRITE, 0);
        self.step(Op::Offer { head: u16::from(h) });
        self.step(Op::Notify(0));
    }

    fn handshake(&mut self, size_log: u8, features_high: u32, features_low: u32) {
        self.write32(0x070, 0);
        self.write32(0x070, 3);
        self.write32(0x024, 0);
        self.write32(0x020, features_low);
        self.write32(0x024, 1);
        self.write32(0x020, features_high);
        self.write32(0x070, 3 | FEATURES_OK);
        self.write32(0x030, 0);
        self.write32(0x038, 1 << (size_log % 9));
        self.write32(0x080, DESC);
        self.write32(0x090, AVAIL);
        self.write32(0x0a0, USED);
        self.write32(0x044, 1);
        self.write32(0x070, 3 | FEATURES_OK | 4);
        self.avail_idx = self
            .mem
            .read_obj(GuestAddress(u64::from(AVAIL) + 2))
            .unwrap_or(0);
    }

    fn check(&self) {
        let transport = self.dev.transport();
        check_transport(transport, &self.line);
        let disk = &transport.device().disk().bytes;
        assert_eq!(disk.len() as u64, DISK_SECTORS * 512);
        if self.readonly {
            assert!(*disk == self.initial, "a read-only disk changed");
        }
        if self.limit.ops_per_sec > 0 {
            // The bucket holds `refill` of the rate (100 ms by default) and starts full.
            let depth = if self.limit.refill_ns == 0 {
                100_000_000
            } else {
                self.limit.refill_ns
            };
            let size = (self.limit.ops_per_sec * depth / 1_000_000_000).max(1);
            let now = self.timers.now.load(Ordering::Relaxed);
            let refilled = now * self.limit.ops_per_sec / 1_000_000_000;
            let s = self.stats();
            let admitted = served(s) - s.bad_heads;
            assert!(
                admitted <= size + refilled + 1,
                "{admitted} requests admitted by {now} ns with {:?}",
                self.limit
            );
        }
    }
}

/// A buffer address: mostly one of 32 slots of 1 KiB in the data area (`shape` / 8), else
/// one that straddles the end of guest memory, or one far outside it.
fn buffer(shape: u8) -> u64 {
    match shape % 8 {
        6 => MEM_SIZE as u64 - 8,
        7 => u64::MAX - 0x100,
        _ => 0x4000 + u64::from(shape / 8) * 0x400,
    }
}

/// Chains the device has returned or skipped.
fn served(s: BlockStats) -> u64 {
    s.reads + s.writes + s.flushes + s.ids + s.errors + s.dropped + s.bad_heads
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(readonly) = u.arbitrary::<bool>() else {
        return;
    };
    let Ok(which) = u.arbitrary::<u8>() else {
        return;
    };
    let Some(limit) = LIMITS
        .get(usize::from(which % 8))
        .map(|l| l.parse::<RateLimit>())
    else {
        return run_with(u, readonly, RateLimit::default());
    };
    let Ok(limit) = limit else {
        return;
    };
    run_with(u, readonly, limit);
}

/// Runs the rest of an input on a device limited by `limit`.
fn run_with(mut u: Unstructured<'_>, readonly: bool, limit: RateLimit) {
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE)]) else {
        return;
    };
    let mem = Arc::new(mem);
    let mut disk = MemDisk::new(DISK_SECTORS);
    for (i, b) in disk.bytes.iter_mut().enumerate() {
        *b = (i % 251).to_le_bytes()[0];
    }
    let initial = disk.bytes.clone();
    let line = Arc::new(Line::default());
    let timers = Arc::new(Timers::default());
    let clock = timers.clone();
    let block = Block::new(disk, readonly, b"fuzz")
        .with_rate_limit(limit, Arc::new(move || clock.now.load(Ordering::Relaxed)));
    let transport = VirtioMmio::new(block, mem.clone());
    let mut fuzz = Fuzz {
        dev: VirtioMmioDevice::new(transport, line.clone(), LINE).with_timer(timers.clone()),
        mem,
        line,
        readonly,
        initial,
        avail_idx: 0,
        timers,
        limit,
    };
    while let Ok(op) = u.arbitrary::<Op>() {
        fuzz.step(op);
        fuzz.check();
        if u.is_empty() {
            break;
        }
    }
}
