//! The `api` target: arbitrary bytes as what one client sends on a management API connection
//! (one request, or several pipelined), through the connection state machine
//! (`vmm::api::conn::Conn`: incremental framing over `vmm::api::http`, keep-alive, limits)
//! and the routes (`vmm::api::routes`).
//!
//! Checks: nothing panics; a request is refused only with a client-error status (4xx or 501,
//! never 500: nothing has run yet); a `vm.create` that routes carries a configuration that
//! validates; a prefix of the bytes parses to "need more" or to the same first request; the
//! connection does not depend on how the bytes arrive: fed in pieces cut at points taken from
//! the input itself, it hands out the same requests and writes the same answers as fed whole
//! (but for `100 Continue`, which only a request still missing its body gets); what it writes
//! is a sequence of well-formed HTTP/1.1 answers, each with the Content-Length of its body,
//! one per request handed out plus at most one refusal, the last of them the only one that
//! may say `Connection: close`; it hands out at most `MAX_REQUESTS` requests and none after
//! it closes. The bytes are also taken as a `vm.create` body (lull's configuration or Cloud
//! Hypervisor's `VmConfig`) and a `vm.add-net` body: a configuration that validates and names
//! no fd, or a client error.

use std::time::Instant;

use vmm::api::conn::{Conn, Step};
use vmm::api::http::{self, Request, Response};
use vmm::api::routes::{self, ApiRequest};
use vmm::api::ApiError;

const CONTINUE: &[u8] = b"HTTP/1.1 100 \r\n\r\n";

/// A refusal must be a client error.
fn check_refusal(e: &ApiError) {
    let status = e.status();
    assert!(
        (400..500).contains(&status) || status == 501,
        "a request was refused with {status}: {e}"
    );
}

/// What a connection did with the bytes it was fed.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    requests: Vec<Request>,
    /// Everything written, `100 Continue` taken out.
    written: Vec<u8>,
    closed: bool,
}

/// The answer a request gets here: its routing refusal, or 204 (the controller is not run).
fn answer_to(request: &Request) -> Response {
    match routes::route(request) {
        Ok(ApiRequest::VmCreate(cfg) | ApiRequest::VmCreateCh(cfg, _)) => {
            if let Err(e) = cfg.validate() {
                panic!("vm.create routed an invalid configuration ({e}): {cfg:?}");
            }
            Response::no_content()
        }
        Ok(_) => Response::no_content(),
        Err(e) => {
            check_refusal(&e);
            Response::error(&e)
        }
    }
}

/// Runs `conn` until it waits for bytes or closes, writing everything it queues.
fn drive(conn: &mut Conn, now: Instant, out: &mut Outcome) {
    loop {
        match conn.step() {
            Step::Answer(request) => {
                assert!(!out.closed, "a request after the connection closed");
                conn.answer(&answer_to(&request));
                out.requests.push(request);
            }
            Step::Write => {
                out.written.extend_from_slice(conn.output());
                let n = conn.output().len();
                conn.wrote(n, now);
            }
            Step::Read => return,
            Step::Close => {
                out.closed = true;
                return;
            }
        }
    }
}

/// Feeds `data` to a new connection in pieces of the sizes `cuts` gives, then ends the stream.
fn feed(data: &[u8], mut cuts: impl Iterator<Item = usize>) -> Outcome {
    let now = Instant::now();
    let mut conn = Conn::new(now);
    let mut out = Outcome {
        requests: Vec::new(),
        written: Vec::new(),
        closed: false,
    };
    let mut rest = data;
    while !rest.is_empty() && !out.closed {
        let n = cuts.next().unwrap_or(rest.len()).clamp(1, rest.len());
        conn.received(&rest[..n]);
        rest = &rest[n..];
        drive(&mut conn, now, &mut out);
    }
    conn.end_of_stream();
    drive(&mut conn, now, &mut out);
    assert!(
        out.closed,
        "a connection whose client hung up did not close"
    );
    out.written = strip_continue(&out.written);
    out
}

