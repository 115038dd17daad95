//! The virtio-mmio transport, version 2 (virtio 1.2, section 4.2.2): the register window a
//! driver finds at the address Linux is given as `virtio_mmio.device=<size>@<addr>:<irq>`.
//!
//! ```text
//!  0x000 MagicValue "virt"   0x030 QueueSel          0x070 Status
//!  0x004 Version 2           0x034 QueueNumMax       0x080/84 QueueDesc low/high
//!  0x008 DeviceID            0x038 QueueNum          0x090/94 QueueDriver (avail)
//!  0x00c VendorID            0x044 QueueReady        0x0a0/a4 QueueDevice (used)
//!  0x010 DeviceFeatures      0x050 QueueNotify       0x0fc ConfigGeneration
//!  0x014 DeviceFeaturesSel   0x060 InterruptStatus   0x100+ device configuration space
//!  0x020/24 DriverFeatures(Sel)  0x064 InterruptACK
//! ```
//!
//! Registers below 0x100 take 32-bit accesses only; others read 0 and are ignored. A queue's
//! size and addresses can be written only while it is not ready. FEATURES_OK sticks only if
//! the driver accepted a subset of the offered features including `VIRTIO_F_VERSION_1` (no
//! legacy interface). A notification is served only after DRIVER_OK, on a ready queue whose
//! rings lie in guest memory; a device that answered sets bit 0 of InterruptStatus, and the
//! interrupt line is high while InterruptStatus is not zero.

use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio::*;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemory;

use super::{DeviceTimer, VirtioDevice};
use crate::mmio::MmioDevice;
use crate::testdev::IrqLines;

mod state;
pub use super::transport_state::{QueueSnapshot, TransportState, TransportStateError};

/// "virt", little-endian.
pub const MAGIC: u32 = 0x7472_6976;
/// The non-legacy MMIO interface.
pub const VERSION: u32 = 2;
/// lull's vendor ID ("LULL").
pub const VENDOR_ID: u32 = 0x4c4c_554c;
/// Bytes of one device's register window.
pub const WINDOW_SIZE: u64 = 0x1000;

/// The transport state of one device.
pub struct VirtioMmio<D, M> {
    device: D,
    mem: Arc<M>,
    queues: Vec<Queue>,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    status: u32,
    interrupt_status: u32,
}

impl<D: VirtioDevice, M: GuestMemory> VirtioMmio<D, M> {
    /// The transport of `device`, whose queues live in `mem`.
    pub fn new(device: D, mem: Arc<M>) -> Self {
        let queues = device
            .queue_max_sizes()
            .iter()
            .filter_map(|&max| Queue::new(max).ok())
            .collect();
        Self {
            device,
            mem,
            queues,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            status: 0,
            interrupt_status: 0,
        }
    }

    /// The device behind the transport.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device behind the transport, to reach its backend (tests, fuzz targets).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// The features the driver accepted.
    pub fn driver_features(&self) -> u64 {
        self.driver_features
    }

    /// True while the interrupt line should be high (InterruptStatus is not zero).
    pub fn interrupt_pending(&self) -> bool {
        self.interrupt_status != 0
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        let idx = usize::try_from(self.queue_sel).ok()?;
        self.queues.get_mut(idx)
    }

    /// The selected queue, if it may still be configured (not ready yet).
    fn configurable_queue(&mut self) -> Option<&mut Queue> {
        self.selected_queue().filter(|q| !q.ready())
    }

