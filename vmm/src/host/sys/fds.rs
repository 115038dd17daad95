//! Descriptors lull knows only by number: one inherited from the process that started it
//! (`--api-socket fd=N`, `--net fd=N`), or one a caller keeps open and names by number (a
//! tap fd in a `NetConfig`). Turning a bare number into a borrowed or owned descriptor is what
//! Rust's I/O safety cannot check, and neither nix nor vmm-sys-util offers it safely: their
//! calls take a descriptor that is already a `BorrowedFd` or `OwnedFd`. So the two ways lull
//! does it are here, each behind one `unsafe` block, and everything after them is safe code.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A close-on-exec duplicate of the open descriptor `fd`, which the caller keeps open and
/// lull does not own; `None` if `fd` is not open.
pub fn duplicate(fd: RawFd) -> Option<OwnedFd> {
    if fd < 0 {
        return None;
    }
    // SAFETY: no safe API takes a bare number (see the module's comment). F_DUPFD_CLOEXEC only
    // reads the descriptor table: it fails with EBADF, and creates nothing, if `fd` is not
    // open. On success the new descriptor was made for this call, so nothing else owns it.
    unsafe {
        let new = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
        (new >= 0).then(|| OwnedFd::from_raw_fd(new))
    }
}

/// Takes ownership of `fd`, handed to lull by number by the process that started it (close-on-
/// exec from now on); `None` if it is not open. Once per number, and only for one nothing in
/// lull owns: dropping the result closes it.
pub fn claim_inherited(fd: RawFd) -> Option<OwnedFd> {
    if fd < 0 {
        return None;
    }
    // SAFETY: no safe API turns a number into an owner (see the module's comment). F_SETFD
    // only sets the descriptor's close-on-exec flag, and fails with EBADF if `fd` is not
    // open; an open inherited descriptor that nothing in lull owns (the caller's contract) is
    // then owned by the result alone.
    unsafe {
        let open = libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) == 0;
        open.then(|| OwnedFd::from_raw_fd(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, IntoRawFd};

    #[test]
    fn a_number_is_duplicated_or_claimed_only_if_open() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let copy = duplicate(file.as_raw_fd()).unwrap();
        assert_ne!(copy.as_raw_fd(), file.as_raw_fd());
        assert!(duplicate(-1).is_none());
        assert!(duplicate(1 << 30).is_none(), "beyond any descriptor table");
        let raw = file.into_raw_fd();
        let owned = claim_inherited(raw).unwrap();
        assert_eq!(owned.as_raw_fd(), raw);
        assert!(claim_inherited(-1).is_none());
        assert!(claim_inherited(1 << 30).is_none());
    }
}
