//! The `api` target: arbitrary bytes as one request on the management API socket, through
//! the HTTP framing (`vmm::api::http`) and the routes (`vmm::api::routes`).
//!
//! Checks: nothing panics; a request is refused only with a client-error status (4xx or 501,
//! never 500: nothing has run yet); a `vm.create` that routes carries a configuration that
//! validates; the request does not depend on how the bytes arrive (a prefix parses to "need
//! more" or to the same request, and `read_request` over the bytes cut in pieces gives what
//! `parse` gives on them whole, or "hung up" where they end early); every error answer is a
//! well-formed HTTP/1.1 response whose Content-Length is its body's.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use vmm::api::http::{self, Request, Response};
use vmm::api::routes::{self, ApiRequest};
use vmm::api::ApiError;

/// A connection that hands out the input in pieces and swallows what is written to it.
struct Pieces<'a> {
    rest: &'a [u8],
    cuts: std::slice::Iter<'a, u8>,
    written: Vec<u8>,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = self
            .cuts
            .next()
            .map_or(self.rest.len(), |c| usize::from(*c) + 1);
        let n = want.min(buf.len()).min(self.rest.len());
        buf[..n].copy_from_slice(&self.rest[..n]);
        self.rest = &self.rest[n..];
        Ok(n)
    }
}

impl Write for Pieces<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The answer to a refused request must be HTTP/1.1 with a body of the length it announces.
fn check_error_answer(e: &ApiError) {
    let status = e.status();
    assert!(
        (400..500).contains(&status) || status == 501,
        "a request was refused with {status}: {e}"
    );
    let bytes = Response::error(e).to_bytes();
    let text = String::from_utf8(bytes).expect("responses are UTF-8");
    assert!(text.starts_with(&format!("HTTP/1.1 {status} ")), "{text}");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    assert!(
        head.contains(&format!("\r\nContent-Length: {}", body.len())),
        "{text}"
    );
    let messages: Vec<String> = serde_json::from_str(body).expect("an array of messages");
    assert!(!messages.is_empty());
}

fn same_outcome(a: &Result<Option<Request>, ApiError>, b: &Result<Option<Request>, ApiError>) {
    match (a, b) {
        (Ok(x), Ok(y)) => assert_eq!(x, y),
        (Err(x), Err(y)) => assert_eq!(x.status(), y.status(), "{x} / {y}"),
        _ => panic!("outcomes differ: {a:?} / {b:?}"),
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let whole = http::parse(data);
    if let Err(e) = &whole {
        check_error_answer(e);
    }
    // A prefix is either incomplete or already the same request.
    for cut in [data.len() / 3, data.len() / 2, data.len().saturating_sub(1)] {
        if let (Ok(Some(req)), Ok(Some(early))) = (&whole, http::parse(&data[..cut])) {
            assert_eq!(req, &early, "a prefix of {cut} bytes parsed differently");
        } else if let (Ok(Some(_)), Err(e)) = (&whole, http::parse(&data[..cut])) {
            panic!("a prefix of {cut} bytes of a valid request is refused: {e}");
        }
    }
    // The same bytes through a connection, in pieces sized by the input itself.
    let mut conn = Pieces {
        rest: data,
        cuts: data.iter(),
        written: Vec::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(3600);
    let read = http::read_request(&mut conn, deadline, |_, _| Ok(()));
    match (&whole, read) {
        (Ok(None), Err(ApiError::HungUp)) => {}
        (_, read) => same_outcome(&whole, &read.map(Some)),
    }
    assert!(
        conn.written.is_empty() || conn.written == b"HTTP/1.1 100 Continue\r\n\r\n",
        "only 100 Continue is written while reading: {:?}",
        conn.written
    );
    // Routing.
    match routes::decode(data) {
        Ok(Some(ApiRequest::VmCreate(cfg))) => {
            if let Err(e) = cfg.validate() {
                panic!("vm.create routed an invalid configuration ({e}): {cfg:?}");
            }
        }
        Ok(_) => {}
        Err(e) => check_error_answer(&e),
    }
}
