//! The API server: the socket and the loop that serves it on lull's main thread.
//!
//! One thread multiplexes every client over non-blocking sockets with `event-manager`, as the
//! VMM thread's loop does (`vm::event_loop`); each connection is a [`Conn`] state machine
//! (incremental HTTP framing, keep-alive, deadlines), so a client that sends half a request,
//! or never reads its answer, holds only its own connection:
//!
//! ```text
//!   manager.run_with_timeout(the nearest connection deadline)
//!     └─ Server::process, the one subscriber, by the token in the event's data:
//!          ├─ listener readable ─► accept while there is room (see below) ─► Conn, watch IN
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
//! not served, and the loop returns.
//!
//! Room: at most [`MAX_CONNECTIONS`] connections are served. A new one past that closes the
//! connection idle longest, never one in the middle of a request; before it closes one it
//! shuts down its reading (the client's next write fails with EPIPE instead of landing in a
//! queue closed unread, which resets the client) and looks at its queue: one whose client
//! sent something before that is served to the end instead, its request answered. With none
//! idle, the new connection is a refusing one (`Conn::refusing`: its request read and
//! answered 503, not carried out), up to [`MAX_REFUSING`] of them; past those, nothing is
//! accepted (the listener leaves the epoll set) until a connection closes or goes idle, and
//! clients wait in the backlog. So a request whose bytes reached lull is answered, or refused
//! with 503 and not carried out, and never cut off by lull. The idle timeout closes a
//! connection the same way (reading shut down, queue looked at).
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
use std::collections::BTreeMap;
use std::io::Write;
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use event_manager::{
    EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberId, SubscriberOps,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::conn::{Conn, Step};
use super::controller::{Controller, Next};
use super::error::ApiError;
use super::events::EventMonitor;
use super::http::{self, Response};
pub use super::limits::{MAX_CONNECTIONS, MAX_REFUSING};
use super::routes;
pub use super::socket::ApiSocket;
use crate::config::ch::restore::ChRestore;
use crate::config::knobs::SeccompMode;
use crate::config::VmConfig;
use crate::host::seccomp::{self, ThreadKind};
use crate::host::sys::peek::{self, Queue};
use crate::host::sys::scm::{self, SentFds};
use crate::host::sys::stop_signals;

/// Most bytes read from one connection per readiness event (a 1 MiB body takes 16), so that
/// one busy client cannot hold the loop.
const READ_CHUNK: usize = 64 * 1024;

/// Most events one wait reports: every connection and the three other descriptors, with room.
const READY_EVENTS: usize = MAX_CONNECTIONS + MAX_REFUSING + 4;

// The token in each event's data (`Events::with_data`): what the descriptor is.
const LISTENER: u32 = 0;
const VM_ENDED: u32 = 1;
const SIGNAL: u32 = 2;
/// Tokens from here on are connections.
const FIRST_CLIENT: u32 = 3;

/// The server's event loop: its one subscriber is the [`Server`], shared with the loop
/// between waits (to expire deadlines), all on one thread.
type Manager = EventManager<Rc<RefCell<Server>>>;

fn host(what: &'static str) -> impl Fn(std::io::Error) -> ApiError {
    move |source| ApiError::Host { what, source }
}

/// An `event-manager` failure as the host error it is (an epoll call's errno).
fn epoll(what: &'static str) -> impl Fn(event_manager::Error) -> ApiError {
    move |e| {
        let source = match e {
            event_manager::Error::Epoll(errno) => errno.into(),
            other => std::io::Error::other(other),
        };
        ApiError::Host { what, source }
    }
}

/// Puts `fd` in the epoll set for `set`, its events tagged with `token`.
fn watch(ops: &mut EventOps, fd: &impl AsRawFd, set: EventSet, token: u32) -> Result<(), ApiError> {
    ops.add(Events::with_data(fd, token, set))
        .map_err(epoll("the API epoll set"))
}

/// Takes `fd` out of the epoll set. Every descriptor leaves it this way before it is closed:
/// the event manager dispatches by descriptor number, which the next one opened may reuse.
fn unwatch(ops: &mut EventOps, fd: &impl AsRawFd) -> Result<(), ApiError> {
    ops.remove(Events::empty(fd))
        .map_err(epoll("the API epoll set"))
}

/// The eventfd the stop signals write while the server (not a VM) has the handlers.
struct StopSignal {
    event: EventFd,
    /// Eventfds of earlier installs: still watched until the wait that reported the run's end
    /// has been served (an event of theirs it reported is served as a signal).
    replaced: Vec<EventFd>,
}

impl StopSignal {
    /// Takes the stop-signal handlers back from a VM whose run has ended.
    fn reinstall(&mut self, ops: &mut EventOps) -> Result<(), ApiError> {
        let event = stop_signals::install().map_err(host("the stop-signal handlers"))?;
        self.replaced
            .push(std::mem::replace(&mut self.event, event));
        watch(ops, &self.event, EventSet::IN, SIGNAL)
    }

    /// Closes the replaced eventfds, out of the epoll set first.
    fn close_replaced(&mut self, ops: &mut EventOps) {
        for old in self.replaced.drain(..) {
            let _ = unwatch(ops, &old);
        }
    }
}

/// One client: its socket, its state, what epoll watches it for.
struct Client {
    stream: UnixStream,
    conn: Conn,
    watching: EventSet,
    /// Descriptors sent with the bytes read (SCM_RIGHTS), for the next request answered
    /// (a client sends them with its request's first write): kept, all counted.
    fds: SentFds,
    /// Its reading was shut down to close it, and it held bytes: served to its end, then
    /// closed (never retired twice).
    retiring: bool,
}

/// The open connections, by token.
struct Clients {
    open: BTreeMap<u32, Client>,
    next_token: u32,
    /// The read buffer, shared by every connection.
    chunk: Vec<u8>,
    /// Whether the listener is in the epoll set (it leaves it while there is no room).
    listening: bool,
}

/// What a new connection can be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    /// Service.
    Serve,
    /// A 503 for its request.
    Refuse,
    /// Nothing yet: it waits in the backlog.
    None,
}

