//! virtio-net (virtio 1.2, section 5.1): one receive queue (0) and one transmit queue (1) over
//! a [`NetBackend`] that moves whole Ethernet frames (a tap device in lull, a [`MemBackend`]
//! in tests and fuzz targets).
//!
//! ```text
//!  guest TX chain ──► [virtio_net_hdr_v1: 12 bytes][frame] ──► backend.write_frame(frame)
//!  backend.read_frame() ──► [header, num_buffers = 1][frame] ──► guest RX chain
//! ```
//!
//! Features: `VIRTIO_F_VERSION_1` (so the header is always the 12-byte `virtio_net_hdr_v1`),
//! `VIRTIO_NET_F_MAC` (the configuration space holds the MAC), indirect descriptors. No
//! checksum or segmentation offload and no mergeable buffers: a received frame goes whole into
//! one chain, with a zero header whose `num_buffers` is 1, and the header of a sent frame is
//! read and ignored (the driver cannot ask for offloads that were never offered).
//!
//! Receiving: frames are read from the backend only while the driver has a chain posted, so
//! when it has none a frame stays in the backend (a tap's queue in the host kernel, which
//! drops and counts on overflow); lull loses nothing silently. A frame that does not fit the
//! chain at the head of the ring (shorter than header + frame) or is shorter than an Ethernet
//! header is dropped and counted, and the chain is kept for the next frame. A chain that can
//! hold no frame at all (a writable buffer outside guest memory, or fewer writable bytes than
//! a header and an Ethernet header) is returned unused (used length 0) without a frame read. A pass ends when
//! the backend has nothing more (`WouldBlock`), the driver has no chain, or after [`RX_DROPS_PER_PASS`]
//! drops in a row, so a backend flooding with oversized frames cannot hold the thread forever.
//!
//! Transmitting: each chain's readable buffers are the header and the frame (framing is free:
//! either may span buffers). A chain with no readable 12-byte header, a frame shorter than an
//! Ethernet header or longer than [`FRAME_MAX`], or a readable buffer outside guest memory is
//! returned unsent and counted; a frame the backend refuses is counted too. Every chain is
//! returned with used length 0 (the device writes nothing into it). With a rate limit
//! (`bandwidth=`, `ops=`), a frame that does not fit waits in the queue for a refill timer, as
//! a virtio-blk request does.
//!
//! Malformed chains never panic: the walk is `virtio-queue`'s (bounded by the queue's size and
//! by 4 GiB), and every guest-memory access goes through its checked readers and writers.

use std::io::{self, Read, Write};
use std::ops::Deref;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MAC;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use virtio_queue::{DescriptorChain, Queue, QueueT, Reader, Writer};
use vm_memory::GuestMemory;

use super::throttle::{pop_admitted, DeviceClock, Popped, Throttle};
use super::VirtioDevice;
use crate::rate_limiter::RateLimit;

/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// The receive queue's index.
pub const RX_QUEUE: usize = 0;
/// The transmit queue's index.
pub const TX_QUEUE: usize = 1;
/// Bytes of `struct virtio_net_hdr_v1` (`VIRTIO_F_VERSION_1`).
pub const HEADER_BYTES: usize = 12;
/// Bytes of an Ethernet header: no frame is shorter.
pub const ETH_HEADER_BYTES: usize = 14;
/// Largest frame moved either way (a 64 KiB IP packet in an Ethernet frame with a VLAN tag).
pub const FRAME_MAX: usize = 65_535 + ETH_HEADER_BYTES + 4;
/// Oversized or runt received frames dropped in a row before a receive pass gives up.
pub const RX_DROPS_PER_PASS: usize = QUEUE_SIZE as usize;

/// The header of every received frame: no flags, no GSO, `num_buffers` 1.
const RX_HEADER: [u8; HEADER_BYTES] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0];

/// Where frames come from and go to.
pub trait NetBackend: Send {
    /// Reads the next frame into `buf` (at least [`FRAME_MAX`] bytes) and returns its length;
    /// `ErrorKind::WouldBlock` when none is waiting.
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Sends one frame; `ErrorKind::WouldBlock` if it cannot be taken now (it is dropped).
    fn write_frame(&mut self, frame: &[u8]) -> io::Result<()>;
}

/// Frames in memory: what the guest will receive and what it sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemBackend {
    /// Frames waiting for the guest, first first.
    pub incoming: std::collections::VecDeque<Vec<u8>>,
    /// Frames the guest sent, in order.
    pub sent: Vec<Vec<u8>>,
    /// Refuse every write (`WouldBlock`), as a full host queue would.
    pub refuse_writes: bool,
}

impl NetBackend for MemBackend {
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let frame = self.incoming.pop_front().ok_or(io::ErrorKind::WouldBlock)?;
        let n = frame.len().min(buf.len());
        buf[..n].copy_from_slice(&frame[..n]);
        Ok(n)
    }

    fn write_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        if self.refuse_writes {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.sent.push(frame.to_vec());
        Ok(())
    }
}

/// What the device has done, for metrics and tests (one type with the run report's nets).
pub use lull_schema::NetStats;

/// A virtio-net device on backend `B`.
pub struct Net<B> {
    backend: B,
    mac: [u8; 6],
    frame: Vec<u8>,
    stats: NetStats,
    throttle: Option<Throttle>,
}

