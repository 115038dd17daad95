//! HTTP/1.1 framing for the API socket: `httparse` parses a request head; this file finds
//! where the body ends (Content-Length only), whether the connection stays open after the
//! answer (`Connection: close`, HTTP/1.0), enforces the size limits, and encodes responses.
//!
//! [`parse_next`] is pure (bytes in; a complete request and how many bytes it took, "need
//! more", or an error out). [`super::conn::Conn`] calls it on a connection's buffered bytes;
//! the `api` fuzz target calls both on arbitrary bytes.

use super::error::ApiError;

pub use super::limits::{MAX_BODY, MAX_HEAD, MAX_HEADERS, MAX_REQUESTS, REQUEST_TIMEOUT};

/// A complete request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method, as sent (`GET`, `PUT`, ...).
    pub method: String,
    /// The path without its query string.
    pub path: String,
    /// The body (empty without one).
    pub body: Vec<u8>,
}

/// What a request head says about the rest of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    method: String,
    path: String,
    /// Bytes of the head, blank line included.
    len: usize,
    /// Bytes of body that follow.
    body_len: usize,
    /// The client waits for `100 Continue` before it sends the body.
    expect_continue: bool,
    /// The client asked to close the connection after the answer (`Connection: close`, or
    /// HTTP/1.0 without `Connection: keep-alive`).
    close: bool,
}

/// Parses a request head, or `None` if `buf` does not hold all of it yet.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, ApiError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf).map_err(ApiError::Malformed)? {
        httparse::Status::Complete(len) if len <= MAX_HEAD => len,
        httparse::Status::Complete(_) => return Err(ApiError::HeadTooLarge),
        httparse::Status::Partial if buf.len() > MAX_HEAD => return Err(ApiError::HeadTooLarge),
        httparse::Status::Partial => return Ok(None),
    };
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Err(ApiError::BadRequest("incomplete request line"));
    };
    let mut body_len: Option<u64> = None;
    let mut expect_continue = false;
    // HTTP/1.1 connections persist unless told otherwise; HTTP/1.0 ones close unless told.
    let mut close = req.version != Some(1);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(h.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(ApiError::BadRequest("Content-Length is not a number"))?;
            if body_len.is_some_and(|prev| prev != value) {
                return Err(ApiError::BadRequest("conflicting Content-Length headers"));
            }
            body_len = Some(value);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(ApiError::TransferEncoding);
        } else if h.name.eq_ignore_ascii_case("expect") {
            if !h.value.eq_ignore_ascii_case(b"100-continue") {
                return Err(ApiError::BadRequest(
                    "only Expect: 100-continue is understood",
                ));
            }
            expect_continue = true;
        } else if h.name.eq_ignore_ascii_case("connection") {
            for option in h.value.split(|b| *b == b',') {
                let option = option.trim_ascii();
                if option.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if option.eq_ignore_ascii_case(b"keep-alive") && req.version == Some(0) {
                    close = false;
                }
            }
        }
    }
    let body_len = body_len.unwrap_or(0);
    let body_len = usize::try_from(body_len)
        .ok()
        .filter(|n| *n <= MAX_BODY)
        .ok_or(ApiError::BodyTooLarge(body_len))?;
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    Ok(Some(Head {
        method: method.to_string(),
        path: path.to_string(),
        len,
        body_len,
        expect_continue,
        close,
    }))
}

/// A complete request at the start of a connection's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The request.
    pub request: Request,
    /// How many bytes it took (head and body); what follows is the next request.
    pub len: usize,
    /// The connection closes after its answer.
    pub close: bool,
}

/// What the bytes at the start of a connection's buffer hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// Not a whole head yet.
    NeedHead,
    /// A whole head; the body is incomplete. `expect_continue`: the client waits for
    /// `100 Continue` before it sends the body.
    NeedBody {
        /// The client sent `Expect: 100-continue`.
        expect_continue: bool,
    },
    /// A whole request.
    Complete(Parsed),
}

