//! Device timers: the refill timers of rate-limited disks and nets (their transmit side), and
//! what expires them. Device ids are the virtio-mmio devices' indexes: disks first, then nets.
//!
//! A device asks for a timer as an effect of a guest access (`devices::virtio::DeviceTimer`):
//! that happens inside an MMIO exit on the vCPU thread that ran the request. Two ways to
//! expire it (`--device-timers`):
//!
//! ```text
//!  hierarchy (user irqchip)                      timerfd (either irqchip; the baseline)
//!  ------------------------                      ---------------------------------------
//!  request -> pending queue (here)               request -> timerfd_settime(device's fd)
//!  the vCPU's next service() arms it as a        the VMM thread's event loop wakes at the
//!    global timer on its own base                  deadline, reads the fd and calls the
//!  expired by whoever the timer model says:        device's timer_fired there
//!    that vCPU, a migrator vCPU (pull), the
//!    timer thread (central), the vCPU's own
//!    host timer (push): on_timer_fired calls
//!    the device's timer_fired on that thread
//! ```
//!
//! A fired timer's callback locks the device (it sits behind the MMIO bus's mutex), which
//! processes its queue and raises its line if it completed anything; a request it makes from
//! there goes into the pending queue again (never into the timer model from inside its own
//! expiry), to be armed by the thread's next pass. Device times are CLOCK_MONOTONIC
//! nanoseconds; the irqchip converts them to its VM clock when it arms them.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use devices::mmio::SharedMmioDevice;
use devices::virtio::DeviceTimer;

use crate::config::DeviceTimerMode;
use crate::host::sys::timerfd::TimerFd;

/// Counters of one device's timer.
#[derive(Debug, Default)]
struct Counters {
    /// Timers asked for (each a request held back by the limiter).
    requested: AtomicU64,
    /// Timers that fired (refills).
    fired: AtomicU64,
}

pub use lull_schema::{DeviceTimerReport, DeviceTimersReport};

/// Every device timer of the VM.
pub struct DeviceTimers {
    mode: DeviceTimerMode,
    devices: OnceLock<Vec<SharedMmioDevice>>,
    counters: Vec<Counters>,
    vmm_thread_fires: Vec<AtomicU64>,
    /// Hierarchy mode: (device, CLOCK_MONOTONIC deadline) waiting to be armed.
    pending: Mutex<Vec<(u32, u64)>>,
    /// Timerfd mode: one per device.
    timerfds: Vec<TimerFd>,
    /// Timerfd mode: each device's armed CLOCK_MONOTONIC deadline, 0 once it fired (what a
    /// pause disarms and a resume arms again, later by the pause).
    armed: Vec<AtomicU64>,
}

impl DeviceTimers {
    /// Timers for `count` devices in `mode` (timerfd mode opens one timerfd each).
    pub fn new(mode: DeviceTimerMode, count: usize) -> std::io::Result<Self> {
        let timerfds = match mode {
            DeviceTimerMode::Timerfd => (0..count)
                .map(|_| TimerFd::nonblocking())
                .collect::<Result<_, _>>()?,
            DeviceTimerMode::Hierarchy => Vec::new(),
        };
        Ok(Self {
            mode,
            devices: OnceLock::new(),
            counters: (0..count).map(|_| Counters::default()).collect(),
            vmm_thread_fires: (0..count).map(|_| AtomicU64::new(0)).collect(),
            pending: Mutex::new(Vec::new()),
            armed: timerfds.iter().map(|_| AtomicU64::new(0)).collect(),
            timerfds,
        })
    }

    /// No device timers.
    pub fn none() -> Self {
        Self {
            mode: DeviceTimerMode::Timerfd,
            devices: OnceLock::new(),
            counters: Vec::new(),
            vmm_thread_fires: Vec::new(),
            pending: Mutex::new(Vec::new()),
            timerfds: Vec::new(),
            armed: Vec::new(),
        }
    }

    /// The mode.
    pub fn mode(&self) -> DeviceTimerMode {
        self.mode
    }

