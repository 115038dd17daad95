//! The API server: the socket and the loop that serves it on lull's main thread.
//!
//! One thread multiplexes every client with epoll over non-blocking sockets; each connection
//! is a [`Conn`] state machine (incremental HTTP framing, keep-alive, deadlines), so a client
//! that sends half a request, or never reads its answer, holds only its own connection:
//!
//! ```text
//!   epoll_wait(timeout = the nearest connection deadline)
//!     ├─ listener readable ─► accept while there is room (see below) ─► Conn, watch IN
//!     ├─ client readable   ─► one read ─► Conn: requests ─► routes ─► Controller ─► answers
//!     ├─ client writable   ─► write what is queued (watch OUT only while something is)
//!     ├─ VM-ended eventfd  ─► the controller takes note; the server takes the signals back
//!     └─ SIGINT/TERM/HUP  ─► stop the VM if it runs, end lull
//!   then every connection past its deadline: 408 or closed (see `http::REQUEST_TIMEOUT`)
//! ```
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
//! client that signals lull after the answer is heard.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
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

const LISTENER: u64 = 0;
const VM_ENDED: u64 = 1;
const SIGNAL: u64 = 2;
/// Tokens from here on are connections.
const FIRST_CLIENT: u64 = 3;

fn host(what: &'static str) -> impl Fn(std::io::Error) -> ApiError {
    move |source| ApiError::Host { what, source }
}

/// The server's epoll set.
struct Events {
    epoll: Epoll,
    /// The eventfd the stop signals write while the server (not a VM) has the handlers.
    signal: EventFd,
}

impl Events {
    fn control(
        &self,
        op: ControlOperation,
        fd: &impl AsRawFd,
        set: EventSet,
        token: u64,
    ) -> Result<(), ApiError> {
        self.epoll
            .ctl(op, fd.as_raw_fd(), EpollEvent::new(set, token))
            .map_err(host("the API epoll set"))
    }

    fn watch(&self, fd: &impl AsRawFd, token: u64) -> Result<(), ApiError> {
        self.control(ControlOperation::Add, fd, EventSet::IN, token)
    }

