//! The VM's virtio-net devices: each `--net` tap becomes a virtio-mmio device in the windows
//! after the disks' (`disks::placement(disks + n)`), its interrupt on the next line of
//! `layout::VIRTIO_MMIO_IRQS` through the irqchip's `irq_lines()`, as a disk's.
//!
//! Where frames move:
//!
//! ```text
//!  guest QueueNotify(TX) ── MMIO exit on that vCPU thread ──► Net::transmit ──► write(tap)
//!  tap readable ── epoll (edge-triggered) on the VMM thread ──► poll_queue(RX) ──► guest chains
//!  guest QueueNotify(RX) (buffers posted) ── MMIO exit ──► Net::receive ──► read(tap) until empty
//! ```
//!
//! TX runs on the notifying vCPU, as a disk request does (`disks`): a tap write is a short
//! non-blocking copy into the host stack, cheaper than waking another thread for it. RX must
//! start from something that wakes when the host has a frame: the tap's descriptor readable.
//! The VMM thread already sleeps in epoll for the console and signals, so it watches the taps
//! too; a vCPU cannot (it sits in KVM_RUN or in its own halt wait). The descriptor is watched
//! edge-triggered: a receive pass reads frames only while the guest has buffers posted, so
//! when it has none the frames stay in the tap's queue (no loss in lull; the host kernel drops
//! and counts at the tap's queue limit) and the VMM thread does not spin on a level that stays
//! high. The guest's own RX notification, when it posts buffers, runs the next pass on its
//! vCPU, and each new frame is a new edge. Both run under the device's mutex, so a frame is
//! never read twice nor a wake-up lost between them. The interrupt is raised from whichever
//! thread completed buffers, as a disk's refill timer does from the VMM thread
//! (`KVM_IRQ_LINE` with `--irqchip kernel`, lull's IOAPIC and a kick with `--irqchip user`).
//!
//! Seccomp: the tap is opened and attached before any filter; afterwards lull only `read`s,
//! `write`s and `epoll_ctl`s it, which every thread's (read, write) or the VMM thread's
//! (epoll) allow-list already permits.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use devices::mmio::{MmioBus, MmioBusError, SharedMmioDevice};
use devices::testdev::IrqLines;
use devices::virtio::mmio::{SharedTransport, VirtioMmio, VirtioMmioDevice, WINDOW_SIZE};
use devices::virtio::net::{Net, RX_QUEUE};
use devices::virtio::throttle::DeviceClock;
use timer::lock;
use vm_memory::GuestMemoryMmap;

use super::disks::placement;
use crate::config::{MacAddr, NetConfig};
use crate::host::sys::tap::{Tap, TapError};
use crate::state::device_timers::DeviceTimers;
use crate::state::net_port::{NetPort, NetReport};

/// A virtio-net device on a tap, behind its transport and bus adapter.
pub type NetDevice = VirtioMmioDevice<Net<Tap>, GuestMemoryMmap>;

/// The attached taps, in `--net` order.
pub struct OpenNets(Vec<(Tap, NetConfig)>);

/// Attaches to every tap (early, so that a bad `--net` fails before KVM is touched).
pub fn open(nets: &[NetConfig]) -> Result<OpenNets, TapError> {
    nets.iter()
        .map(|n| {
            let tap = match n.fd {
                Some(fd) => Tap::from_fd(fd)?,
                None => Tap::open(&n.tap)?,
            };
            Ok((tap, n.clone()))
        })
        .collect::<Result<_, _>>()
        .map(OpenNets)
}

/// One device on the bus, as the VMM thread and the report see it.
struct TapPort {
    device: Arc<Mutex<NetDevice>>,
    fd: RawFd,
    tap: String,
    mac: MacAddr,
}

impl NetPort for TapPort {
    fn fd(&self) -> RawFd {
        self.fd
    }

    fn poll_rx(&self) {
        lock(&self.device).poll_queue(u32::try_from(RX_QUEUE).unwrap_or(0));
    }

    fn report(&self) -> NetReport {
        let s = lock(&self.device).transport().device().stats();
        NetReport {
            tap: self.tap.clone(),
            mac: self.mac.to_string(),
            stats: s,
        }
    }
}

/// The nets on the bus.
pub struct Nets {
    /// What the VMM thread watches and the report reads, in `--net` order.
    pub ports: Vec<Arc<dyn NetPort>>,
    /// The devices by device-timer id order (after the disks'), for [`DeviceTimers`].
    pub devices: Vec<SharedMmioDevice>,
    /// The same devices' transports, for a snapshot.
    pub transports: Vec<SharedTransport>,
}

/// Puts every attached tap's device on `bus` after `first` devices (the disks), with its
/// queues in `mem`, its line on `lines`, and its transmit refill timer (if rate-limited) in
/// `timers` under its device index.
pub fn attach(
    open: OpenNets,
    first: usize,
    bus: &mut MmioBus,
    mem: &Arc<GuestMemoryMmap>,
    lines: &Arc<dyn IrqLines>,
    timers: &Arc<DeviceTimers>,
) -> Result<Nets, MmioBusError> {
    let mut nets = Nets {
        ports: Vec::new(),
        devices: Vec::new(),
        transports: Vec::new(),
    };
    // Device times are CLOCK_MONOTONIC, like the timerfds; the irqchip converts.
    let clock: DeviceClock = Arc::new(crate::host::sys::clock::monotonic_ns);
    for (n, (tap, cfg)) in open.0.into_iter().enumerate() {
        let index = first + n;
        let Some((base, irq)) = placement(index) else {
            break; // VmConfig::validate caps disks + nets at the lines there are
        };
        let fd = tap.as_raw_fd();
        let mac = cfg.mac();
        let net = Net::new(tap, mac.0).with_tx_rate_limit(cfg.rate, clock.clone());
        let mut device =
            VirtioMmioDevice::new(VirtioMmio::new(net, mem.clone()), lines.clone(), irq);
        if cfg.rate.is_limited() {
            device = device.with_timer(timers.handle(u32::try_from(index).unwrap_or(u32::MAX)));
        }
        let device = Arc::new(Mutex::new(device));
        nets.transports.push(device.clone());
        nets.devices.push(device.clone());
        bus.insert(base, WINDOW_SIZE, device.clone())?;
        tracing::debug!(tap = %cfg.tap, %mac, base, irq, "virtio-net attached");
        nets.ports.push(Arc::new(TapPort {
            device,
            fd,
            tap: cfg.tap,
            mac,
        }));
    }
    Ok(nets)
}