    /// Guest read of `data.len()` bytes at `offset` in the window.
    pub fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            self.device
                .read_config(offset - u64::from(VIRTIO_MMIO_CONFIG), data);
            return;
        }
        let value = match (u32::try_from(offset), data.len()) {
            (Ok(reg), 4) => self.read_register(reg),
            _ => 0,
        };
        let bytes = value.to_le_bytes();
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = bytes.get(i).copied().unwrap_or(0);
        }
    }

    fn read_register(&mut self, reg: u32) -> u32 {
        let features = self.device.features();
        match reg {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC,
            VIRTIO_MMIO_VERSION => VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.device.device_type(),
            VIRTIO_MMIO_VENDOR_ID => VENDOR_ID,
            VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => low(features),
                1 => high(features),
                _ => 0,
            },
            VIRTIO_MMIO_QUEUE_NUM_MAX => {
                self.selected_queue().map_or(0, |q| u32::from(q.max_size()))
            }
            VIRTIO_MMIO_QUEUE_READY => self.selected_queue().map_or(0, |q| u32::from(q.ready())),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt_status,
            VIRTIO_MMIO_STATUS => self.status,
            // No shared memory regions: their length reads as all ones.
            VIRTIO_MMIO_SHM_LEN_LOW | VIRTIO_MMIO_SHM_LEN_HIGH => u32::MAX,
            VIRTIO_MMIO_CONFIG_GENERATION => 0,
            _ => 0,
        }
    }

    /// Guest write of `data` at `offset` in the window.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            self.device
                .write_config(offset - u64::from(VIRTIO_MMIO_CONFIG), data);
            return;
        }
        if let (Ok(reg), Ok(bytes)) = (u32::try_from(offset), <[u8; 4]>::try_from(data)) {
            self.write_register(reg, u32::from_le_bytes(bytes));
        }
    }

    fn write_register(&mut self, reg: u32, value: u32) {
        match reg {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES if self.status & VIRTIO_CONFIG_S_FEATURES_OK == 0 => {
                let v = u64::from(value);
                match self.driver_features_sel {
                    0 => self.driver_features = (self.driver_features & !0xffff_ffff) | v,
                    1 => self.driver_features = (self.driver_features & 0xffff_ffff) | v << 32,
                    _ => {}
                }
            }
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = value,
            VIRTIO_MMIO_QUEUE_NUM => {
                if let (Some(q), Ok(size)) = (self.configurable_queue(), u16::try_from(value)) {
                    q.set_size(size);
                }
            }
            VIRTIO_MMIO_QUEUE_READY => {
                if let Some(q) = self.selected_queue() {
                    q.set_ready(value == 1);
                }
            }
            VIRTIO_MMIO_QUEUE_DESC_LOW => {
                self.set_address(|q| q.set_desc_table_address(Some(value), None))
            }
            VIRTIO_MMIO_QUEUE_DESC_HIGH => {
                self.set_address(|q| q.set_desc_table_address(None, Some(value)))
            }
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => {
                self.set_address(|q| q.set_avail_ring_address(Some(value), None))
            }
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => {
                self.set_address(|q| q.set_avail_ring_address(None, Some(value)))
            }
            VIRTIO_MMIO_QUEUE_USED_LOW => {
                self.set_address(|q| q.set_used_ring_address(Some(value), None))
            }
            VIRTIO_MMIO_QUEUE_USED_HIGH => {
                self.set_address(|q| q.set_used_ring_address(None, Some(value)))
            }
            VIRTIO_MMIO_QUEUE_NOTIFY => self.notify(value),
            VIRTIO_MMIO_INTERRUPT_ACK => self.interrupt_status &= !value,
            VIRTIO_MMIO_STATUS => self.set_status(value),
            _ => {}
        }
    }

    fn set_address(&mut self, set: impl FnOnce(&mut Queue)) {
        if let Some(q) = self.configurable_queue() {
            set(q);
        }
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        let mut value = value;
        let newly = value & !self.status;
        if newly & VIRTIO_CONFIG_S_FEATURES_OK != 0 {
            let offered = self.device.features();
            let accepted = self.driver_features;
            if accepted & !offered != 0 || accepted & (1 << VIRTIO_F_VERSION_1) == 0 {
                value &= !VIRTIO_CONFIG_S_FEATURES_OK;
            }
        }
        self.status = value;
    }

    /// Device reset (status 0): queues, features and interrupt status back to their start.
    fn reset(&mut self) {
        for q in &mut self.queues {
            q.reset();
        }
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.queue_sel = 0;
        self.status = 0;
        self.interrupt_status = 0;
    }

    /// The device's timer fired: it gets every queue again (as if notified) once the driver
    /// is ready. Returns the timer the device asks for next, if any.
    pub fn timer_fired(&mut self) -> Option<u64> {
        self.device.timer_fired();
        for index in 0..self.queues.len() {
            self.notify(u32::try_from(index).unwrap_or(u32::MAX));
        }
        self.device.take_timer_request()
    }

    /// The timer the device asked for during the last accesses, if any.
    pub fn take_timer_request(&mut self) -> Option<u64> {
        self.device.take_timer_request()
    }

    /// Serves queue `index` as if the driver had notified it: the device's backend has
    /// something for it (a net device's received frames). Nothing happens before DRIVER_OK.
    pub fn poll_queue(&mut self, index: u32) {
        self.notify(index);
    }

    fn notify(&mut self, index: u32) {
        if self.status & VIRTIO_CONFIG_S_DRIVER_OK == 0 {
            return;
        }
        let Ok(index) = usize::try_from(index) else {
            return;
        };
        let Some(queue) = self.queues.get_mut(index) else {
            return;
        };
        let mem = self.mem.as_ref();
        if !queue.is_valid(mem) {
            return;
        }
        if self.device.process_queue(index, queue, mem)
            && queue.needs_notification(mem).unwrap_or(true)
        {
            self.interrupt_status |= VIRTIO_MMIO_INT_VRING;
        }
    }
}

fn low(v: u64) -> u32 {
    u32::try_from(v & 0xffff_ffff).unwrap_or(0)
}

fn high(v: u64) -> u32 {
    u32::try_from(v >> 32).unwrap_or(0)
}

/// A virtio-mmio device as the VMM keeps it beside the MMIO bus, for a snapshot: its transport
/// state is saved and restored behind the device; the bus knows no device's state.
pub trait SavedTransport: MmioDevice {
    /// [`VirtioMmioDevice::save`].
    fn save_transport(&self) -> TransportState;
    /// [`VirtioMmioDevice::restore`].
    fn restore_transport(&mut self, state: &TransportState) -> Result<(), TransportStateError>;
}

