//! The API server's connections: accepted while there is room, read, driven through their
//! [`Conn`] state machines (requests handed to the controller, answers written), expired at
//! their deadlines; each in the server's epoll set under its token (see `watch`).
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

use std::collections::BTreeMap;
use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use event_manager::{EventOps, EventSet, Events};

use super::conn::{Conn, Step};
use super::controller::{Controller, Next};
use super::error::ApiError;
use super::http::{self, Response};
use super::limits::{MAX_CONNECTIONS, MAX_REFUSING};
use super::routes;
use super::watch::{epoll, unwatch, watch, StopSignal, FIRST_CLIENT, LISTENER};
use crate::host::sys::peek::{self, Queue};
use crate::host::sys::scm::{self, SentFds};

/// Most bytes read from one connection per readiness event (a 1 MiB body takes 16), so that
/// one busy client cannot hold the loop.
const READ_CHUNK: usize = 64 * 1024;

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
pub(super) struct Clients {
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
    /// No connection yet, the listener watched.
    pub(super) fn new() -> Self {
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
    pub(super) fn accept_all(&mut self, listener: &UnixListener, ops: &mut EventOps) {
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
    pub(super) fn listen_again(&mut self, listener: &UnixListener, ops: &mut EventOps) {
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
    pub(super) fn ready(
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
    pub(super) fn timeout_ms(&self, now: Instant) -> i32 {
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
    pub(super) fn expire(
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
