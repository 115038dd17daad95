//! The API socket inherited from the process that started lull (`--api-socket fd=N` of the
//! `cloud-hypervisor` command line): owned, then checked to be a listening Unix stream socket.
//! Safe code over nix; taking the number is [`super::fds::claim_inherited`].

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;

use nix::sys::socket::{
    getsockname, getsockopt, sockopt, AddressFamily, SockType, SockaddrLike, SockaddrStorage,
};

use super::fds;

/// Why an inherited fd cannot serve the API.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// The fd is not open.
    #[error(
        "File descriptor {0} is not open: pass the listening socket to lull without close-on-exec"
    )]
    NotOpen(RawFd),
    /// The fd is something else than a listening Unix stream socket.
    #[error("File descriptor {fd} is not a listening Unix stream socket ({what}): bind and listen on it first")]
    NotAListener {
        /// The fd.
        fd: RawFd,
        /// What is wrong with it.
        what: &'static str,
    },
}

/// What keeps `socket` from serving as the API's listener, if anything.
fn not_a_listener(socket: &OwnedFd) -> Option<&'static str> {
    let family = getsockname::<SockaddrStorage>(socket.as_raw_fd())
        .ok()
        .and_then(|a| a.family());
    if family != Some(AddressFamily::Unix) {
        return Some("not a Unix socket");
    }
    if getsockopt(socket, sockopt::SockType).ok() != Some(SockType::Stream) {
        return Some("not a stream socket");
    }
    if getsockopt(socket, sockopt::AcceptConn).ok() != Some(true) {
        return Some("not listening");
    }
    None
}

/// Takes ownership of the inherited listening socket `fd` (close-on-exec from now on,
/// non-blocking as the server wants it). lull was handed `fd` to serve the API: it owns it
/// from here, and closes it if it cannot serve on it.
pub fn inherited_listener(fd: RawFd) -> Result<UnixListener, ListenerError> {
    let socket = fds::claim_inherited(fd).ok_or(ListenerError::NotOpen(fd))?;
    let not = |what| ListenerError::NotAListener { fd, what };
    if let Some(what) = not_a_listener(&socket) {
        return Err(not(what));
    }
    let listener = UnixListener::from(socket);
    listener
        .set_nonblocking(true)
        .map_err(|_| not("cannot be made non-blocking"))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    #[test]
    fn only_a_listening_unix_stream_socket_is_taken() {
        let dir = std::env::temp_dir().join(format!("lull-listener-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let _ = std::fs::remove_file(&path);
        let fd = UnixListener::bind(&path).unwrap().into_raw_fd();
        let listener = inherited_listener(fd).unwrap();
        std::os::unix::net::UnixStream::connect(&path).unwrap();
        assert!(listener.accept().is_ok());
        // Each fd is handed over (lull owns, and closes, what it refuses).
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let e = inherited_listener(a.into_raw_fd()).unwrap_err();
        assert!(e.to_string().contains("not listening"), "{e}");
        let datagram = std::os::unix::net::UnixDatagram::unbound().unwrap();
        let e = inherited_listener(datagram.into_raw_fd()).unwrap_err();
        assert!(e.to_string().contains("not a stream socket"), "{e}");
        let file = std::fs::File::open("/dev/null").unwrap();
        let e = inherited_listener(file.into_raw_fd()).unwrap_err();
        assert!(e.to_string().contains("not a Unix socket"), "{e}");
        assert!(matches!(
            inherited_listener(-1),
            Err(ListenerError::NotOpen(-1))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