    /// Whether there is any device timer at all.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// Hands over the devices, by id (once, after they are on the bus).
    pub fn set_devices(&self, devices: Vec<SharedMmioDevice>) {
        let _ = self.devices.set(devices);
    }

    /// The handle device `id` asks through.
    pub fn handle(self: &Arc<Self>, id: u32) -> Arc<dyn DeviceTimer> {
        Arc::new(Handle {
            timers: self.clone(),
            id,
        })
    }

    fn request(&self, id: u32, deadline: u64) {
        let Some(c) = usize::try_from(id).ok().and_then(|i| self.counters.get(i)) else {
            return;
        };
        c.requested.fetch_add(1, Ordering::Relaxed);
        match self.mode {
            DeviceTimerMode::Hierarchy => timer::lock(&self.pending).push((id, deadline)),
            DeviceTimerMode::Timerfd => {
                let i = usize::try_from(id).unwrap_or(usize::MAX);
                if let (Some(fd), Some(armed)) = (self.timerfds.get(i), self.armed.get(i)) {
                    armed.store(deadline.max(1), Ordering::Release);
                    if let Err(e) = fd.arm_at(deadline) {
                        tracing::warn!("cannot arm a device's refill timerfd: {e}");
                    }
                }
            }
        }
    }

    /// Takes the timers waiting to be armed (hierarchy mode): (device, monotonic deadline).
    pub fn take_pending(&self) -> Vec<(u32, u64)> {
        let mut p = timer::lock(&self.pending);
        if p.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut *p)
        }
    }

    /// Device `id`'s timer fired on the calling thread: the device runs its callback here.
    pub fn fire(&self, id: u32) {
        let Some(i) = usize::try_from(id).ok() else {
            return;
        };
        let (Some(c), Some(device)) = (
            self.counters.get(i),
            self.devices.get().and_then(|d| d.get(i)),
        ) else {
            return;
        };
        c.fired.fetch_add(1, Ordering::Relaxed);
        timer::lock(device).timer_fired();
    }

    /// Timerfd mode: the fds the VMM thread watches, with their device ids.
    pub fn timerfds(&self) -> impl Iterator<Item = (u32, i32)> + '_ {
        self.timerfds
            .iter()
            .enumerate()
            .map(|(i, fd)| (u32::try_from(i).unwrap_or(u32::MAX), fd.as_raw_fd()))
    }

    /// Timerfd mode: device `id`'s fd is readable (on the VMM thread): consume and fire.
    pub fn on_timerfd(&self, id: u32) {
        let Some(i) = usize::try_from(id).ok() else {
            return;
        };
        if self.timerfds.get(i).is_some_and(TimerFd::consume) {
            if let Some(armed) = self.armed.get(i) {
                armed.store(0, Ordering::Release);
            }
            if let Some(n) = self.vmm_thread_fires.get(i) {
                n.fetch_add(1, Ordering::Relaxed);
            }
            self.fire(id);
        }
    }

    /// The VM is paused (timerfd mode): no refill fires while it is (hierarchy mode needs
    /// nothing: its timers are on the VM clock, which stops).
    pub fn pause(&self) {
        for fd in &self.timerfds {
            if let Err(e) = fd.disarm() {
                tracing::warn!("cannot disarm a device's refill timerfd for a pause: {e}");
            }
        }
    }

    /// The VM resumes after `paused_ns`: every refill that had not fired is armed again, as
    /// far ahead as it was when the VM paused (one that was due fires at once).
    pub fn resume(&self, paused_ns: u64) {
        for (fd, armed) in self.timerfds.iter().zip(&self.armed) {
            let deadline = armed.load(Ordering::Acquire);
            if deadline == 0 {
                continue;
            }
            let later = deadline.saturating_add(paused_ns);
            armed.store(later, Ordering::Release);
            if let Err(e) = fd.arm_at(later) {
                tracing::warn!("cannot re-arm a device's refill timerfd after a pause: {e}");
            }
        }
    }

    /// The report, if the VM has devices.
    pub fn summary(&self) -> Option<DeviceTimersReport> {
        (!self.is_empty()).then(|| DeviceTimersReport {
            mode: self.mode.name().to_string(),
            devices: self.report(),
        })
    }

    /// What each device's timer did.
    pub fn report(&self) -> Vec<DeviceTimerReport> {
        self.counters
            .iter()
            .zip(&self.vmm_thread_fires)
            .map(|(c, v)| DeviceTimerReport {
                requested: c.requested.load(Ordering::Relaxed),
                fired: c.fired.load(Ordering::Relaxed),
                vmm_thread_fires: v.load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// Device `id`'s way to ask for its timer.
struct Handle {
    timers: Arc<DeviceTimers>,
    id: u32,
}

impl DeviceTimer for Handle {
    fn request(&self, deadline: u64) {
        self.timers.request(self.id, deadline);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use devices::mmio::MmioDevice;

    use super::*;

    #[derive(Default)]
    struct Fires(u32);

    impl MmioDevice for Fires {
        fn read(&mut self, _: u64, _: &mut [u8]) {}
        fn write(&mut self, _: u64, _: &[u8]) {}
        fn timer_fired(&mut self) {
            self.0 += 1;
        }
    }

    #[test]
    fn hierarchy_requests_queue_and_fires_reach_the_device() {
        let t = Arc::new(DeviceTimers::new(DeviceTimerMode::Hierarchy, 2).unwrap());
        let dev = Arc::new(Mutex::new(Fires::default()));
        t.set_devices(vec![Arc::new(Mutex::new(Fires::default())), dev.clone()]);
        t.handle(1).request(500);
        t.handle(7).request(9); // no such device: ignored
        assert_eq!(t.take_pending(), vec![(1, 500)]);
        assert!(t.take_pending().is_empty());
        t.fire(1);
        assert_eq!(dev.lock().unwrap().0, 1);
        let r = t.report();
        assert_eq!((r[1].requested, r[1].fired, r[0].fired), (1, 1, 0));
    }

    #[test]
    fn a_paused_refill_waits_and_fires_once_after_the_resume() {
        let t = Arc::new(DeviceTimers::new(DeviceTimerMode::Timerfd, 1).unwrap());
        let dev = Arc::new(Mutex::new(Fires::default()));
        t.set_devices(vec![dev.clone()]);
        t.handle(0).request(1); // long past: due at once, but the VM pauses first
        t.pause();
        t.on_timerfd(0);
        assert_eq!(dev.lock().unwrap().0, 0, "nothing fires while paused");
        t.resume(1);
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while dev.lock().unwrap().0 == 0 && std::time::Instant::now() < give_up {
            t.on_timerfd(0);
        }
        assert_eq!(
            dev.lock().unwrap().0,
            1,
            "the refill fires after the resume"
        );
        t.pause();
        t.resume(1);
        t.on_timerfd(0);
        assert_eq!(
            dev.lock().unwrap().0,
            1,
            "a fired refill is not armed again"
        );
    }

    #[test]
    fn a_timerfd_fires_once_at_its_deadline() {
        let t = Arc::new(DeviceTimers::new(DeviceTimerMode::Timerfd, 1).unwrap());
        let dev = Arc::new(Mutex::new(Fires::default()));
        t.set_devices(vec![dev.clone()]);
        t.on_timerfd(0);
        assert_eq!(dev.lock().unwrap().0, 0, "not armed: nothing to consume");
        t.handle(0).request(1); // long past: the fd is readable at once
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while dev.lock().unwrap().0 == 0 && std::time::Instant::now() < give_up {
            t.on_timerfd(0);
        }
        assert_eq!(dev.lock().unwrap().0, 1);
        t.on_timerfd(0);
        assert_eq!(dev.lock().unwrap().0, 1, "one expiry, one fire");
        assert!(t.take_pending().is_empty());
        assert_eq!(t.report()[0].vmm_thread_fires, 1);
    }
}
