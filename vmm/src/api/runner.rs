//! The VM thread of the management API: `vm.boot` starts a thread (`vm`) that runs
//! [`vm::run_observed`]; the thread hands back the [`LiveVm`] once every vCPU runs, and its
//! result when the run ends, then wakes the server through an eventfd (the `ended` one,
//! which the server's event manager watches).
//!
//! ```text
//!  server: start ──spawn──► vm thread: vm::run_observed(cfg) ──on_running──► Running(LiveVm)
//!          waits for the first event                 ...runs until a stop request...
//!  server: its event loop wakes ◄── eventfd ◄── Ended(result) ◄──┘
//! ```
//! The VM thread installs the VMM thread's seccomp filter and the SIGINT/SIGTERM handlers of
//! its event loop, exactly as `lull run` does on its main thread.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::thread::JoinHandle;
use std::time::Instant;

use vmm_sys_util::eventfd::EventFd;

use super::error::ApiError;
use crate::config::{MemoryRestore, VmConfig};
use crate::snapshot::Snapshot;
use crate::vm::{self, LiveVm, RunOutcome, VmError};

pub use super::limits::STOP_TIMEOUT;

/// What the VM thread reports.
enum RunEvent {
    /// Every vCPU runs.
    Running(LiveVm),
    /// The run ended (or never started).
    Ended(Box<Result<RunOutcome, VmError>>),
}

/// A VM that runs on its own thread.
pub struct RunningVm {
    live: LiveVm,
    events: Receiver<RunEvent>,
    thread: Option<JoinHandle<()>>,
}

/// Builds and starts the VM of `cfg` on a new thread; returns once it runs, or with the reason
/// it could not be built. `ended` is written when the run ends.
pub fn start(cfg: &VmConfig, ended: &EventFd) -> Result<RunningVm, ApiError> {
    let cfg = cfg.clone();
    spawn(ended, move |on_running| {
        vm::run_observed(&cfg, Default::default(), Instant::now(), on_running)
    })
}

/// Builds the VM of `snapshot` on a new thread, paused, its memory restored as `memory`
/// says; returns once its threads run.
pub fn restore(
    snapshot: Snapshot,
    memory: MemoryRestore,
    ended: &EventFd,
) -> Result<RunningVm, ApiError> {
    spawn(ended, move |on_running| {
        vm::restore_observed(&snapshot, memory, Instant::now(), on_running)
    })
}

/// Runs `run` on the `vm` thread, which hands the VM to the callback it gets once it runs.
fn spawn(
    ended: &EventFd,
    run: impl FnOnce(Box<dyn FnOnce(LiveVm)>) -> Result<RunOutcome, VmError> + Send + 'static,
) -> Result<RunningVm, ApiError> {
    let host = |what| move |source| ApiError::Host { what, source };
    let notify = ended.try_clone().map_err(host("the VM-ended eventfd"))?;
    let (tx, events) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("vm".to_string())
        .spawn(move || {
            let running = tx.clone();
            let result = run(Box::new(move |live| {
                let _ = running.send(RunEvent::Running(live));
            }));
            // The server may have gone (lull is exiting); nobody is left to tell then.
            let _ = tx.send(RunEvent::Ended(Box::new(result)));
            let _ = notify.write(1);
        })
        .map_err(host("the VM thread"))?;
    let mut thread = Some(thread);
    match events.recv() {
        Ok(RunEvent::Running(live)) => Ok(RunningVm {
            live,
            events,
            thread,
        }),
        Ok(RunEvent::Ended(result)) => {
            join(&mut thread);
            match *result {
                Err(e) => Err(ApiError::Boot(e)),
                // `run_observed` hands over the VM before it can end.
                Ok(_) => Err(ApiError::RunnerLost),
            }
        }
        Err(_) => {
            join(&mut thread);
            Err(ApiError::RunnerLost)
        }
    }
}

/// Waits for the VM thread, which has sent its last event.
fn join(thread: &mut Option<JoinHandle<()>>) {
    if let Some(t) = thread.take() {
        if t.join().is_err() {
            tracing::error!("the VM thread panicked");
        }
    }
}

impl RunningVm {
    /// The running VM: live counters, stop requests.
    pub fn live(&self) -> &LiveVm {
        &self.live
    }

    /// The run's result if it has ended.
    pub fn try_end(&mut self) -> Option<Result<RunOutcome, ApiError>> {
        match self.events.try_recv() {
            Ok(event) => Some(self.ended(event)),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(self.ended_without_result()),
        }
    }

    /// Waits up to [`STOP_TIMEOUT`] for the run to end (after a stop request).
    pub fn wait_end(&mut self) -> Result<RunOutcome, ApiError> {
        match self.events.recv_timeout(STOP_TIMEOUT) {
            Ok(event) => self.ended(event),
            Err(RecvTimeoutError::Timeout) => Err(ApiError::StopTimeout),
            Err(RecvTimeoutError::Disconnected) => self.ended_without_result(),
        }
    }

    fn ended(&mut self, event: RunEvent) -> Result<RunOutcome, ApiError> {
        join(&mut self.thread);
        match event {
            RunEvent::Ended(result) => (*result).map_err(|e| ApiError::RunFailed(e.into())),
            RunEvent::Running(_) => Err(ApiError::RunnerLost),
        }
    }

    fn ended_without_result(&mut self) -> Result<RunOutcome, ApiError> {
        join(&mut self.thread);
        Err(ApiError::RunnerLost)
    }
}
