//! One client connection of the API server as a state machine: bytes in, requests out,
//! answers queued, deadlines kept. It does no I/O and reads no clock (the server passes the
//! time), so the `api` fuzz target and the tests drive it exactly as the server does.
//!
//! ```text
//!            accept (since = now)
//!               │
//!   ┌──────► Reading ── a whole request ──► Answering ── answer() ──► Writing
//!   │           │  (incomplete: wait for bytes     (the server routes      │ wrote() until
//!   │           │   until since + REQUEST_TIMEOUT)  and handles it)        │ nothing is left
//!   │           ├─ deadline, nothing begun ─► Closed (idle timeout)        │
//!   │           ├─ deadline, half a request ─► 408, Connection: close      │
//!   │           ├─ framing error (400/413/431/501) ─► its answer, close    │
//!   │           └─ end of stream ─► Closed (after answering whole requests)│
//!   └──── keep-alive: since = now; the next (maybe already buffered) request
//!         close (asked for, HTTP/1.0, MAX_REQUESTS reached, an error) ─► Closed
//! ```
//!
//! A connection accepted while the server is full is a *refusing* one ([`Conn::refusing`]): it
//! reads its client's request as any other (so that closing it resets nothing the client
//! sent) and answers it 503 ("too many connections"), `Connection: close`, without handing it
//! out: the request is not carried out.
//!
//! Bounds: the input buffer holds at most one partial request (a head up to
//! [`http::MAX_HEAD`], a body up to [`http::MAX_BODY`]) plus what one read brings; no request
//! is read while an answer waits to be written (pipelined requests wait in the socket), so a
//! client that does not read its answers only stalls itself.

use std::time::Instant;

use super::error::ApiError;
use super::http::{self, Framing, Request, Response};

/// What the connection needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Bytes from the client ([`Conn::received`] or [`Conn::end_of_stream`]).
    Read,
    /// This request answered ([`Conn::answer`]).
    Answer(Request),
    /// Its queued bytes written ([`Conn::output`], [`Conn::wrote`]).
    Write,
    /// To be closed: nothing more to read or write.
    Close,
}

/// Where the connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a request.
    Reading,
    /// A request was handed out; its answer is due.
    Answering,
    /// An answer is being written.
    Writing,
    /// Done.
    Closed,
}

/// One client connection.
#[derive(Debug)]
pub struct Conn {
    phase: Phase,
    /// Bytes received and not yet part of a handed-out request.
    input: Vec<u8>,
    /// Answer bytes not yet written.
    output: Vec<u8>,
    /// Close once `output` is written.
    close_after: bool,
    /// When the connection became ready for its current request.
    since: Instant,
    /// Requests handed out.
    requests: u32,
    /// The client has stopped sending.
    eof: bool,
    /// `100 Continue` was sent for the current request.
    continued: bool,
    /// The handed-out request asked for the connection to close after its answer.
    close_asked: bool,
    /// The server was full when this connection came: its request is answered 503, not
    /// handed out.
    refuse: bool,
}

