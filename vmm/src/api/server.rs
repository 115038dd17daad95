//! The API server: the socket and the loop that serves it on lull's main thread.
//!
//! One thread multiplexes every client over non-blocking sockets with `event-manager`, as the
//! VMM thread's loop does (`vm::event_loop`); each connection is a
//! [`Conn`](super::conn::Conn) state machine (incremental HTTP framing, keep-alive,
//! deadlines), so a client that sends half a request, or never reads its answer, holds only
//! its own connection:
//!
//! ```text
//!   manager.run_with_timeout(the nearest connection deadline)
//!     └─ Server::process, the one subscriber, by the token in the event's data:
//!          ├─ listener readable ─► accept while there is room (`clients`) ─► Conn, watch IN
//!          ├─ client readable   ─► one read ─► Conn: requests ─► routes ─► Controller
//!          │                      ─► answers
//!          ├─ client writable   ─► write what is queued (watch OUT only while something is)
//!          ├─ VM-ended eventfd  ─► the controller takes note; the server takes the signals back
//!          └─ SIGINT/TERM/HUP  ─► stop the VM if it runs, end lull
//!   then (Server::after_wait) every connection past its deadline: 408 or closed (see
//!   `http::REQUEST_TIMEOUT`); the listener back in the set if there is room
//! ```
//!
//! The `Server` (listener, connections, controller with the VM-ended eventfd, stop-signal
//! eventfd) is shared, on this one thread, between the manager that hands it events and the
//! loop that expires deadlines between waits. It adds and removes descriptors through
//! `EventOps`, each tagged with its token (`Events::with_data`); a descriptor leaves the set
//! before it is closed, since the manager dispatches by descriptor number. An event that ends
//! lull (`vmm.shutdown`, a signal, a failure) is noted, the rest of that wait's events are
//! not served, and the loop returns. The loop and its subscriber are here; the connections
//! (room, reads, answers, deadlines) are `clients.rs`, the epoll set's tokens and the
//! stop-signal eventfd `watch.rs`.
//!
//! A request is handled to its end before the loop goes on (`vm.boot` waits for the VM's
//! vCPUs to run, a stop for the run to end): the other clients wait for that, never for
//! another client's bytes. Before its loop the thread installs its seccomp filter
//! (`seccomp::ThreadKind::Api`), in the mode of `--seccomp`.
//!
//! Signals: the handlers write one process-wide eventfd (`sys::stop_signals`). While the VM
//! runs, its own event loop has installed them and takes the signal (the run ends with
//! `StopReason::Signal`, which ends lull too); once a run ends, the server installs them again
//! for itself. A signal in the moment between the end of a run and that re-installation is
//! lost (it reaches the ended run's eventfd); a run stopped by a request (vm.shutdown,
//! vm.reboot, vm.delete) gives the handlers back before that request is answered, so a
//! client that signals lull after the answer is heard. The eventfd the server replaces stays
//! in the epoll set until the events of the wait that saw the run end are served: a signal
//! that wait reported on it still ends lull.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use event_manager::{
    EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberId, SubscriberOps,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::clients::Clients;
use super::controller::Controller;
use super::error::ApiError;
use super::events::EventMonitor;
pub use super::limits::{MAX_CONNECTIONS, MAX_REFUSING};
pub use super::socket::ApiSocket;
use super::watch::{epoll, host, watch, StopSignal, LISTENER, SIGNAL, VM_ENDED};
use crate::config::ch::restore::ChRestore;
use crate::config::knobs::SeccompMode;
use crate::config::VmConfig;
use crate::host::seccomp::{self, ThreadKind};
use crate::host::sys::stop_signals;

/// Most events one wait reports: every connection and the three other descriptors, with room.
const READY_EVENTS: usize = MAX_CONNECTIONS + MAX_REFUSING + 4;

/// The server's event loop: its one subscriber is the [`Server`], shared with the loop
/// between waits (to expire deadlines), all on one thread.
type Manager = EventManager<Rc<RefCell<Server>>>;

