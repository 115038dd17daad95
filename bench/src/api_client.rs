//! A client of lull's management API (`lull run --api-socket PATH`, `docs/API.md`) with just
//! what the bench needs: boot a created VM (or restore one from a snapshot), read its live
//! counters and state, end lull.
//!
//! One request per connection: the request asks the server to close the connection after
//! its answer (`Connection: close`; lull keeps HTTP/1.1 connections open otherwise), then the
//! client reads to the end and splits the status line from the body. Reads and writes time out, so a
//! stalled lull delays the bench by [`TIMEOUT`] at most.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lull_schema::RunReport;
use serde_json::Value;

/// Longest wait for one answer.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for a `vm.restore` (a copy of a large VM's memory on a loaded host).
const RESTORE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a request to lull's API failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiClientError {
    /// The socket could not be reached or the exchange broke off.
    #[error("API socket {0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    /// The answer is not an HTTP response.
    #[error("API socket {0}: the answer is not an HTTP response")]
    NotHttp(PathBuf),
    /// lull answered with an error status.
    #[error("API socket {0}: {2} answered {1}: {3}")]
    Status(PathBuf, u16, &'static str, String),
    /// A JSON body that does not parse.
    #[error("API socket {0}: the body is not JSON: {1}")]
    Json(PathBuf, #[source] serde_json::Error),
}

/// An answer: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The body (empty for 204).
    pub body: String,
}

/// Splits a raw HTTP response into status and body; `None` if it is not one.
pub fn parse_response(raw: &str) -> Option<Answer> {
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status_line = head.lines().next()?;
    let mut words = status_line.split_whitespace();
    if !words.next()?.starts_with("HTTP/1.") {
        return None;
    }
    Some(Answer {
        status: words.next()?.parse().ok()?,
        body: body.to_string(),
    })
}

/// Sends `method` to `endpoint` (under `/api/v1/`), without a body.
pub fn request(socket: &Path, method: &str, endpoint: &str) -> Result<Answer, ApiClientError> {
    request_with_body(socket, method, endpoint, "", TIMEOUT)
}