impl Clients {
    fn new() -> Self {
        Self {
            open: BTreeMap::new(),
            next_token: FIRST_CLIENT,
            chunk: vec![0; READ_CHUNK],
            listening: true,
        }
    }

    /// Connections served (not refusing).
    fn serving(&self) -> usize {
        self.open.values().filter(|c| !c.conn.is_refusing()).count()
    }

    /// Accepts pending connections while there is room; with none left, takes the listener out
    /// of the epoll set ([`Clients::listen_again`] puts it back).
    fn accept_all(&mut self, listener: &UnixListener, ops: &mut EventOps) {
        loop {
            if !self.has_room() {
                self.pause_listening(listener, ops);
                return;
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    // Room is made only for a connection that came: none closed for nothing.
                    // Idle ones found holding bytes after all leave none: refused then (a
                    // few more than MAX_REFUSING at most, as each is looked at once).
                    let room = match self.make_room(ops) {
                        Room::None => Room::Refuse,
                        room => room,
                    };
                    if let Err(e) = self.add(stream, room, ops) {
                        tracing::warn!("API socket: cannot serve a connection: {e}");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // E.g. out of descriptors: this connection is lost, the server goes on.
                    tracing::warn!("API socket: cannot accept a connection: {e}");
                    return;
                }
            }
        }
    }

    fn pause_listening(&mut self, listener: &UnixListener, ops: &mut EventOps) {
        if !self.listening {
            return;
        }
        tracing::debug!("API socket full: new connections wait in the backlog");
        if unwatch(ops, listener).is_ok() {
            self.listening = false;
        }
    }

    /// Puts the listener back in the epoll set once there is room again (a connection closed,
    /// or one went idle).
    fn listen_again(&mut self, listener: &UnixListener, ops: &mut EventOps) {
        if self.listening || !self.has_room() {
            return;
        }
        match watch(ops, listener, EventSet::IN, LISTENER) {
            Ok(()) => self.listening = true,
            Err(e) => tracing::warn!("API socket: {e}"),
        }
    }

    /// The next connection's token: the next number not in use (after `u32::MAX` come the
    /// first ones again).
    fn new_token(&mut self) -> u32 {
        loop {
            let token = self.next_token;
            self.next_token = token.checked_add(1).unwrap_or(FIRST_CLIENT);
            if !self.open.contains_key(&token) {
                return token;
            }
        }
    }