/// The server's state, the one subscriber of its event loop: the listener, the connections,
/// the controller (and through it the VM-ended eventfd), the stop-signal eventfd.
struct Server {
    clients: Clients,
    signal: StopSignal,
    controller: Controller,
    socket: ApiSocket,
    /// How lull ends, once a served event said so (an exit status, or the server failed):
    /// the rest of that wait's events are not served.
    outcome: Option<Result<i32, ApiError>>,
}

impl Server {
    /// Puts the listener, the VM-ended eventfd and the stop-signal eventfd in the epoll set.
    fn watch_all(&self, ops: &mut EventOps) -> Result<(), ApiError> {
        watch(ops, &self.socket.listener, EventSet::IN, LISTENER)?;
        watch(ops, self.controller.ended_event(), EventSet::IN, VM_ENDED)?;
        watch(ops, &self.signal.event, EventSet::IN, SIGNAL)
    }

    /// The VM thread's run ended: the controller takes note, the server takes the signals
    /// back.
    fn on_vm_ended(&mut self, ops: &mut EventOps) -> Option<Result<i32, ApiError>> {
        let _ = self.controller.ended_event().read();
        let exit = self.controller.poll_vm();
        if exit.is_none() && self.controller.take_run_ended() {
            if let Err(e) = self.signal.reinstall(ops) {
                return Some(Err(e));
            }
        }
        exit.map(Ok)
    }

    /// A stop signal: the VM stopped if it runs; returns lull's exit status.
    fn on_signal(&mut self) -> i32 {
        let _ = self.signal.event.read();
        let signal = stop_signals::last_signal().unwrap_or(libc::SIGTERM);
        self.controller.on_signal(signal)
    }

    /// What follows every wait whose events did not end lull: the replaced stop-signal
    /// eventfds closed, the connections past their deadline expired, the listener back if
    /// there is room.
    fn after_wait(&mut self, ops: &mut EventOps) {
        self.signal.close_replaced(ops);
        let (signal, controller) = (&mut self.signal, &mut self.controller);
        self.clients.expire(Instant::now(), ops, signal, controller);
        self.clients.listen_again(&self.socket.listener, ops);
    }
}

impl MutEventSubscriber for Server {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if self.outcome.is_some() {
            return;
        }
        self.outcome = match events.data() {
            LISTENER => {
                self.clients.accept_all(&self.socket.listener, ops);
                None
            }
            VM_ENDED => self.on_vm_ended(ops),
            SIGNAL => Some(Ok(self.on_signal())),
            token => {
                let (signal, controller) = (&mut self.signal, &mut self.controller);
                let set = events.event_set();
                self.clients
                    .ready(token, set, ops, signal, controller)
                    .map(Ok)
            }
        };
    }

    /// Nothing: `serve_on` puts the descriptors in the epoll set itself
    /// ([`Server::watch_all`]), where a failure can end it.
    fn init(&mut self, _ops: &mut EventOps) {}
}

/// Waits for events or the nearest deadline and serves them, until one ends lull; returns
/// lull's exit status.
fn run(manager: &mut Manager, id: SubscriberId, server: &RefCell<Server>) -> Result<i32, ApiError> {
    loop {
        let timeout = server.borrow().clients.timeout_ms(Instant::now());
        manager
            .run_with_timeout(timeout)
            .map_err(epoll("the API event wait"))?;
        let mut ops = manager.event_ops(id).map_err(epoll("the API epoll set"))?;
        let mut server = server.borrow_mut();
        match server.outcome.take() {
            Some(Ok(code)) => {
                server.controller.exiting();
                return Ok(code);
            }
            Some(Err(e)) => return Err(e),
            None => server.after_wait(&mut ops),
        }
    }
}

/// What the server does before it serves: boot the created VM, or restore a snapshot.
enum Start {
    Boot,
    Restore(ChRestore),
}