/// Frames the request at the start of `buf`; bytes after it (a pipelined request) are left
/// for the next call.
pub fn parse_next(buf: &[u8]) -> Result<Framing, ApiError> {
    let Some(head) = parse_head(buf)? else {
        return Ok(Framing::NeedHead);
    };
    let end = head.len + head.body_len;
    Ok(match buf.get(head.len..end) {
        None => Framing::NeedBody {
            expect_continue: head.expect_continue,
        },
        Some(body) => Framing::Complete(Parsed {
            request: Request {
                method: head.method,
                path: head.path,
                body: body.to_vec(),
            },
            len: end,
            close: head.close,
        }),
    })
}

/// The request at the start of `buf`, or `None` if more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<Request>, ApiError> {
    Ok(match parse_next(buf)? {
        Framing::Complete(parsed) => Some(parsed.request),
        Framing::NeedHead | Framing::NeedBody { .. } => None,
    })
}

/// A response: a status, a JSON body or none, and the methods allowed after a 405.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// A JSON document, or `None` (204 and other bodiless answers).
    pub body: Option<Vec<u8>>,
    /// The `Allow` header of a 405 for a method the endpoint does not take.
    pub allow: Option<&'static str>,
}

impl Response {
    /// 204 No Content.
    pub fn no_content() -> Self {
        Self {
            status: 204,
            body: None,
            allow: None,
        }
    }

    /// 200 OK with `value` as its JSON body.
    pub fn json<T: serde::Serialize>(value: &T) -> Result<Self, ApiError> {
        Ok(Self {
            status: 200,
            body: Some(ascii_json(
                serde_json::to_vec(value).map_err(ApiError::Encode)?,
            )),
            allow: None,
        })
    }

    /// The answer to `error`: its status and, as Cloud Hypervisor does, a JSON array of the
    /// error's messages from the outermost to the root cause.
    pub fn error(error: &ApiError) -> Self {
        let allow = match error {
            ApiError::MethodNotAllowed { allowed, .. } => Some(*allowed),
            _ => None,
        };
        let body = serde_json::to_vec(&error.messages()).map_or_else(
            |_| b"[\"lull could not encode the error\"]".to_vec(),
            ascii_json,
        );
        Self {
            status: error.status(),
            body: Some(body),
            allow,
        }
    }

