//! What the vCPU threads share with the VM's other threads, below the irqchip and the vCPUs:
//! the stop request and its reason, each vCPU's counters, the device timers, and what vCPU
//! threads record for the report ([`VcpuShared`]).
//!
//! The first stop request wins: a vCPU thread (guest reset, crash, lull error), the VMM thread
//! (Ctrl-A x, a signal) or the irqchip's timer thread records why, and the VMM thread, which
//! waits on the stop eventfd, tears the VM down. Nobody polls a flag in a loop for it: vCPU
//! threads read it once per iteration, and blocked ones are woken by the irqchip.
//!
//! The state of a running VM outside the irqchip, split by who uses it (the map a snapshot
//! follows). Threads: vCPU i, the VMM thread (`vm::event_loop`, then the report), the `central`
//! model's timer thread, the API thread (a live report, a stop request).
//!
//! ```text
//!  piece               home                  written by                read by
//!  stop                state::VcpuShared     any thread; first wins    vCPU threads (each
//!                                                                      iteration), timer
//!                                                                      thread, VMM thread
//!  vcpu_counters[i]    state::VcpuShared     vCPU i                    the report
//!  device_timers       state::VcpuShared     vCPU threads, timer       the report (summary)
//!                                            thread, VMM thread (fire,
//!                                            arm, timerfds)
//!  pause               state::VcpuShared     the API thread (request,  vCPU threads (each
//!                                            release); vCPU threads    iteration; they park
//!                                            (park)                    there)
//!  started, booted     state::VcpuShared     the vCPU that sees the    the report
//!                                            boot marker
//!  ended_threads       state::VcpuShared     each vCPU thread on its   the report
//!                                            way out
//!  pio, mmio, noise    vcpu::DeviceBuses     vCPU threads, only in     the report (noise)
//!                                            the exit context
//!  kvm_stats, nets,    vm::RunStats          the VM, once (disks       the report; the VMM
//!  disk_shrink_errors                        count errors in their     thread polls the
//!                                            own atomics)              nets' taps
//! ```
//!
//! Who holds what: vCPU thread i an `Arc<VcpuShared>` (through its irqchip half too) and an
//! `Arc<DeviceBuses>`; the timer thread and the VMM thread's loop an `Arc<VcpuShared>` (the
//! loop also the nets); `vm::LiveVm` (the report, the API) all three; the console's failure
//! hook a `Weak<VcpuShared>`, to request a stop. `started`, `booted` and
//! `ended_threads` are the run's statistics, but vCPU threads write them, and the `vcpu` layer
//! cannot name a `vm` type: they live here.

pub mod counters;
pub mod device_timers;
pub mod net_port;
pub mod pause_gate;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use timer::lock;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::host::stats::{self, ThreadStat};
use crate::state::counters::VcpuCounters;
use crate::state::device_timers::DeviceTimers;
use crate::state::pause_gate::PauseGate;

/// Why a VM stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The guest reset the machine (i8042, port 0x92, KVM system event).
    Reset,
    /// The guest powered the machine off.
    PowerOff,
    /// The guest wrote to the test-exit port; this is the exit status.
    TestExit(u8),
    /// Triple fault (KVM shutdown exit).
    TripleFault,
    /// KVM could not emulate something or enter the guest.
    GuestCrash(String),
    /// A host call failed in lull while the VM ran (described, with the vCPU and the call).
    VmmError(String),
    /// The user asked to stop on the console (Ctrl-A x).
    User,
    /// lull received SIGINT, SIGTERM or SIGHUP.
    Signal(i32),
    /// A client of the management API asked for it (`vm.shutdown` or `vmm.shutdown`).
    Api,
    /// An output lull writes while the VM runs (the `--serial file=`) failed: what and why.
    OutputFailed(String),
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Reset => f.write_str("guest reset"),
            Self::PowerOff => f.write_str("guest power-off"),
            Self::TestExit(s) => write!(f, "guest test exit (status {s})"),
            Self::TripleFault => f.write_str("guest triple fault"),
            Self::GuestCrash(why) => write!(f, "guest crashed: {why}"),
            Self::VmmError(why) => write!(f, "lull error: {why}"),
            Self::User => f.write_str("stopped by the user (Ctrl-A x)"),
            Self::Signal(libc::SIGTERM) => f.write_str("stopped by SIGTERM"),
            Self::Signal(libc::SIGINT) => f.write_str("stopped by SIGINT"),
            Self::Signal(libc::SIGHUP) => f.write_str("stopped by SIGHUP"),
            Self::Signal(n) => write!(f, "stopped by signal {n}"),
            Self::Api => f.write_str("stopped through the management API"),
            Self::OutputFailed(why) => f.write_str(why),
        }
    }
}

