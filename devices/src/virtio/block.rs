//! virtio-blk (virtio 1.2, section 5.2): one request queue, requests IN, OUT, FLUSH and
//! GET_ID on a [`Disk`].
//!
//! A request is one descriptor chain: device-readable buffers first (the 16-byte header
//! `type: le32, reserved: le32, sector: le64`, then for OUT the data), device-writable buffers
//! after them (for IN the data, for GET_ID the 20-byte id), and the last writable byte is the
//! status (`OK`, `IOERR`, `UNSUPP`). Framing is free: a header or a sector may span buffers.
//!
//! What a malformed chain gets:
//! - no writable byte at all (nowhere to put a status), or a buffer outside guest memory on
//!   the writable side: the chain is returned unread (used length 0);
//! - a header shorter than 16 bytes, a readable buffer after a writable one, a readable
//!   buffer outside guest memory, data not a whole number of sectors, a range past the end
//!   of the disk, a write to a read-only disk, a failed host I/O: `IOERR`;
//! - any other request type: `UNSUPP`.
//!
//! The chain's walk is `virtio-queue`'s: it ends at a bad `next` index, at a loop (after the
//! queue's size of descriptors) and past 4 GiB in total, so a chain is always finite. Data
//! moves through one bounce buffer of [`CHUNK`] bytes, so a request's size never decides how
//! much host memory lull allocates.

use std::io::{self, Read, Write};
use std::ops::Deref;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_ID_BYTES,
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use virtio_queue::{DescriptorChain, Queue, QueueT, Reader, Writer};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::GuestMemory;

use super::disk::{Disk, SECTOR_SIZE};
use super::throttle::{pop_admitted, DeviceClock, Popped, Throttle};
use super::VirtioDevice;
use crate::rate_limiter::RateLimit;

/// Size of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Bytes moved per host read or write.
pub const CHUNK: usize = 64 << 10;
/// Bytes of the GET_ID answer.
pub const ID_BYTES: usize = VIRTIO_BLK_ID_BYTES as usize;
const HEADER_BYTES: usize = 16;
/// Segments the driver may put in one request (`seg_max`): the queue less header and status.
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;

/// What the device has done, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockStats {
    /// IN requests completed OK.
    pub reads: u64,
    /// OUT requests completed OK.
    pub writes: u64,
    /// FLUSH requests completed OK.
    pub flushes: u64,
    /// GET_ID requests completed OK.
    pub ids: u64,
    /// Requests answered IOERR or UNSUPP.
    pub errors: u64,
    /// Chains returned unread (no status byte, writable side unusable).
    pub dropped: u64,
    /// Available-ring entries naming no descriptor (index past the queue's size): skipped,
    /// as there is no chain to return.
    pub bad_heads: u64,
    /// Requests the rate limiter held back (each left in the queue until a refill timer).
    pub throttled: u64,
    /// Refill timers that fired.
    pub refills: u64,
}

/// A virtio-blk device on `D`.
pub struct Block<D> {
    disk: D,
    readonly: bool,
    id: [u8; ID_BYTES],
    bounce: Vec<u8>,
    stats: BlockStats,
    throttle: Option<Throttle>,
}

impl<D: Disk> Block<D> {
    /// A device on `disk`; `id` is the GET_ID answer (cut to 20 bytes, NUL-padded).
    pub fn new(disk: D, readonly: bool, id: &[u8]) -> Self {
        let mut padded = [0u8; ID_BYTES];
        let n = id.len().min(ID_BYTES);
        padded[..n].copy_from_slice(&id[..n]);
        Self {
            disk,
            readonly,
            id: padded,
            bounce: vec![0; CHUNK],
            stats: BlockStats::default(),
            throttle: None,
        }
    }

    /// The same device, its requests rate-limited by `limit` on `clock` (no-op if `limit`
    /// limits nothing).
    pub fn with_rate_limit(mut self, limit: RateLimit, clock: DeviceClock) -> Self {
        self.throttle = limit.is_limited().then(|| Throttle::new(limit, clock));
        self
    }

    /// The disk.
    pub fn disk(&self) -> &D {
        &self.disk
    }

    /// What the device has done.
    pub fn stats(&self) -> BlockStats {
        self.stats
    }

    /// Serves one chain; returns the used length (bytes written to the chain).
    fn serve<M, T>(&mut self, mem: &M, chain: DescriptorChain<T>) -> u32
    where
        M: GuestMemory,
        T: Deref<Target = M> + Clone,
    {
        let Ok(mut writer) = Writer::new(mem, chain.clone()) else {
            self.stats.dropped += 1;
            return 0;
        };
        let Some(data_len) = writer.available_bytes().checked_sub(1) else {
            self.stats.dropped += 1;
            return 0;
        };
        let Ok(mut status) = writer.split_at(data_len) else {
            self.stats.dropped += 1;
            return 0;
        };
        let readable_first = {
            let mut seen_writable = false;
            chain.clone().all(|d| {
                seen_writable |= d.is_write_only();
                d.is_write_only() || !seen_writable
            })
        };
        let code = match Reader::new(mem, chain) {
            Ok(reader) if readable_first => self.execute(reader, &mut writer),
            _ => VIRTIO_BLK_S_IOERR,
        };
        if code != VIRTIO_BLK_S_OK {
            self.stats.errors += 1;
        }
        // The status byte is a checked part of guest memory: this write cannot come up short.
        let wrote_status = status.write_all(&code.to_le_bytes()[..1]).is_ok();
        let used = writer.bytes_written() + usize::from(wrote_status);
        u32::try_from(used).unwrap_or(u32::MAX)
    }