impl<B: NetBackend> Net<B> {
    /// A device with address `mac` on `backend`.
    pub fn new(backend: B, mac: [u8; 6]) -> Self {
        Self {
            backend,
            mac,
            frame: vec![0; FRAME_MAX],
            stats: NetStats::default(),
            throttle: None,
        }
    }

    /// The same device, the frames it sends rate-limited by `limit` on `clock` (no-op if
    /// `limit` limits nothing).
    pub fn with_tx_rate_limit(mut self, limit: RateLimit, clock: DeviceClock) -> Self {
        self.throttle = limit.is_limited().then(|| Throttle::new(limit, clock));
        self
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, to hand it frames (tests).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// What the device has done.
    pub fn stats(&self) -> NetStats {
        self.stats
    }

    /// Fills the driver's receive chains with the backend's frames; true if any was used.
    fn receive<M: GuestMemory>(&mut self, queue: &mut Queue, mem: &M) -> bool {
        let mut any = false;
        let mut drops = 0;
        // Each pass takes a chain or drops a frame; both are bounded.
        for _ in 0..usize::from(queue.size()) + RX_DROPS_PER_PASS {
            let before = queue.next_avail();
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                break;
            };
            let head = chain.head_index();
            if head >= queue.size() {
                self.stats.bad_heads += 1;
                continue;
            }
            // A chain that can hold no frame at all (a writable buffer outside guest memory,
            // or less room than a header and an Ethernet header) goes back unused.
            let writer = Writer::new(mem, chain)
                .ok()
                .filter(|w| w.available_bytes() >= HEADER_BYTES + ETH_HEADER_BYTES);
            let Some(mut writer) = writer else {
                self.stats.rx_bad_chains += 1;
                any |= queue.add_used(mem, head, 0).is_ok();
                continue;
            };
            let len = match self.backend.read_frame(&mut self.frame) {
                Ok(n) => n.min(self.frame.len()),
                Err(e) => {
                    // Nothing waiting (or the backend failed): the chain stays for later.
                    queue.set_next_avail(before);
                    if e.kind() != io::ErrorKind::WouldBlock {
                        self.stats.rx_errors += 1;
                    }
                    break;
                }
            };
            if len < ETH_HEADER_BYTES || writer.available_bytes() < HEADER_BYTES + len {
                self.stats.rx_dropped += 1;
                queue.set_next_avail(before);
                drops += 1;
                if drops >= RX_DROPS_PER_PASS {
                    break;
                }
                continue;
            }
            drops = 0;
            // Both writes fit the chain's checked buffers: they cannot come up short.
            let wrote = writer.write_all(&RX_HEADER).is_ok()
                && writer.write_all(&self.frame[..len]).is_ok();
            if wrote {
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += len as u64;
            } else {
                self.stats.rx_dropped += 1;
            }
            let used = u32::try_from(writer.bytes_written()).unwrap_or(u32::MAX);
            any |= queue.add_used(mem, head, used).is_ok();
        }
        any
    }

    /// Sends every frame the driver made available (up to the queue's size); true if any
    /// chain was returned.
    fn transmit<M: GuestMemory>(&mut self, queue: &mut Queue, mem: &M) -> bool {
        let mut any = false;
        for _ in 0..queue.size() {
            let overhead = HEADER_BYTES as u64;
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
            self.send(mem, chain);
            // add_used fails only if the used ring left guest memory: nothing to tell then.
            any |= queue.add_used(mem, head, 0).is_ok();
        }
        any
    }

    /// Sends the frame of one chain, or counts why not.
    fn send<M, T>(&mut self, mem: &M, chain: DescriptorChain<T>)
    where
        M: GuestMemory,
        T: Deref<Target = M> + Clone,
    {
        let Ok(mut reader) = Reader::new(mem, chain) else {
            self.stats.tx_dropped += 1;
            return;
        };
        let len = reader.available_bytes().saturating_sub(HEADER_BYTES);
        let mut header = [0u8; HEADER_BYTES];
        if reader.read_exact(&mut header).is_err()
            || !(ETH_HEADER_BYTES..=FRAME_MAX).contains(&len)
            || reader.read_exact(&mut self.frame[..len]).is_err()
        {
            self.stats.tx_dropped += 1;
            return;
        }
        match self.backend.write_frame(&self.frame[..len]) {
            Ok(()) => {
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += len as u64;
            }
            Err(_) => self.stats.tx_errors += 1,
        }
    }
}

impl<B: NetBackend> VirtioDevice for Net<B> {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn features(&self) -> u64 {
        1u64 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MAC | 1 << VIRTIO_RING_F_INDIRECT_DESC
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    /// `struct virtio_net_config`: the MAC at 0; the rest (status, queue pairs, MTU: their
    /// features are not offered) reads 0.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            let at = usize::try_from(offset).ok().and_then(|o| o.checked_add(i));
            *byte = at.and_then(|a| self.mac.get(a)).copied().unwrap_or(0);
        }
    }

    /// The MAC is read-only in virtio 1.x (no `VIRTIO_NET_F_CTRL_MAC_ADDR`).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn process_queue<M: GuestMemory>(&mut self, index: usize, queue: &mut Queue, mem: &M) -> bool {
        match index {
            RX_QUEUE => self.receive(queue, mem),
            TX_QUEUE => self.transmit(queue, mem),
            _ => false,
        }
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