/// Sends `method` to `endpoint` with a JSON `body`; waits up to `timeout` for each read and
/// write (a snapshot of a large VM takes longer than [`TIMEOUT`]).
pub fn request_with_body(
    socket: &Path,
    method: &str,
    endpoint: &str,
    body: &str,
    timeout: Duration,
) -> Result<Answer, ApiClientError> {
    let io = |e| ApiClientError::Io(socket.to_path_buf(), e);
    let mut stream = UnixStream::connect(socket).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let req = format!(
        "{method} /api/v1/{endpoint} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(io)?;
    parse_response(&String::from_utf8_lossy(&raw))
        .ok_or_else(|| ApiClientError::NotHttp(socket.to_path_buf()))
}

/// `method endpoint`, which must succeed (2xx); returns the body.
fn expect_ok(
    socket: &Path,
    method: &'static str,
    endpoint: &'static str,
) -> Result<String, ApiClientError> {
    let a = request(socket, method, endpoint)?;
    if (200..300).contains(&a.status) {
        Ok(a.body)
    } else {
        Err(ApiClientError::Status(
            socket.to_path_buf(),
            a.status,
            endpoint,
            a.body.trim().to_string(),
        ))
    }
}

fn json(socket: &Path, body: &str) -> Result<Value, ApiClientError> {
    serde_json::from_str(body).map_err(|e| ApiClientError::Json(socket.to_path_buf(), e))
}

/// `PUT vm.boot`: boots the VM created from lull's command line.
pub fn boot(socket: &Path) -> Result<(), ApiClientError> {
    expect_ok(socket, "PUT", "vm.boot").map(drop)
}

/// `PUT vm.restore` with `body` (its `RestoreConfig`); waits up to `timeout` for the answer.
pub fn restore(socket: &Path, body: &str, timeout: Duration) -> Result<(), ApiClientError> {
    let a = request_with_body(socket, "PUT", "vm.restore", body, timeout)?;
    if (200..300).contains(&a.status) {
        Ok(())
    } else {
        Err(ApiClientError::Status(
            socket.to_path_buf(),
            a.status,
            "vm.restore",
            a.body.trim().to_string(),
        ))
    }
}

/// `GET vm.counters`: the `--metrics` report, live while the VM runs.
pub fn counters(socket: &Path) -> Result<RunReport, ApiClientError> {
    let body = expect_ok(socket, "GET", "vm.counters")?;
    serde_json::from_str(&body).map_err(|e| ApiClientError::Json(socket.to_path_buf(), e))
}

/// `GET vm.info`'s `state`: `Created`, `Running` or `Shutdown`.
pub fn state(socket: &Path) -> Result<String, ApiClientError> {
    let info = json(socket, &expect_ok(socket, "GET", "vm.info")?)?;
    Ok(info["state"].as_str().unwrap_or_default().to_string())
}

/// `PUT vmm.shutdown`: lull ends (with the status of its VM's run).
pub fn shutdown(socket: &Path) -> Result<(), ApiClientError> {
    expect_ok(socket, "PUT", "vmm.shutdown").map(drop)
}

/// One VM of a fleet (`fleet.rs`) as the bench drives it through the API.
pub(crate) struct ApiVm {
    socket: PathBuf,
    /// The `vm.restore` body that starts it, instead of `vm.boot`.
    restore: Option<String>,
    booted: bool,
    shut_down: bool,
    /// Its live counters as the window opened.
    pub(crate) at_start: Option<RunReport>,
    /// ... and as it closed.
    pub(crate) at_end: Option<RunReport>,
    /// The first thing that went wrong with its API.
    pub(crate) error: Option<String>,
    /// A restored VM: from its `vm.restore` (with `resume`) sent to the answer, when it
    /// runs, ms.
    pub(crate) restore_ms: Option<f64>,
}

impl ApiVm {
    /// A VM whose lull will listen on `socket`, restored with `restore` (a `vm.restore`
    /// body that resumes it), or booted without one.
    pub(crate) fn starting(socket: PathBuf, restore: Option<String>) -> Self {
        Self {
            socket,
            restore,
            booted: false,
            shut_down: false,
            at_start: None,
            at_end: None,
            error: None,
            restore_ms: None,
        }
    }

    /// Between windows: boots the VM once lull listens, ends lull once its VM has stopped.
    /// Returns false if the VM cannot be driven (the caller kills it).
    pub(crate) fn chores(&mut self) -> bool {
        if self.shut_down || self.error.is_some() {
            return self.error.is_none();
        }
        let step = if !self.booted {
            if !self.socket.exists() {
                return true;
            }
            match &self.restore {
                None => boot(&self.socket),
                Some(body) => {
                    let sent = std::time::Instant::now();
                    let done = restore(&self.socket, body, RESTORE_TIMEOUT);
                    self.restore_ms = Some(sent.elapsed().as_secs_f64() * 1e3);
                    done
                }
            }
            .map(|()| self.booted = true)
        } else {
            match state(&self.socket) {
                Ok(state) if state == "Shutdown" => {
                    shutdown(&self.socket).map(|()| self.shut_down = true)
                }
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            }
        };
        if let Err(e) = step {
            self.error = Some(e.to_string());
        }
        self.error.is_none()
    }

    /// Live counters now, or the error noted.
    pub(crate) fn counters(&mut self) -> Option<RunReport> {
        match counters(&self.socket) {
            Ok(v) => Some(v),
            Err(e) => {
                self.error.get_or_insert(e.to_string());
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn responses_split_into_status_and_body() {
        let ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"a\":1}";
        assert_eq!(
            parse_response(ok),
            Some(Answer {
                status: 200,
                body: "{\"a\":1}".into()
            })
        );
        let empty = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
        assert_eq!(parse_response(empty).map(|a| a.status), Some(204));
        assert_eq!(parse_response("SSH-2.0-x\r\n\r\n"), None);
        assert_eq!(parse_response("HTTP/1.1 200 OK\r\n"), None);
    }

    /// A one-shot server on a fresh socket that answers `answer` and hands back the request.
    fn serve_once(name: &str, answer: &'static str) -> (PathBuf, std::thread::JoinHandle<String>) {
        let path =
            std::env::temp_dir().join(format!("lull-bench-api-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap();
            s.write_all(answer.as_bytes()).unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (path, server)
    }

    #[test]
    fn counters_and_errors_come_through_the_socket() {
        let (path, server) = serve_once(
            "counters",
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"kvm\":{\"exits\":7}}",
        );
        let c = counters(&path).unwrap();
        assert_eq!(c.kvm.as_ref().and_then(|k| k.get("exits")), Some(&7));
        let req = server.join().unwrap();
        assert!(
            req.starts_with("GET /api/v1/vm.counters HTTP/1.1\r\n")
                && req.contains("\r\nConnection: close\r\n"),
            "{req}"
        );
        let _ = std::fs::remove_file(&path);

        let (path, server) = serve_once(
            "boot",
            "HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\n\r\n[\"Cannot boot the VM\"]",
        );
        let e = boot(&path).unwrap_err().to_string();
        assert!(
            e.contains("vm.boot answered 500") && e.contains("Cannot boot"),
            "{e}"
        );
        assert!(server.join().unwrap().starts_with("PUT /api/v1/vm.boot "));
        let _ = std::fs::remove_file(&path);
        assert!(matches!(
            state(&path),
            Err(ApiClientError::Io(p, _)) if p == path
        ));
    }
}