/// A shared, lockable virtio-mmio device as a snapshot reaches it (the same device is on the
/// bus as a [`crate::mmio::SharedMmioDevice`]).
pub type SharedTransport = Arc<Mutex<dyn SavedTransport>>;

/// A [`VirtioMmio`] on the MMIO bus, its interrupt on input `line` of an interrupt controller:
/// after every access the line follows [`VirtioMmio::interrupt_pending`] (raised when a used
/// buffer was added, lowered when the driver acknowledged all of InterruptStatus).
pub struct VirtioMmioDevice<D, M> {
    transport: VirtioMmio<D, M>,
    lines: Arc<dyn IrqLines>,
    line: u32,
    level: bool,
    timer: Option<Arc<dyn DeviceTimer>>,
    /// Quiesced ([`MmioDevice::quiesce`]): polls and timers wait.
    quiesced: bool,
    /// Queues polled while quiesced (bit n: queue n).
    missed_polls: u64,
    /// The timer fired while quiesced.
    missed_timer: bool,
}

impl<D: VirtioDevice, M: GuestMemory> VirtioMmioDevice<D, M> {
    /// `transport`, its interrupt on `lines`' input `line`.
    pub fn new(transport: VirtioMmio<D, M>, lines: Arc<dyn IrqLines>, line: u32) -> Self {
        Self {
            transport,
            lines,
            line,
            level: false,
            timer: None,
            quiesced: false,
            missed_polls: 0,
            missed_timer: false,
        }
    }

    /// The same, its timer requests (a rate limiter's refills) going to `timer`.
    pub fn with_timer(mut self, timer: Arc<dyn DeviceTimer>) -> Self {
        self.timer = Some(timer);
        self
    }

    fn forward_timer_request(&mut self, request: Option<u64>) {
        if let (Some(timer), Some(at)) = (&self.timer, request) {
            timer.request(at);
        }
    }

    /// The transport.
    pub fn transport(&self) -> &VirtioMmio<D, M> {
        &self.transport
    }

    /// The transport, to reach its device's backend (tests, fuzz targets).
    pub fn transport_mut(&mut self) -> &mut VirtioMmio<D, M> {
        &mut self.transport
    }

    /// [`VirtioMmio::poll_queue`], then the line and the timer as after a guest access: called
    /// on the thread that learnt the backend is ready (lull's VMM thread for a tap).
    /// While the device is quiesced the poll waits for the end of it.
    pub fn poll_queue(&mut self, index: u32) {
        if self.quiesced {
            self.missed_polls |= 1u64.checked_shl(index).unwrap_or(0);
            return;
        }
        self.transport.poll_queue(index);
        self.update_line();
        let request = self.transport.take_timer_request();
        self.forward_timer_request(request);
    }

    /// [`VirtioMmio::save`].
    pub fn save(&self) -> TransportState {
        self.transport.save()
    }

    /// [`VirtioMmio::restore`], then the interrupt line to the restored InterruptStatus and
    /// the refill timer the device waited for asked for again.
    pub fn restore(&mut self, s: &TransportState) -> Result<(), TransportStateError> {
        self.transport.restore(s)?;
        self.update_line();
        let request = self.transport.take_timer_request();
        self.forward_timer_request(request);
        Ok(())
    }

    fn update_line(&mut self) {
        let level = self.transport.interrupt_pending();
        if level != self.level {
            self.level = level;
            self.lines.set_level(self.line, level);
        }
    }
}

impl<D: VirtioDevice, M: GuestMemory + Send + Sync> MmioDevice for VirtioMmioDevice<D, M> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        self.transport.read(offset, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.transport.write(offset, data);
        self.update_line();
        let request = self.transport.take_timer_request();
        self.forward_timer_request(request);
    }

    fn quiesce(&mut self, on: bool) {
        self.quiesced = on;
        self.transport.device_mut().freeze_throttle(on);
        if on {
            return;
        }
        if std::mem::take(&mut self.missed_timer) {
            self.timer_fired();
        }
        let missed = std::mem::take(&mut self.missed_polls);
        for index in (0..64u32).filter(|i| missed & (1 << i) != 0) {
            self.poll_queue(index);
        }
    }

    fn timer_fired(&mut self) {
        if self.quiesced {
            self.missed_timer = true;
            return;
        }
        let request = self.transport.timer_fired();
        self.update_line();
        self.forward_timer_request(request);
    }
}

impl<D: VirtioDevice, M: GuestMemory + Send + Sync> SavedTransport for VirtioMmioDevice<D, M> {
    fn save_transport(&self) -> TransportState {
        self.save()
    }

    fn restore_transport(&mut self, state: &TransportState) -> Result<(), TransportStateError> {
        self.restore(state)
    }
}