/// The first stop request wins; the VMM thread waits on its eventfd.
pub struct StopSignal {
    reason: Mutex<Option<StopReason>>,
    event: EventFd,
}

impl StopSignal {
    /// A signal with no request yet.
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            reason: Mutex::new(None),
            event: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// Asks the VM to stop; later requests are ignored.
    pub fn request(&self, reason: StopReason) {
        let mut guard = lock(&self.reason);
        if guard.is_none() {
            *guard = Some(reason);
            // A failed wake-up write leaves the reason set; the event loop also checks it.
            let _ = self.event.write(1);
        }
    }

    /// The eventfd written on the first request.
    pub fn event(&self) -> &EventFd {
        &self.event
    }

    /// True once a stop was requested.
    pub fn is_requested(&self) -> bool {
        lock(&self.reason).is_some()
    }

    /// The stop reason, if any.
    pub fn reason(&self) -> Option<StopReason> {
        lock(&self.reason).clone()
    }
}

/// What the vCPU threads share with the VM's other threads: the stop signal, each vCPU's exit
/// counters, the device timers vCPUs fire and arm, and what vCPU threads record for the report
/// (the boot marker, each ended thread's statistics). One per VM, as an `Arc`.
pub struct VcpuShared {
    /// One set of exit counters per vCPU.
    pub vcpu_counters: Vec<Arc<VcpuCounters>>,
    /// Stop requests.
    pub stop: StopSignal,
    /// When lull started.
    pub started: Instant,
    /// When the guest wrote its boot-complete marker (time since `started`).
    pub booted: OnceLock<Duration>,
    /// Statistics of threads that have ended (recorded by each thread on its way out).
    pub ended_threads: Mutex<Vec<ThreadStat>>,
    /// The refill timers of rate-limited devices; empty until the VM puts its devices there.
    pub device_timers: Arc<DeviceTimers>,
    /// Where vCPU threads wait while the VM is paused.
    pub pause: PauseGate,
}

impl VcpuShared {
    /// Shared state for `cpus` vCPUs.
    pub fn new(cpus: u32, started: Instant) -> std::io::Result<Self> {
        Ok(Self {
            vcpu_counters: (0..cpus).map(|i| Arc::new(VcpuCounters::of(i))).collect(),
            stop: StopSignal::new()?,
            started,
            booted: OnceLock::new(),
            ended_threads: Mutex::new(Vec::new()),
            device_timers: Arc::new(DeviceTimers::none()),
            pause: PauseGate::default(),
        })
    }

    /// The counters of vCPU `id` (a vCPU's own id is always in range).
    pub fn counters(&self, id: u32) -> Option<&Arc<VcpuCounters>> {
        self.vcpu_counters.get(usize::try_from(id).ok()?)
    }

    /// Records the calling thread's statistics and asks the VM to stop.
    pub fn stop_from_thread(&self, reason: StopReason) {
        self.thread_ended();
        self.stop.request(reason);
    }

    /// Records the calling thread's statistics on its way out.
    pub fn thread_ended(&self) {
        lock(&self.ended_threads).push(stats::current_thread_stat());
    }

    /// Records the guest's boot-complete marker.
    pub fn mark_booted(&self) {
        let since = self.started.elapsed();
        if self.booted.set(since).is_ok() {
            tracing::info!(
                "guest boot complete {} ms after lull started",
                since.as_millis()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_stop_request_wins() {
        let s = StopSignal::new().unwrap();
        assert!(!s.is_requested());
        s.request(StopReason::TestExit(3));
        s.request(StopReason::Reset);
        assert_eq!(s.reason(), Some(StopReason::TestExit(3)));
        assert_eq!(s.event().read().unwrap(), 1);
    }

    #[test]
    fn signals_are_named() {
        assert_eq!(
            StopReason::Signal(libc::SIGTERM).to_string(),
            "stopped by SIGTERM"
        );
        assert_eq!(
            StopReason::Signal(libc::SIGHUP).to_string(),
            "stopped by SIGHUP"
        );
        assert!(StopReason::User.to_string().contains("Ctrl-A"));
    }
}