    /// The response as HTTP/1.1 bytes, written as Cloud Hypervisor's server (`micro_http`)
    /// writes them; `close`: the connection closes after it (said with `Connection: close`;
    /// otherwise it persists, HTTP/1.1's default). The status line has no reason phrase
    /// (`HTTP/1.1 204 \r\n`): Cloud Hypervisor's `api_client` (ch-remote) parses everything
    /// from after `HTTP/1.1 ` to the line's end as the number, and fails on `204 No Content`.
    /// Every answer but a 204 carries `Content-Length: N` (that spelling: the same client
    /// looks for it case-sensitively), so a client on a persistent connection knows where it
    /// ends.
    pub fn to_bytes(&self, close: bool) -> Vec<u8> {
        let mut out = format!("{}Server: lull API\r\n", status_line(self.status));
        if close {
            out.push_str("Connection: close\r\n");
        }
        if let Some(allow) = self.allow {
            out.push_str(&format!("Allow: {allow}\r\n"));
        }
        let body = self.body.as_deref().unwrap_or_default();
        if self.status != 204 {
            out.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(body);
        bytes
    }
}

/// The status line of `status`, with its CRLF: `HTTP/1.1 200 \r\n` (see
/// [`Response::to_bytes`]; an empty reason phrase is valid HTTP/1.1, RFC 9112 4).
pub fn status_line(status: u16) -> String {
    format!("HTTP/1.1 {status} \r\n")
}

/// `json` with every non-ASCII character escaped (`\uXXXX`, surrogate pairs above U+FFFF):
/// the same document, in bytes any client can cut anywhere. Cloud Hypervisor's `api_client`
/// reads an answer in 256-byte pieces and panics on a piece that is not whole UTF-8. Outside
/// strings, serde_json writes ASCII only, so every escape lands inside a string.
fn ascii_json(json: Vec<u8>) -> Vec<u8> {
    let Ok(text) = String::from_utf8(json) else {
        // serde_json writes UTF-8; nothing else reaches here.
        return b"[\"lull could not encode the answer\"]".to_vec();
    };
    if text.is_ascii() {
        return text.into_bytes();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_complete_with_its_body() {
        let raw = b"PUT /api/v1/vm.create?x=1 HTTP/1.1\r\nHost: l\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(parse(&raw[..raw.len() - 1]).unwrap(), None);
        let req = parse(raw).unwrap().unwrap();
        assert_eq!(req.method, "PUT");
        assert_eq!(req.path, "/api/v1/vm.create");
        assert_eq!(req.body, b"{}");
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: l\r\n").unwrap(), None);
    }

    #[test]
    fn broken_requests_are_refused_with_their_status() {
        let status = |raw: &[u8]| parse(raw).unwrap_err().status();
        assert_eq!(status(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"), 400);
        assert_eq!(status(b"\x00\x01 nonsense\r\n\r\n"), 400);
        assert_eq!(status(b"PUT / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), 400);
        assert_eq!(
            status(b"PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"),
            400
        );
        assert_eq!(
            status(
                format!("PUT / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", MAX_BODY + 1).as_bytes()
            ),
            413
        );
        assert_eq!(
            status(b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            501
        );
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(status(long.as_bytes()), 431);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("H{i}: v\r\n")).collect();
        assert_eq!(
            status(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()),
            400
        );
    }

    #[test]
    fn responses_follow_http_1_1() {
        let text = String::from_utf8(Response::no_content().to_bytes(true)).unwrap();
        assert!(text.starts_with("HTTP/1.1 204 \r\n"), "{text}");
        assert!(text.contains("\r\nConnection: close\r\n"), "{text}");
        assert!(!text.contains("Content-Length"), "{text}");
        let err = ApiError::MethodNotAllowed {
            endpoint: "vm.info",
            method: "PUT".into(),
            allowed: "GET",
        };
        let text = String::from_utf8(Response::error(&err).to_bytes(false)).unwrap();
        assert!(text.starts_with("HTTP/1.1 405 \r\n"), "{text}");
        assert!(!text.contains("Connection:"), "{text}");
        assert!(text.contains("\r\nAllow: GET\r\n"));
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        let messages: Vec<String> = serde_json::from_str(body).unwrap();
        assert_eq!(messages, vec![err.to_string()]);
        assert!(text.contains(&format!("Content-Length: {}\r\n", body.len())));
    }

    fn ch_client_read(answer: &[u8]) -> Result<(u16, Option<String>), String> {
        super::super::ch_client::read_answer(&mut std::io::Cursor::new(answer))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn cloud_hypervisor_s_client_reads_every_answer() {
        let info = serde_json::json!({"state": "Running", "note": "µs — naïve 🙂"});
        let long = serde_json::json!({"pad": "é".repeat(300)});
        let error = ApiError::NotFound("/api/v1/vm.nothing".into());
        let not_allowed = ApiError::MethodNotAllowed {
            endpoint: "vm.info",
            method: "PUT".into(),
            allowed: "GET",
        };
        for response in [
            Response::no_content(),
            Response::json(&info).unwrap(),
            Response::json(&long).unwrap(),
            Response::error(&error),
            Response::error(&not_allowed),
        ] {
            for close in [false, true] {
                let bytes = response.to_bytes(close);
                let (status, body) = ch_client_read(&bytes).unwrap();
                assert_eq!(status, response.status);
                let sent = response
                    .body
                    .as_deref()
                    .map(|b| String::from_utf8(b.to_vec()));
                assert_eq!(body, sent.transpose().unwrap());
            }
        }
        // The escapes keep the document: the same value comes back.
        let body = Response::json(&long).unwrap().body.unwrap();
        assert!(body.is_ascii());
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            long
        );
        let body = Response::json(&info).unwrap().body.unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            info
        );
        // What today's lull sent before: ch-remote failed on the reason phrase.
        let old = b"HTTP/1.1 204 No Content\r\nServer: lull API\r\n\r\n";
        assert!(ch_client_read(old).unwrap_err().contains("invalid digit"));
    }
}