    /// Takes the stop-signal handlers back from a VM whose run has ended.
    fn reinstall_signals(&mut self) -> Result<(), ApiError> {
        let signal = stop_signals::install().map_err(host("the stop-signal handlers"))?;
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            self.signal.as_raw_fd(),
            EpollEvent::default(),
        );
        self.signal = signal;
        self.watch(&self.signal, SIGNAL)
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

/// The open connections, by epoll token.
struct Clients {
    open: BTreeMap<u64, Client>,
    next_token: u64,
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
    fn accept_all(&mut self, listener: &UnixListener, events: &Events) {
        loop {
            if !self.has_room() {
                self.pause_listening(listener, events);
                return;
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    // Room is made only for a connection that came: none closed for nothing.
                    // Idle ones found holding bytes after all leave none: refused then (a
                    // few more than MAX_REFUSING at most, as each is looked at once).
                    let room = match self.make_room() {
                        Room::None => Room::Refuse,
                        room => room,
                    };
                    if let Err(e) = self.add(stream, room, events) {
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

    fn pause_listening(&mut self, listener: &UnixListener, events: &Events) {
        if !self.listening {
            return;
        }
        tracing::debug!("API socket full: new connections wait in the backlog");
        let op = ControlOperation::Delete;
        if events.control(op, listener, EventSet::IN, LISTENER).is_ok() {
            self.listening = false;
        }
    }

    /// Puts the listener back in the epoll set once there is room again (a connection closed,
    /// or one went idle).
    fn listen_again(&mut self, listener: &UnixListener, events: &Events) {
        if self.listening || !self.has_room() {
            return;
        }
        match events.watch(listener, LISTENER) {
            Ok(()) => self.listening = true,
            Err(e) => tracing::warn!("API socket: {e}"),
        }
    }

    fn add(&mut self, stream: UnixStream, room: Room, events: &Events) -> Result<(), ApiError> {
        stream.set_nonblocking(true).map_err(ApiError::Connection)?;
        let token = self.next_token;
        self.next_token += 1;
        events.control(ControlOperation::Add, &stream, EventSet::IN, token)?;
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

    /// Whether a new connection can get anything ([`Clients::make_room`] without its effects).
    fn has_room(&self) -> bool {
        self.serving() < MAX_CONNECTIONS
            || self.open.len() - self.serving() < MAX_REFUSING
            || self.open.values().any(|c| c.conn.is_idle() && !c.retiring)
    }

    /// What a new connection gets: service while fewer than [`MAX_CONNECTIONS`] are served or
    /// an idle one can be closed for it (the one idle longest first), else a refusal while
    /// fewer than [`MAX_REFUSING`] are being refused, else nothing for now.
    fn make_room(&mut self) -> Room {
        if self.serving() < MAX_CONNECTIONS {
            return Room::Serve;
        }
        let mut idle: Vec<(Instant, u64)> = self
            .open
            .iter()
            .filter(|(_, c)| c.conn.is_idle() && !c.retiring)
            .map(|(token, c)| (c.conn.since(), *token))
            .collect();
        idle.sort_unstable();
        for (_, token) in idle {
            if self.retire(token) {
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
    fn retire(&mut self, token: u64) -> bool {
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
                // Closing the socket takes it out of the epoll set.
                self.open.remove(&token);
                true
            }
        }
    }

    /// Serves `token` after epoll reported `set` for it; returns lull's exit status if a
    /// request asked lull to end.
    fn ready(
        &mut self,
        token: u64,
        set: EventSet,
        events: &mut Events,
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
                    self.open.remove(&token);
                    return None;
                }
            }
        }
        self.drive(token, events, controller)
    }

    /// Runs `token`'s state machine as far as it goes without waiting.
    fn drive(
        &mut self,
        token: u64,
        events: &mut Events,
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
                        if let Err(e) = events.reinstall_signals() {
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
            self.open.remove(&token);
        } else if want != client.watching {
            client.watching = want;
            let op = ControlOperation::Modify;
            if let Err(e) = events.control(op, &client.stream, want, token) {
                tracing::warn!("API connection {token}: {e}");
                self.open.remove(&token);
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
    fn expire(&mut self, now: Instant, events: &mut Events, controller: &mut Controller) {
        let due: Vec<u64> = self
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
                    self.retire(token);
                }
                continue;
            }
            if let Some(client) = self.open.get_mut(&token) {
                client.conn.expire();
                // An expired connection hands out no request, so `drive` cannot end lull.
                let _ = self.drive(token, events, controller);
            }
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
    let mut controller = Controller::new(created, ended)
        .with_events(events)
        .with_ch_knobs(ch_knobs);
    let mut events = Events {
        epoll: Epoll::new().map_err(host("the API epoll set"))?,
        signal,
    };
    events.watch(&socket.listener, LISTENER)?;
    events.watch(controller.ended_event(), VM_ENDED)?;
    events.watch(&events.signal, SIGNAL)?;
    if let Some(filter) = &filter {
        seccomp::apply_api(filter).map_err(ApiError::Seccomp)?;
    }
    match start {
        Some(Start::Boot) => controller.boot_at_start()?,
        Some(Start::Restore(restore)) => controller.restore_at_start(&restore)?,
        None => {}
    }
    tracing::info!("management API on {}", socket.describe());
    let mut clients = Clients::new();
    let mut ready = vec![EpollEvent::default(); MAX_CONNECTIONS + MAX_REFUSING + 4];
    loop {
        let timeout = clients.timeout_ms(Instant::now());
        let n = match events.epoll.wait(timeout, &mut ready) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(host("the API event wait")(e)),
        };
        for event in &ready[..n] {
            let exit = match event.data() {
                LISTENER => {
                    clients.accept_all(&socket.listener, &events);
                    None
                }
                VM_ENDED => {
                    let _ = controller.ended_event().read();
                    let exit = controller.poll_vm();
                    if exit.is_none() && controller.take_run_ended() {
                        events.reinstall_signals()?;
                    }
                    exit
                }
                SIGNAL => {
                    let _ = events.signal.read();
                    let signal = stop_signals::last_signal().unwrap_or(libc::SIGTERM);
                    Some(controller.on_signal(signal))
                }
                token => clients.ready(token, event.event_set(), &mut events, &mut controller),
            };
            if let Some(code) = exit {
                controller.exiting();
                return Ok(code);
            }
        }
        clients.expire(Instant::now(), &mut events, &mut controller);
        clients.listen_again(&socket.listener, &events);
    }
}
