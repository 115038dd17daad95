//! The API socket inherited from the process that started lull (`--api-socket fd=N` of the
//! `cloud-hypervisor` command line): checked to be a listening Unix stream socket, then owned.

use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixListener;

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

/// One `int` socket option of `fd`, or `None` if `getsockopt` refuses (not a socket).
fn int_option(fd: RawFd, option: libc::c_int) -> Option<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).ok()?;
    // SAFETY: getsockopt writes at most `len` bytes (one int) into `value`, which outlives
    // the call; on an fd that is not a socket it fails with ENOTSOCK and writes nothing.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            std::ptr::addr_of_mut!(value).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(value)
}

/// Takes ownership of the inherited listening socket `fd` (close-on-exec from now on,
/// non-blocking as the server wants it).
pub fn inherited_listener(fd: RawFd) -> Result<UnixListener, ListenerError> {
    // SAFETY: F_GETFD only reads the descriptor's flags; EBADF if `fd` is not open.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(ListenerError::NotOpen(fd));
    }
    let not = |what| ListenerError::NotAListener { fd, what };
    if int_option(fd, libc::SO_DOMAIN) != Some(libc::AF_UNIX) {
        return Err(not("not a Unix socket"));
    }
    if int_option(fd, libc::SO_TYPE) != Some(libc::SOCK_STREAM) {
        return Err(not("not a stream socket"));
    }
    if int_option(fd, libc::SO_ACCEPTCONN) != Some(1) {
        return Err(not("not listening"));
    }
    // SAFETY: `fd` is open and is a listening Unix stream socket (checked above); it was
    // handed to lull to serve the API, so lull takes ownership of it here, once.
    let listener = unsafe { UnixListener::from_raw_fd(fd) };
    // SAFETY: F_SETFD sets the descriptor flags of `fd`, now owned by `listener`.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    listener
        .set_nonblocking(true)
        .map_err(|_: io::Error| not("cannot be made non-blocking"))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, IntoRawFd};

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
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let e = inherited_listener(a.as_raw_fd()).unwrap_err();
        assert!(e.to_string().contains("not listening"), "{e}");
        let file = std::fs::File::open("/dev/null").unwrap();
        let e = inherited_listener(file.as_raw_fd()).unwrap_err();
        assert!(e.to_string().contains("not a Unix socket"), "{e}");
        assert!(matches!(
            inherited_listener(-1),
            Err(ListenerError::NotOpen(-1))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