    /// Runs the request in `reader` (header, then OUT data) and `data` (IN data, GET_ID).
    /// Returns the status.
    fn execute<B, W>(&mut self, mut reader: Reader<'_, B>, data: &mut Writer<'_, W>) -> u32
    where
        B: BitmapSlice,
        W: BitmapSlice,
    {
        let mut header = [0u8; HEADER_BYTES];
        if reader.read_exact(&mut header).is_err() {
            return VIRTIO_BLK_S_IOERR;
        }
        let [t0, t1, t2, t3, _, _, _, _, s @ ..] = header;
        let kind = u32::from_le_bytes([t0, t1, t2, t3]);
        let sector = u64::from_le_bytes(s);
        match kind {
            VIRTIO_BLK_T_IN => self.read(sector, data),
            VIRTIO_BLK_T_OUT if self.readonly => VIRTIO_BLK_S_IOERR,
            VIRTIO_BLK_T_OUT => self.write(sector, &mut reader),
            VIRTIO_BLK_T_FLUSH => match self.disk.flush() {
                Ok(()) => {
                    self.stats.flushes += 1;
                    VIRTIO_BLK_S_OK
                }
                Err(_) => VIRTIO_BLK_S_IOERR,
            },
            VIRTIO_BLK_T_GET_ID => {
                let n = data.available_bytes().min(ID_BYTES);
                match data.write_all(&self.id[..n]) {
                    Ok(()) => {
                        self.stats.ids += 1;
                        VIRTIO_BLK_S_OK
                    }
                    Err(_) => VIRTIO_BLK_S_IOERR,
                }
            }
            _ => VIRTIO_BLK_S_UNSUPP,
        }
    }

    /// The byte offset of `len` bytes at `sector`, if whole sectors within the disk.
    fn range(&self, sector: u64, len: usize) -> Option<u64> {
        let len = u64::try_from(len).ok()?;
        let start = sector.checked_mul(SECTOR_SIZE)?;
        let end = start.checked_add(len)?;
        (len % SECTOR_SIZE == 0 && end <= self.disk.size()).then_some(start)
    }

    /// Moves the `len` bytes at `sector` through the bounce buffer, [`CHUNK`] at a time:
    /// `step` gets the disk, the chunk's byte offset on it and the chunk. Returns the status.
    fn transfer(
        &mut self,
        sector: u64,
        len: usize,
        mut step: impl FnMut(&mut D, u64, &mut [u8]) -> io::Result<()>,
    ) -> u32 {
        let Some(start) = self.range(sector, len) else {
            return VIRTIO_BLK_S_IOERR;
        };
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK);
            if step(&mut self.disk, start + done as u64, &mut self.bounce[..n]).is_err() {
                return VIRTIO_BLK_S_IOERR;
            }
            done += n;
        }
        VIRTIO_BLK_S_OK
    }

    /// IN: the disk's sectors into the driver's writable buffers.
    fn read<W: BitmapSlice>(&mut self, sector: u64, data: &mut Writer<'_, W>) -> u32 {
        let code = self.transfer(sector, data.available_bytes(), |disk, offset, buf| {
            disk.read_at(offset, buf)?;
            data.write_all(buf)
        });
        self.stats.reads += u64::from(code == VIRTIO_BLK_S_OK);
        code
    }

    /// OUT: the driver's readable buffers onto the disk.
    fn write<B: BitmapSlice>(&mut self, sector: u64, data: &mut Reader<'_, B>) -> u32 {
        let code = self.transfer(sector, data.available_bytes(), |disk, offset, buf| {
            data.read_exact(buf)?;
            disk.write_at(offset, buf)
        });
        self.stats.writes += u64::from(code == VIRTIO_BLK_S_OK);
        code
    }
}

impl<D: Disk> VirtioDevice for Block<D> {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        let mut f = 1u64 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_RING_F_INDIRECT_DESC;
        if self.readonly {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        f
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    /// `struct virtio_blk_config`: capacity (le64 sectors) at 0, seg_max (le32) at 12; the
    /// rest reads 0.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; 16];
        config[..8].copy_from_slice(&(self.disk.size() / SECTOR_SIZE).to_le_bytes());
        config[12..].copy_from_slice(&SEG_MAX.to_le_bytes());
        for (i, byte) in data.iter_mut().enumerate() {
            let at = usize::try_from(offset).ok().and_then(|o| o.checked_add(i));
            *byte = at.and_then(|a| config.get(a)).copied().unwrap_or(0);
        }
    }

    /// Nothing in the configuration space is writable without `VIRTIO_BLK_F_CONFIG_WCE`.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn process_queue<M: GuestMemory>(&mut self, index: usize, queue: &mut Queue, mem: &M) -> bool {
        if index != 0 {
            return false;
        }
        let mut any = false;
        for _ in 0..queue.size() {
            let overhead = HEADER_BYTES as u64 + 1;
            let throttled = &mut self.stats.throttled;
            let chain = match pop_admitted(queue, mem, self.throttle.as_mut(), overhead, throttled)
            {
                Popped::Chain(chain) => chain,
                Popped::BadHead => {
                    self.stats.bad_heads += 1;
                    continue;
                }
                Popped::Stop => break,
            };
            let head = chain.head_index();
            let len = self.serve(mem, chain);
            // add_used fails only if the used ring left guest memory: nothing to tell then.
            any |= queue.add_used(mem, head, len).is_ok();
        }
        any
    }

    fn throttle(&self) -> Option<&Throttle> {
        self.throttle.as_ref()
    }

    fn throttle_mut(&mut self) -> Option<&mut Throttle> {
        self.throttle.as_mut()
    }

    fn take_timer_request(&mut self) -> Option<u64> {
        self.throttle.as_mut().and_then(Throttle::take_request)
    }

    fn timer_fired(&mut self) {
        if let Some(throttle) = &mut self.throttle {
            throttle.fired();
            self.stats.refills += 1;
        }
    }
}