/// The VM an API server starts with.
#[derive(Debug)]
pub enum InitialVm {
    /// None: `vm.create` or `vm.restore` makes one.
    None,
    /// The VM the command line described, created, and booted at once if `boot` (Cloud
    /// Hypervisor's command line with both `--api-socket` and `--kernel`).
    Created {
        /// Its configuration.
        cfg: Box<VmConfig>,
        /// Boot it before serving.
        boot: bool,
    },
    /// The snapshot Cloud Hypervisor's `--restore` names, restored before serving: paused,
    /// or running if it says `resume=true`.
    Restored(ChRestore),
}

/// The seccomp mode of the server's own filter: that of the VM the command line described
/// (`--seccomp`, or its `--config` file), else the default.
fn seccomp_mode(initial: &InitialVm) -> SeccompMode {
    match initial {
        InitialVm::Created { cfg, .. } => cfg.seccomp,
        InitialVm::None | InitialVm::Restored(_) => SeccompMode::default(),
    }
}

/// Serves the API on `path` until `vmm.shutdown` or a signal; returns lull's exit status.
/// `initial` is the VM the command line described, if it described one.
pub fn serve(path: &Path, initial: Option<VmConfig>) -> Result<i32, ApiError> {
    let initial = initial.map_or(InitialVm::None, |cfg| InitialVm::Created {
        cfg: Box::new(cfg),
        boot: false,
    });
    serve_on(
        ApiSocket::bind(path)?,
        initial,
        EventMonitor::none(),
        Vec::new(),
    )
}

/// Serves the API on `socket` (bound, or inherited), starting with `initial`, writing Cloud
/// Hypervisor's event records to `events`, applying `ch_knobs` (`lull ch --lull`) to each VM
/// created from Cloud Hypervisor's `VmConfig`; returns lull's exit status.
pub fn serve_on(
    socket: ApiSocket,
    initial: InitialVm,
    events: EventMonitor,
    ch_knobs: Vec<String>,
) -> Result<i32, ApiError> {
    let filter =
        seccomp::program(ThreadKind::Api, seccomp_mode(&initial)).map_err(ApiError::Seccomp)?;
    let signal = stop_signals::install().map_err(host("the stop-signal handlers"))?;
    let ended = EventFd::new(EFD_NONBLOCK).map_err(host("the VM-ended eventfd"))?;
    let (created, start) = match initial {
        InitialVm::None => (None, None),
        InitialVm::Created { cfg, boot } => (Some(*cfg), boot.then_some(Start::Boot)),
        InitialVm::Restored(restore) => (None, Some(Start::Restore(restore))),
    };
    let controller = Controller::new(created, ended)
        .with_events(events)
        .with_ch_knobs(ch_knobs);
    let server = Rc::new(RefCell::new(Server {
        clients: Clients::new(),
        signal: StopSignal {
            event: signal,
            replaced: Vec::new(),
        },
        controller,
        socket,
        outcome: None,
    }));
    let mut manager =
        Manager::new_with_capacity(READY_EVENTS).map_err(epoll("the API epoll set"))?;
    let id = manager.add_subscriber(server.clone());
    let mut ops = manager.event_ops(id).map_err(epoll("the API epoll set"))?;
    server.borrow().watch_all(&mut ops)?;
    if let Some(filter) = &filter {
        seccomp::apply_api(filter).map_err(ApiError::Seccomp)?;
    }
    start_vm(&mut server.borrow_mut(), start)?;
    run(&mut manager, id, &server)
}

/// Boots or restores the VM the server starts with, if any, then says where it serves.
fn start_vm(server: &mut Server, start: Option<Start>) -> Result<(), ApiError> {
    match start {
        Some(Start::Boot) => server.controller.boot_at_start()?,
        Some(Start::Restore(restore)) => server.controller.restore_at_start(&restore)?,
        None => {}
    }
    tracing::info!("management API on {}", server.socket.describe());
    Ok(())
}