fn strip_continue(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.starts_with(CONTINUE) {
            rest = &rest[CONTINUE.len()..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    out
}

/// Splits `written` into answers, checking each is well-formed; returns their statuses and
/// whether each said `Connection: close`.
fn answers(written: &[u8]) -> Vec<(u16, bool)> {
    let mut out = Vec::new();
    let mut rest = written;
    while !rest.is_empty() {
        let end = rest
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an answer's head ends with a blank line")
            + 4;
        let head = std::str::from_utf8(&rest[..end]).expect("answer heads are UTF-8");
        // As Cloud Hypervisor's api_client (ch-remote) reads it: all of the status line after
        // the version, trimmed, is the number.
        let status: u16 = head
            .split('\r')
            .next()
            .and_then(|line| line.strip_prefix("HTTP/1.1 "))
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP/1.1 status line: {head}"));
        let length = head
            .split("\r\n")
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .map(|v| v.parse::<usize>().expect("a numeric Content-Length"));
        let length = match (status, length) {
            (204, None) => 0,
            (204, Some(_)) => panic!("a 204 with a body: {head}"),
            (_, Some(n)) => n,
            (_, None) => panic!("no Content-Length: {head}"),
        };
        let body = &rest[end..end + length];
        assert!(body.is_ascii(), "a body that is not ASCII: {body:?}");
        if status >= 400 {
            let messages: Vec<String> =
                serde_json::from_slice(body).expect("an error body is an array of messages");
            assert!(!messages.is_empty());
        }
        out.push((status, head.contains("\r\nConnection: close\r\n")));
        rest = &rest[end + length..];
    }
    out
}

/// Runs one input.
pub fn run(data: &[u8]) {
    // The first request, parsed whole and from prefixes.
    let whole = http::parse(data);
    if let Err(e) = &whole {
        check_refusal(e);
    }
    for cut in [data.len() / 3, data.len() / 2, data.len().saturating_sub(1)] {
        match (&whole, http::parse(&data[..cut])) {
            (Ok(Some(req)), Ok(Some(early))) => {
                assert_eq!(req, &early, "a prefix of {cut} bytes parsed differently");
            }
            (Ok(Some(_)), Err(e)) => {
                panic!("a prefix of {cut} bytes of a valid request is refused: {e}")
            }
            _ => {}
        }
    }
    // The connection, fed whole and in pieces sized by the input itself.
    let at_once = feed(data, std::iter::empty());
    let in_pieces = feed(data, data.iter().map(|b| usize::from(*b) + 1));
    assert_eq!(
        at_once, in_pieces,
        "the connection depends on how bytes arrive"
    );
    let bytewise = feed(data, std::iter::repeat(1));
    assert_eq!(
        at_once, bytewise,
        "the connection depends on how bytes arrive"
    );
    if let (Ok(Some(first)), Some(handed)) = (&whole, at_once.requests.first()) {
        assert_eq!(
            first, handed,
            "the connection's first request is not parse's"
        );
    }
    let answers = answers(&at_once.written);
    assert!(at_once.requests.len() <= http::MAX_REQUESTS as usize);
    assert!(
        answers.len() == at_once.requests.len() || answers.len() == at_once.requests.len() + 1,
        "{} answers to {} requests",
        answers.len(),
        at_once.requests.len()
    );
    if let Some((_, last_closes)) = answers.split_last() {
        assert!(
            last_closes.iter().all(|(_, close)| !close),
            "an answer before the last said Connection: close"
        );
    }
    // Routing of the first request alone.
    match routes::decode(data) {
        Ok(Some(ApiRequest::VmCreate(cfg) | ApiRequest::VmCreateCh(cfg, _))) => {
            assert!(cfg.validate().is_ok())
        }
        Ok(_) => {}
        Err(e) => check_refusal(&e),
    }
    bodies(data);
}

/// `data` as the body of `vm.create` (lull's configuration or Cloud Hypervisor's
/// `VmConfig`) and of `vm.add-net`: routed to a configuration that validates, or refused with
/// a client error whose messages are not empty. A JSON object with one of Cloud Hypervisor's
/// fields goes through its mapping (`config::ch::json`), which must agree with the route.
fn bodies(data: &[u8]) {
    for endpoint in ["vm.create", "vm.add-net"] {
        let request = Request {
            method: "PUT".into(),
            path: format!("{}{endpoint}", routes::ROOT),
            body: data.to_vec(),
        };
        match routes::route(&request) {
            Ok(ApiRequest::VmCreate(cfg) | ApiRequest::VmCreateCh(cfg, _)) => {
                assert!(
                    cfg.validate().is_ok(),
                    "{endpoint} routed an invalid {cfg:?}"
                )
            }
            Ok(ApiRequest::VmAddNet(net)) => {
                if let Some(tap) = &net.tap {
                    assert!(!tap.is_empty(), "vm.add-net routed an empty tap name");
                }
            }
            Ok(other) => panic!("{endpoint} routed to {other:?}"),
            Err(e) => {
                check_refusal(&e);
                assert!(e.messages().iter().all(|m| !m.is_empty()));
            }
        }
    }
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(data) {
        if vmm::config::ch::json::is_ch_shape(&fields) {
            if let Ok((cfg, _)) = vmm::config::ch::json::to_config(&fields) {
                assert!(cfg.validate().is_ok());
                assert!(
                    cfg.nets.iter().all(|n| n.fd.is_none()),
                    "a body named an fd"
                );
            }
        }
    }
}