    fn add(&mut self, stream: UnixStream, room: Room, ops: &mut EventOps) -> Result<(), ApiError> {
        stream.set_nonblocking(true).map_err(ApiError::Connection)?;
        let token = self.new_token();
        watch(ops, &stream, EventSet::IN, token)?;
        let now = Instant::now();
        let conn = if room == Room::Refuse {
            tracing::debug!("API socket full: connection {token} is refused (503)");
            Conn::refusing(now)
        } else {
            Conn::new(now)
        };
        let client = Client {
            stream,
            conn,
            watching: EventSet::IN,
            fds: SentFds::default(),
            retiring: false,
        };
        self.open.insert(token, client);
        Ok(())
    }

    /// Closes connection `token`: out of the epoll set, then its socket closed.
    fn close(&mut self, token: u32, ops: &mut EventOps) {
        if let Some(client) = self.open.remove(&token) {
            if let Err(e) = unwatch(ops, &client.stream) {
                tracing::debug!("API connection {token}: {e}");
            }
        }
    }

    /// Whether a new connection can get anything ([`Clients::make_room`] without its effects).
    fn has_room(&self) -> bool {
        self.serving() < MAX_CONNECTIONS
            || self.open.len() - self.serving() < MAX_REFUSING
            || self.open.values().any(|c| c.conn.is_idle() && !c.retiring)
    }

    /// What a new connection gets: service while fewer than [`MAX_CONNECTIONS`] are served or
    /// an idle one can be closed for it (the one idle longest first), else a refusal while
    /// fewer than [`MAX_REFUSING`] are being refused, else nothing for now.
    fn make_room(&mut self, ops: &mut EventOps) -> Room {
        if self.serving() < MAX_CONNECTIONS {
            return Room::Serve;
        }
        let mut idle: Vec<(Instant, u32)> = self
            .open
            .iter()
            .filter(|(_, c)| c.conn.is_idle() && !c.retiring)
            .map(|(token, c)| (c.conn.since(), *token))
            .collect();
        idle.sort_unstable();
        for (_, token) in idle {
            if self.retire(token, ops) {
                tracing::debug!("API socket full: idle connection {token} closed for a new one");
                return Room::Serve;
            }
        }
        let refusing = self.open.len() - self.serving();
        if refusing < MAX_REFUSING {
            Room::Refuse
        } else {
            Room::None
        }
    }

    /// Closes the idle connection `token` unless its client has sent something: its reading is
    /// shut down first (from then on the client's writes fail), then its queue looked at. One
    /// with bytes is kept, served to its end and closed then. Returns whether it was closed.
    fn retire(&mut self, token: u32, ops: &mut EventOps) -> bool {
        let Some(client) = self.open.get_mut(&token) else {
            return false;
        };
        if let Err(e) = client.stream.shutdown(Shutdown::Read) {
            tracing::debug!("API connection {token}: {e}");
        }
        match peek::receive_queue(&client.stream) {
            Ok(Queue::Data) => {
                client.retiring = true;
                false
            }
            Ok(Queue::Empty | Queue::Closed) | Err(_) => {
                self.close(token, ops);
                true
            }
        }
    }

    /// Serves `token` after epoll reported `set` for it; returns lull's exit status if a
    /// request asked lull to end.
    fn ready(
        &mut self,
        token: u32,
        set: EventSet,
        ops: &mut EventOps,
        signal: &mut StopSignal,
        controller: &mut Controller,
    ) -> Option<i32> {
        let client = self.open.get_mut(&token)?;
        let readable = set.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::ERROR);
        if readable && client.watching == EventSet::IN {
            match scm::recv_with_fds(&client.stream, &mut self.chunk) {
                Ok((0, _)) => client.conn.end_of_stream(),
                Ok((n, received)) => {
                    client.conn.received(&self.chunk[..n]);
                    client.fds.add(received);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => {
                    tracing::debug!("API connection {token}: {e}");
                    self.close(token, ops);
                    return None;
                }
            }
        }
        self.drive(token, ops, signal, controller)
    }