impl Conn {
    /// A connection accepted at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            phase: Phase::Reading,
            input: Vec::new(),
            output: Vec::new(),
            close_after: false,
            since: now,
            requests: 0,
            eof: false,
            continued: false,
            close_asked: false,
            refuse: false,
        }
    }

    /// A connection accepted at `now` while the server is full: its request is read whole
    /// and answered 503 ([`ApiError::TooManyConnections`]), never handed out.
    pub fn refusing(now: Instant) -> Self {
        Self {
            refuse: true,
            ..Self::new(now)
        }
    }

    /// Whether this connection refuses its request ([`Conn::refusing`]).
    pub fn is_refusing(&self) -> bool {
        self.refuse
    }

    /// Bytes the client sent.
    pub fn received(&mut self, bytes: &[u8]) {
        if self.phase != Phase::Closed && !self.eof {
            self.input.extend_from_slice(bytes);
        }
    }

    /// The client sent its last byte (a read returned 0): whole requests already received are
    /// still answered.
    pub fn end_of_stream(&mut self) {
        self.eof = true;
    }

    /// What to do next; call after every event until it says [`Step::Read`] or [`Step::Close`]
    /// (or [`Step::Write`] and the socket is full).
    pub fn step(&mut self) -> Step {
        loop {
            match self.phase {
                Phase::Closed => return Step::Close,
                // The handed-out request has no answer yet: nothing to do until it has.
                Phase::Answering => return Step::Read,
                Phase::Writing if !self.output.is_empty() => return Step::Write,
                Phase::Writing if self.close_after => self.phase = Phase::Closed,
                Phase::Writing => self.phase = Phase::Reading,
                Phase::Reading => return self.frame(),
            }
        }
    }

    /// Frames the buffered input while reading.
    fn frame(&mut self) -> Step {
        match http::parse_next(&self.input) {
            Ok(Framing::Complete(parsed)) if self.refuse => {
                self.input.drain(..parsed.len);
                tracing::debug!("API request refused: {}", ApiError::TooManyConnections);
                self.queue(&Response::error(&ApiError::TooManyConnections), true);
                Step::Write
            }
            Ok(Framing::NeedBody {
                expect_continue: true,
            }) if self.refuse => {
                // The client waits for a word before it sends its body: this one is final.
                self.queue(&Response::error(&ApiError::TooManyConnections), true);
                Step::Write
            }
            Ok(Framing::Complete(parsed)) => {
                self.input.drain(..parsed.len);
                self.requests += 1;
                self.continued = false;
                self.close_asked = parsed.close;
                self.phase = Phase::Answering;
                Step::Answer(parsed.request)
            }
            Ok(Framing::NeedBody { expect_continue }) if expect_continue && !self.continued => {
                self.continued = true;
                self.output
                    .extend_from_slice(format!("{}\r\n", http::status_line(100)).as_bytes());
                self.phase = Phase::Writing;
                Step::Write
            }
            Ok(Framing::NeedHead | Framing::NeedBody { .. }) if self.eof => {
                // The client hung up: a partial request is dropped unanswered.
                self.phase = Phase::Closed;
                Step::Close
            }
            Ok(Framing::NeedHead | Framing::NeedBody { .. }) => Step::Read,
            Err(e) => {
                // The framing is lost (or the body is not to be read): answer and close.
                tracing::debug!("API request refused: {e}");
                self.queue(&Response::error(&e), true);
                Step::Write
            }
        }
    }

    /// Queues the answer to the request [`Conn::step`] handed out; the connection persists
    /// after it unless the request asked to close or was the last one allowed.
    pub fn answer(&mut self, response: &Response) {
        if self.phase != Phase::Answering {
            return;
        }
        let close = self.close_asked || self.requests >= http::MAX_REQUESTS;
        self.queue(response, close);
    }

    fn queue(&mut self, response: &Response, close: bool) {
        self.output.extend_from_slice(&response.to_bytes(close));
        self.close_after = close;
        self.phase = Phase::Writing;
    }

    /// The bytes waiting to be written.
    pub fn output(&self) -> &[u8] {
        &self.output
    }

    /// `n` bytes of [`Conn::output`] were written at `now`; once an answer is written whole,
    /// the time for the next request counts from `now`.
    pub fn wrote(&mut self, n: usize, now: Instant) {
        self.output.drain(..n.min(self.output.len()));
        if self.output.is_empty() && self.phase == Phase::Writing && !self.continued {
            self.since = now;
        }
    }

    /// When the connection's current wait ends (see [`http::REQUEST_TIMEOUT`]).
    pub fn deadline(&self) -> Instant {
        self.since + http::REQUEST_TIMEOUT
    }

    /// The deadline passed: a connection with half a request is answered 408 and closes;
    /// one waiting for a request, or whose client does not read its answer, closes.
    pub fn expire(&mut self) {
        match self.phase {
            Phase::Reading if !self.input.is_empty() => {
                tracing::debug!("API request refused: {}", ApiError::Timeout);
                self.queue(&Response::error(&ApiError::Timeout), true);
                // The 408 gets one more REQUEST_TIMEOUT to be written, then the connection goes.
                self.since = self.deadline();
                self.input.clear();
                self.eof = true;
            }
            Phase::Answering => {}
            Phase::Reading | Phase::Writing | Phase::Closed => self.phase = Phase::Closed,
        }
    }

    /// Nothing begun: no request bytes buffered, nothing to write, none being answered. Only
    /// such a connection may be closed to make room when the server is full, and only once the
    /// server has made sure its client sent nothing meanwhile (`Clients::retire` in the
    /// server); a refusing connection is never idle (it is there to answer).
    pub fn is_idle(&self) -> bool {
        self.awaits_request() && !self.refuse
    }

    /// Waiting for a request of which nothing has come yet, its client still there (an idle
    /// connection, or a refusing one before its request).
    pub fn awaits_request(&self) -> bool {
        self.phase == Phase::Reading && self.input.is_empty() && !self.eof
    }

    /// Since when the connection waits for its current request (accept or the last answer).
    pub fn since(&self) -> Instant {
        self.since
    }

    /// Requests handed out so far.
    pub fn requests(&self) -> u32 {
        self.requests
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const PING: &[u8] = b"GET /api/v1/vmm.ping HTTP/1.1\r\nHost: l\r\n\r\n";

    /// Drives `conn` as the server does, answering every request 204 and writing everything;
    /// returns the requests' paths and the bytes written.
    fn drive(conn: &mut Conn, now: Instant) -> (Vec<String>, Vec<u8>) {
        let mut paths = Vec::new();
        let mut written = Vec::new();
        loop {
            match conn.step() {
                Step::Answer(req) => {
                    paths.push(req.path);
                    conn.answer(&Response::no_content());
                }
                Step::Write => {
                    written.extend_from_slice(conn.output());
                    let n = conn.output().len();
                    conn.wrote(n, now);
                }
                Step::Read | Step::Close => return (paths, written),
            }
        }
    }

    fn statuses(written: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(written)
            .split("\r\n\r\n")
            .filter_map(|part| part.strip_prefix("HTTP/1.1 "))
            .map(|s| s[..3].to_string())
            .collect()
    }

    #[test]
    fn pipelined_requests_are_answered_in_order_on_one_connection() {
        let now = Instant::now();
        let mut conn = Conn::new(now);
        let mut bytes = PING.to_vec();
        bytes.extend_from_slice(b"GET /api/v1/vm.info HTTP/1.1\r\n\r\nGET /api/v1/vm.b");
        conn.received(&bytes);
        let (paths, written) = drive(&mut conn, now);
        assert_eq!(paths, ["/api/v1/vmm.ping", "/api/v1/vm.info"]);
        assert_eq!(statuses(&written), ["204", "204"]);
        assert!(!String::from_utf8_lossy(&written).contains("Connection: close"));
        assert_eq!(conn.step(), Step::Read);
        conn.received(b"oot HTTP/1.1\r\nConnection: close\r\n\r\n");
        let (paths, written) = drive(&mut conn, now);
        assert_eq!(paths, ["/api/v1/vm.boot"]);
        assert!(String::from_utf8_lossy(&written).contains("\r\nConnection: close\r\n"));
        assert_eq!(conn.step(), Step::Close);
        assert_eq!(conn.requests(), 3);
    }

    #[test]
    fn http_1_0_and_the_request_cap_close_the_connection() {
        let now = Instant::now();
        let mut conn = Conn::new(now);
        conn.received(b"GET /api/v1/vmm.ping HTTP/1.0\r\n\r\n");
        drive(&mut conn, now);
        assert_eq!(conn.step(), Step::Close);
        let mut conn = Conn::new(now);
        conn.received(&PING.repeat(http::MAX_REQUESTS as usize + 5));
        let (paths, written) = drive(&mut conn, now);
        assert_eq!(paths.len(), http::MAX_REQUESTS as usize);
        let text = String::from_utf8_lossy(&written);
        assert_eq!(text.matches("Connection: close").count(), 1);
        assert_eq!(conn.step(), Step::Close);
    }

    #[test]
    fn an_oversized_body_is_refused_before_it_is_read() {
        let now = Instant::now();
        let mut conn = Conn::new(now);
        let head = format!(
            "PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            2 << 20
        );
        conn.received(head.as_bytes());
        let (paths, written) = drive(&mut conn, now);
        assert!(paths.is_empty());
        assert_eq!(statuses(&written), ["413"]);
        assert_eq!(conn.step(), Step::Close);
    }

    #[test]
    fn deadlines_close_idle_connections_and_answer_half_requests_408() {
        let start = Instant::now();
        let later = start + Duration::from_secs(1);
        let mut idle = Conn::new(start);
        idle.received(PING);
        drive(&mut idle, later);
        assert!(idle.is_idle());
        assert_eq!(idle.deadline(), later + http::REQUEST_TIMEOUT);
        idle.expire();
        assert_eq!(idle.step(), Step::Close);
        let mut half = Conn::new(start);
        half.received(&PING[..10]);
        assert_eq!(half.step(), Step::Read);
        assert!(!half.is_idle());
        half.expire();
        let (_, written) = drive(&mut half, later);
        assert_eq!(statuses(&written), ["408"]);
        assert_eq!(half.step(), Step::Close);
    }

    #[test]
    fn a_client_that_hangs_up_still_gets_its_whole_requests_answered() {
        let now = Instant::now();
        let mut conn = Conn::new(now);
        conn.received(PING);
        conn.received(&PING[..5]);
        conn.end_of_stream();
        let (paths, _) = drive(&mut conn, now);
        assert_eq!(paths.len(), 1);
        assert_eq!(conn.step(), Step::Close);
    }

    /// ch-remote (Cloud Hypervisor's `api_client::simple_api_full_command_with_fds_and_response`,
    /// cloud-hypervisor/api_client/src/lib.rs) writes a request in pieces: the request line with
    /// `Host` and `Accept` (with the fds, if any), then `Content-Length: N` if it has a body,
    /// the blank line, the body. No Content-Type. Go's client (the Nomad drivers) reuses the
    /// connection for the next request.
    #[test]
    fn requests_written_in_pieces_as_ch_remote_does_are_served_on_one_connection() {
        let now = Instant::now();
        let mut conn = Conn::new(now);
        let body = r#"{"cpus":{"boot_vcpus":1,"max_vcpus":1}}"#;
        let pieces: [&[u8]; 4] = [
            b"PUT /api/v1/vm.create HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n",
            format!("Content-Length: {}\r\n", body.len())
                .leak()
                .as_bytes(),
            b"\r\n",
            body.as_bytes(),
        ];
        let mut paths = Vec::new();
        for piece in pieces {
            conn.received(piece);
            paths.extend(drive(&mut conn, now).0);
        }
        assert_eq!(paths, ["/api/v1/vm.create"]);
        for piece in [
            &b"PUT /api/v1/vm.boot HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n"[..],
            b"\r\n",
        ] {
            conn.received(piece);
            paths.extend(drive(&mut conn, now).0);
        }
        assert_eq!(paths, ["/api/v1/vm.create", "/api/v1/vm.boot"]);
        assert_eq!(conn.step(), Step::Read);
    }

    #[test]
    fn a_refusing_connection_reads_its_request_and_answers_503_without_handing_it_out() {
        let now = Instant::now();
        let mut conn = Conn::refusing(now);
        assert!(conn.is_refusing());
        assert!(!conn.is_idle());
        conn.received(b"PUT /api/v1/vm.pause HTTP/1.1\r\n");
        assert_eq!(conn.step(), Step::Read);
        conn.received(b"Host: l\r\n\r\n");
        let (paths, written) = drive(&mut conn, now);
        assert!(paths.is_empty(), "handed out {paths:?}");
        assert_eq!(statuses(&written), ["503"]);
        let text = String::from_utf8_lossy(&written);
        assert!(text.contains("Connection: close"), "{text}");
        assert!(text.contains("too many connections"), "{text}");
        assert_eq!(conn.step(), Step::Close);
        let mut waiting = Conn::refusing(now);
        waiting.received(b"PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: 2\r\n");
        waiting.received(b"Expect: 100-continue\r\n\r\n");
        let (paths, written) = drive(&mut waiting, now);
        assert!(paths.is_empty());
        assert_eq!(statuses(&written), ["503"]);
        assert_eq!(waiting.step(), Step::Close);
    }

    #[test]
    fn only_a_connection_with_nothing_begun_is_idle() {
        let now = Instant::now();
        let mut conn = Conn::new(now);
        assert!(conn.is_idle());
        conn.received(&PING[..4]);
        assert!(!conn.is_idle());
        conn.received(&PING[4..]);
        match conn.step() {
            Step::Answer(_) => {}
            other => panic!("{other:?}"),
        }
        assert!(!conn.is_idle(), "a request being answered is not idle");
        conn.answer(&Response::no_content());
        assert!(!conn.is_idle(), "an answer not yet written is not idle");
        drive(&mut conn, now);
        assert!(conn.is_idle());
        conn.end_of_stream();
        assert!(!conn.is_idle(), "a client gone is closed, not evicted");
    }

    #[test]
    fn continue_is_sent_once_before_the_body() {
        let now = Instant::now();
        let mut conn = Conn::new(now);
        conn.received(b"PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: 2\r\n");
        conn.received(b"Expect: 100-continue\r\n\r\n");
        let (paths, written) = drive(&mut conn, now);
        assert!(paths.is_empty());
        assert_eq!(written, b"HTTP/1.1 100 \r\n\r\n");
        conn.received(b"{}");
        let (paths, written) = drive(&mut conn, now);
        assert_eq!(paths, ["/api/v1/vm.create"]);
        assert_eq!(statuses(&written), ["204"]);
    }
}
