//! Reading a Unix stream socket with the file descriptors sent along (`SCM_RIGHTS`): Cloud
//! Hypervisor's clients (ch-remote, Kata) send a tap's fd with the first bytes of a
//! `vm.add-net` request. nix's `recvmsg` reads; the one `unsafe` left takes ownership of the
//! descriptors the kernel installed, which nix hands over as bare numbers.
//!
//! The control buffer holds as many descriptors as one message can carry (the kernel's
//! `SCM_MAX_FD`, 253: a `sendmsg` with more fails at the sender, and a read of a Unix stream
//! socket never takes the descriptors of two messages), so the count read is the count sent.
//! Should the kernel still truncate (`MSG_CTRUNC`), the read says so, and the descriptors that
//! fitted are read from the buffer and owned all the same: none stays open unowned.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

/// The most descriptors one message carries (Linux's `SCM_MAX_FD`).
pub const MAX_FDS_PER_MESSAGE: usize = 253;

/// What one read brought besides its bytes.
#[derive(Debug, Default)]
pub struct Received {
    /// The descriptors (close-on-exec, owned: dropping them closes them).
    pub fds: Vec<OwnedFd>,
    /// The kernel truncated the control data (`MSG_CTRUNC`): more descriptors were sent than
    /// [`Received::fds`] holds, and the others were closed by the kernel.
    pub truncated: bool,
}

/// The descriptors sent with one request, over however many reads: kept in the order they
/// came, up to [`MAX_FDS_PER_MESSAGE`] (any more are closed as they come), all counted.
/// `vm.add-net` takes one, `vm.restore` one per net it names; dropping them closes them.
#[derive(Debug, Default)]
pub struct SentFds {
    /// The descriptors kept, in the order sent.
    pub fds: Vec<OwnedFd>,
    /// How many were received.
    pub count: usize,
    /// Some read was truncated: more were sent than [`SentFds::count`].
    pub truncated: bool,
}

impl SentFds {
    /// Adds what one read brought.
    pub fn add(&mut self, received: Received) {
        self.count += received.fds.len();
        self.truncated |= received.truncated;
        let room = MAX_FDS_PER_MESSAGE.saturating_sub(self.fds.len());
        self.fds.extend(received.fds.into_iter().take(room));
    }

    /// Whether every descriptor received is kept: none was truncated or closed for lack of
    /// room.
    pub fn complete(&self) -> bool {
        !self.truncated && self.fds.len() == self.count
    }

    /// How many were sent, as a message says it: `3`, or `more than 253`.
    pub fn said(&self) -> String {
        if self.truncated {
            format!("more than {}", self.count)
        } else {
            self.count.to_string()
        }
    }
}

/// Reads into `buf` like `read`, and takes the descriptors that came with those bytes.
pub fn recv_with_fds(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Received)> {
    recv_with_room(stream, buf, MAX_FDS_PER_MESSAGE)
}

/// [`recv_with_fds`] with room for `room` descriptors.
fn recv_with_room(
    stream: &UnixStream,
    buf: &mut [u8],
    room: usize,
) -> io::Result<(usize, Received)> {
    let mut control = vec![0u8; control_space(room)];
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let n = msg.bytes;
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    let raw: Vec<RawFd> = match msg.cmsgs() {
        Ok(cmsgs) => cmsgs
            .filter_map(|c| match c {
                ControlMessageOwned::ScmRights(fds) => Some(fds),
                _ => None,
            })
            .flatten()
            .collect(),
        // nix does not walk a truncated buffer: read its one SCM_RIGHTS header here.
        Err(_) => truncated_rights(&control),
    };
    let fds = raw
        .into_iter()
        // SAFETY: nix hands received descriptors over as numbers and no safe API turns a
        // number into an owner. The kernel installed each in this process for this read
        // (MSG_CMSG_CLOEXEC): nothing else owns it, and it is owned once, here.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    Ok((n, Received { fds, truncated }))
}

/// The bytes of a control buffer with room for `room` descriptors (`CMSG_SPACE`).
fn control_space(room: usize) -> usize {
    header_len()
        + (room * std::mem::size_of::<RawFd>())
            .next_multiple_of(std::mem::align_of::<libc::cmsghdr>())
}

/// `CMSG_LEN(0)`: a header, aligned.
fn header_len() -> usize {
    std::mem::size_of::<libc::cmsghdr>().next_multiple_of(std::mem::align_of::<libc::cmsghdr>())
}

/// The descriptors of the first control message of a truncated `control` buffer if it is an
/// `SCM_RIGHTS` one (the kernel writes its header for the descriptors that fitted).
fn truncated_rights(control: &[u8]) -> Vec<RawFd> {
    const LEN: usize = std::mem::size_of::<usize>();
    const INT: usize = std::mem::size_of::<libc::c_int>();
    let field = |at: usize| -> Option<libc::c_int> {
        let bytes = control.get(at..at + INT)?;
        Some(libc::c_int::from_ne_bytes(bytes.try_into().ok()?))
    };
    let Some(len) = control
        .get(..LEN)
        .and_then(|b| b.try_into().ok())
        .map(usize::from_ne_bytes)
    else {
        return Vec::new();
    };
    if field(LEN) != Some(libc::SOL_SOCKET) || field(LEN + INT) != Some(libc::SCM_RIGHTS) {
        return Vec::new();
    }
    let end = len.min(control.len());
    (header_len()..end)
        .step_by(INT)
        .filter(|at| at + INT <= end)
        .filter_map(field)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;

    #[test]
    fn bytes_and_the_fds_sent_with_them_are_read() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        a.send_with_fd(&b"PUT /api/v1/vm.add-net"[..], file.as_fd().as_raw_fd())
            .unwrap();
        let mut buf = [0u8; 64];
        let (n, got) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"PUT /api/v1/vm.add-net");
        assert_eq!((got.fds.len(), got.truncated), (1, false));
        assert_ne!(got.fds[0].as_raw_fd(), file.as_raw_fd());
        (&a).write_all(b"x").unwrap();
        let (n, got) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((n, got.fds.len()), (1, 0));
    }

    /// 50 fds in one message are 50 received, not the first 8; and as many as the kernel
    /// lets one message carry.
    #[test]
    fn every_fd_of_a_message_is_received() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let mut buf = [0u8; 64];
        for count in [50, MAX_FDS_PER_MESSAGE] {
            let fds = vec![file.as_raw_fd(); count];
            a.send_with_fds(&[&b"x"[..]], &fds).unwrap();
            let (n, got) = recv_with_fds(&b, &mut buf).unwrap();
            assert_eq!((n, got.fds.len(), got.truncated), (1, count, false));
        }
        let too_many = vec![file.as_raw_fd(); MAX_FDS_PER_MESSAGE + 1];
        assert!(a.send_with_fds(&[&b"x"[..]], &too_many).is_err());
    }

    /// A buffer too small: the read says it was truncated, and owns the fds that fitted.
    #[test]
    fn a_truncated_read_says_so_and_owns_what_fitted() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        a.send_with_fds(&[&b"x"[..]], &[file.as_raw_fd(); 5])
            .unwrap();
        let mut buf = [0u8; 8];
        let (n, got) = recv_with_room(&b, &mut buf, 2).unwrap();
        assert_eq!((n, got.fds.len(), got.truncated), (1, 2, true));
        for fd in &got.fds {
            assert_ne!(fd.as_raw_fd(), file.as_raw_fd());
            assert!(crate::host::sys::fds::duplicate(fd.as_raw_fd()).is_some());
        }
    }
}