    /// Runs `token`'s state machine as far as it goes without waiting.
    fn drive(
        &mut self,
        token: u32,
        ops: &mut EventOps,
        signal: &mut StopSignal,
        controller: &mut Controller,
    ) -> Option<i32> {
        let client = self.open.get_mut(&token)?;
        let want = loop {
            match client.conn.step() {
                Step::Answer(request) => {
                    let fds = std::mem::take(&mut client.fds);
                    let (response, next) = handle(request, fds, controller);
                    if controller.take_run_ended() {
                        // Before the answer: a signal sent after it must reach the server.
                        if let Err(e) = signal.reinstall(ops) {
                            tracing::error!("{e}");
                            return Some(crate::exit_code::VMM_FAILURE);
                        }
                    }
                    client.conn.answer(&response);
                    if let Next::Exit(code) = next {
                        // lull ends: one attempt at the answer (a few bytes, the socket takes
                        // them), no waiting for a client that does not read.
                        if let Err(e) = client.stream.write_all(client.conn.output()) {
                            tracing::debug!("API client gone before its answer: {e}");
                        }
                        return Some(code);
                    }
                }
                Step::Write => match client.stream.write(client.conn.output()) {
                    Ok(n) => client.conn.wrote(n, Instant::now()),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break EventSet::OUT,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::debug!("API client gone before its answer: {e}");
                        break EventSet::empty();
                    }
                },
                Step::Read => break EventSet::IN,
                Step::Close => break EventSet::empty(),
            }
        };
        if want.is_empty() {
            self.close(token, ops);
        } else if want != client.watching {
            client.watching = want;
            let modified = ops.modify(Events::with_data(&client.stream, token, want));
            if let Err(e) = modified.map_err(epoll("the API epoll set")) {
                tracing::warn!("API connection {token}: {e}");
                self.close(token, ops);
            }
        }
        None
    }

    /// The nearest connection deadline, as an epoll timeout in ms (-1: none).
    fn timeout_ms(&self, now: Instant) -> i32 {
        self.open
            .values()
            .map(|c| c.conn.deadline())
            .min()
            .map_or(-1, |deadline| {
                let left = deadline.saturating_duration_since(now) + Duration::from_micros(999);
                i32::try_from(left.as_millis()).unwrap_or(i32::MAX)
            })
    }

    /// Expires every connection past its deadline.
    fn expire(
        &mut self,
        now: Instant,
        ops: &mut EventOps,
        signal: &mut StopSignal,
        controller: &mut Controller,
    ) {
        let due: Vec<u32> = self
            .open
            .iter()
            .filter(|(_, c)| c.conn.deadline() <= now)
            .map(|(token, _)| *token)
            .collect();
        for token in due {
            let Some(client) = self.open.get(&token) else {
                continue;
            };
            if client.conn.awaits_request() {
                // The idle timeout: closed now, or, if its client sent something at the last
                // moment, served (its bytes are read at the next wait).
                if !client.retiring {
                    self.retire(token, ops);
                }
                continue;
            }
            if let Some(client) = self.open.get_mut(&token) {
                client.conn.expire();
                // An expired connection hands out no request, so `drive` cannot end lull.
                let _ = self.drive(token, ops, signal, controller);
            }
        }
    }
}

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

/// Routes and answers one request (and the fds sent with it).
fn handle(request: http::Request, fds: SentFds, controller: &mut Controller) -> (Response, Next) {
    tracing::debug!(method = request.method, path = request.path, "API request");
    match routes::route(&request) {
        Ok(request) => controller.handle_with_fds(request, fds),
        Err(e) => {
            tracing::debug!("API request refused: {e}");
            (Response::error(&e), Next::Serve)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens are the `u32` of an event's data: past `u32::MAX` they start again, skipping the
    /// three fixed ones and any still in use.
    #[test]
    fn tokens_wrap_around_and_skip_the_ones_in_use() {
        let mut clients = Clients::new();
        let (stream, _peer) = UnixStream::pair().unwrap();
        clients.open.insert(
            FIRST_CLIENT,
            Client {
                stream,
                conn: Conn::new(Instant::now()),
                watching: EventSet::IN,
                fds: SentFds::default(),
                retiring: false,
            },
        );
        clients.next_token = u32::MAX;
        assert_eq!(clients.new_token(), u32::MAX);
        assert_eq!(clients.new_token(), FIRST_CLIENT + 1);
        assert_eq!(clients.new_token(), FIRST_CLIENT + 2);
    }
}
