//! The API server: the socket and the loop that serves it on lull's main thread.
//!
//! The loop waits (epoll) on three things: a client connecting, the VM thread's "run ended"
//! eventfd, and SIGINT/SIGTERM. Each connection is read (with a deadline), answered and
//! closed before the next; a signal stops the VM if it runs and ends lull, as it does for
//! `lull run`.
//!
//! Signals: the handlers write one process-wide eventfd (`sys::stop_signals`). While the VM
//! runs, its own event loop has installed them and takes the signal (the run ends with
//! `StopReason::Signal`, which ends lull too); once a run ends, the server installs them again
//! for itself. A signal in the moment between the end of a run and that re-installation is
//! lost (it reaches the ended run's eventfd).

use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Instant;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::controller::{Controller, Next};
use super::http::{self, Response};
use super::routes;
use super::ApiError;
use crate::config::VmConfig;
use crate::sys::stop_signals;

/// The listening socket; its file is removed when it is dropped.
pub struct ApiSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl ApiSocket {
    /// Creates the socket at `path`, readable and writable by its owner only, and never
    /// reachable with wider permissions: it is bound in a private directory, restricted, then
    /// linked to `path` (which must not exist).
    pub fn bind(path: &Path) -> Result<Self, ApiError> {
        let fail = |source| ApiError::Socket {
            path: path.to_path_buf(),
            source,
        };
        if path.symlink_metadata().is_ok() {
            return Err(ApiError::SocketExists(path.to_path_buf()));
        }
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let private = parent.join(format!(".lull-api-{}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            .map_err(fail)?;
        let staged = private.join("s");
        let bound = UnixListener::bind(&staged).and_then(|listener| {
            std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
            std::fs::hard_link(&staged, path)?;
            Ok(listener)
        });
        let _ = std::fs::remove_file(&staged);
        let _ = std::fs::remove_dir(&private);
        let listener = bound.map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => ApiError::SocketExists(path.to_path_buf()),
            _ => fail(e),
        })?;
        listener.set_nonblocking(true).map_err(fail)?;
        Ok(Self {
            listener,
            path: path.to_path_buf(),
        })
    }
}

impl Drop for ApiSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

const LISTENER: u64 = 0;
const VM_ENDED: u64 = 1;
const SIGNAL: u64 = 2;

fn host(what: &'static str) -> impl Fn(std::io::Error) -> ApiError {
    move |source| ApiError::Host { what, source }
}

/// The server's epoll set.
struct Events {
    epoll: Epoll,
    /// The eventfd SIGINT/SIGTERM write while the server (not a VM) has the handlers.
    signal: EventFd,
}

impl Events {
    fn watch(&self, fd: &impl AsRawFd, token: u64) -> Result<(), ApiError> {
        self.epoll
            .ctl(
                ControlOperation::Add,
                fd.as_raw_fd(),
                EpollEvent::new(EventSet::IN, token),
            )
            .map_err(host("the API epoll set"))
    }

    /// Takes the SIGINT/SIGTERM handlers back from a VM whose run has ended.
    fn reinstall_signals(&mut self) -> Result<(), ApiError> {
        let signal = stop_signals::install().map_err(host("the SIGINT/SIGTERM handlers"))?;
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            self.signal.as_raw_fd(),
            EpollEvent::default(),
        );
        self.signal = signal;
        self.watch(&self.signal, SIGNAL)
    }
}

/// Serves the API on `path` until `vmm.shutdown` or a signal; returns lull's exit status.
/// `initial` is the VM the command line described, if it described one.
pub fn serve(path: &Path, initial: Option<VmConfig>) -> Result<i32, ApiError> {
    let socket = ApiSocket::bind(path)?;
    let signal = stop_signals::install().map_err(host("the SIGINT/SIGTERM handlers"))?;
    let ended = EventFd::new(EFD_NONBLOCK).map_err(host("the VM-ended eventfd"))?;
    let mut controller = Controller::new(initial, ended);
    let mut events = Events {
        epoll: Epoll::new().map_err(host("the API epoll set"))?,
        signal,
    };
    events.watch(&socket.listener, LISTENER)?;
    events.watch(controller.ended_event(), VM_ENDED)?;
    events.watch(&events.signal, SIGNAL)?;
    tracing::info!("management API on {}", path.display());
    let mut ready = [EpollEvent::default(); 3];
    loop {
        let n = match events.epoll.wait(-1, &mut ready) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(host("the API event wait")(e)),
        };
        for event in &ready[..n] {
            let exit = match event.data() {
                LISTENER => accept_all(&socket.listener, &mut controller),
                VM_ENDED => {
                    let _ = controller.ended_event().read();
                    let exit = controller.poll_vm();
                    if exit.is_none() {
                        events.reinstall_signals()?;
                    }
                    exit
                }
                _ => {
                    let _ = events.signal.read();
                    let signal = stop_signals::last_signal().unwrap_or(libc::SIGTERM);
                    Some(controller.on_signal(signal))
                }
            };
            if let Some(code) = exit {
                return Ok(code);
            }
        }
    }
}

/// Serves every pending connection; returns lull's exit status if one asked lull to end.
fn accept_all(listener: &UnixListener, controller: &mut Controller) -> Option<i32> {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Next::Exit(code) = serve_connection(stream, controller) {
                    return Some(code);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                // E.g. out of descriptors: this connection is lost, the server goes on.
                tracing::warn!("API socket: cannot accept a connection: {e}");
                return None;
            }
        }
    }
}

/// Reads one request from `stream`, answers it and closes the connection.
fn serve_connection(mut stream: UnixStream, controller: &mut Controller) -> Next {
    let deadline = Instant::now() + http::REQUEST_TIMEOUT;
    let set_timeout = |s: &UnixStream, left| s.set_read_timeout(Some(left));
    let request = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_write_timeout(Some(http::REQUEST_TIMEOUT)))
        .map_err(ApiError::Connection)
        .and_then(|()| http::read_request(&mut stream, deadline, set_timeout));
    let (response, next) = match request.and_then(|r| {
        tracing::debug!(method = r.method, path = r.path, "API request");
        routes::route(&r)
    }) {
        Ok(request) => controller.handle(request),
        Err(ApiError::HungUp) => {
            tracing::debug!("API client hung up before its request was complete");
            return Next::Serve;
        }
        Err(e) => {
            tracing::debug!("API request refused: {e}");
            (Response::error(&e), Next::Serve)
        }
    };
    if let Err(e) = std::io::Write::write_all(&mut stream, &response.to_bytes()) {
        tracing::debug!("API client gone before its answer: {e}");
    }
    next
}
