//! How Cloud Hypervisor's own client reads an answer, re-stated: `api_client::
//! parse_http_response` (cloud-hypervisor/api_client/src/lib.rs, v54), which `ch-remote` uses.
//! lull's tests read every answer through it, so an answer `ch-remote` would fail on fails
//! them. It is not used to serve.
//!
//! The client reads 256 bytes at a time and appends each piece as UTF-8 (a piece that is not
//! whole UTF-8 panics it); it stops at the blank line if there is no `Content-Length: `
//! (case-sensitive, with its space), else once that many body bytes are in, and never waits
//! for the end of the stream. The status is the rest of the first `HTTP/1.1` line, trimmed,
//! as a number (`204 No Content` fails: "invalid digit found in string"). The body is `None`
//! without a Content-Length.

use std::io::Read;

/// What went wrong, in the client's words.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChClientError {
    /// A read failed.
    #[error("Error writing to or reading from HTTP socket: {0}")]
    Socket(String),
    /// A 256-byte piece is not whole UTF-8: the client panics.
    #[error("ch-remote panics: a piece of the answer is not whole UTF-8")]
    Utf8,
    /// The Content-Length does not parse.
    #[error("Error parsing HTTP Content-Length field")]
    ContentLength,
    /// No `HTTP/1.1`.
    #[error("HTTP output is missing protocol statement")]
    MissingProtocol,
    /// The status does not parse.
    #[error("Error parsing HTTP status code: {0}")]
    StatusCode(String),
}

/// Reads one answer from `socket` as Cloud Hypervisor's client does: its status and body.
pub fn read_answer(socket: &mut impl Read) -> Result<(u16, Option<String>), ChClientError> {
    let mut res = String::new();
    let mut body_offset = None;
    let mut content_length: Option<usize> = None;
    loop {
        let mut piece = [0u8; 256];
        let n = socket
            .read(&mut piece)
            .map_err(|e| ChClientError::Socket(e.to_string()))?;
        if n == 0 {
            break;
        }
        res.push_str(std::str::from_utf8(&piece[..n]).map_err(|_| ChClientError::Utf8)?);
        if let Some(o) = res.find("\r\n\r\n") {
            body_offset = Some(o + 4);
            content_length = match header(&res, "Content-Length") {
                Some(v) => Some(v.trim().parse().map_err(|_| ChClientError::ContentLength)?),
                None => None,
            };
            if content_length.is_none() {
                break;
            }
        }
        if let (Some(o), Some(len)) = (body_offset, content_length) {
            if res.len() >= o + len {
                break;
            }
        }
    }
    let body = content_length.and(body_offset.map(|o| res[o..].to_string()));
    let at = res.find("HTTP/1.1").ok_or(ChClientError::MissingProtocol)?;
    let line = res[at + "HTTP/1.1".len()..]
        .split('\r')
        .next()
        .unwrap_or_default();
    let status = line
        .trim()
        .parse()
        .map_err(|e: std::num::ParseIntError| ChClientError::StatusCode(e.to_string()))?;
    Ok((status, body))
}

/// The value of header `name` (as the client finds it: `name: ` anywhere, to the next CR).
fn header<'a>(res: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}: ");
    let start = res.find(&key)? + key.len();
    res[start..].split('\r').next()
}
