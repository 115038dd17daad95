//! Reading a Unix stream socket with the file descriptors sent along (`SCM_RIGHTS`): Cloud
//! Hypervisor's clients (ch-remote, Kata) send a tap's fd with the first bytes of a
//! `vm.add-net` request.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Most descriptors taken from one read; more are closed by the kernel (`MSG_CTRUNC`).
pub const MAX_FDS: usize = 8;

/// Reads into `buf` like `read`, and takes the descriptors that came with those bytes
/// (close-on-exec, owned: dropping them closes them).
pub fn recv_with_fds(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    // SAFETY: CMSG_SPACE only computes a size from its argument.
    let space = unsafe { libc::CMSG_SPACE(u32::try_from(MAX_FDS * 4).unwrap_or(0)) };
    let mut control = vec![0u64; usize::try_from(space).unwrap_or(0).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid (no name, no iovecs, no control).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = std::ptr::addr_of_mut!(iov);
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() * 8;
    // SAFETY: recvmsg writes at most `iov_len` bytes into `buf` and at most `msg_controllen`
    // bytes into `control`, both of which outlive the call; `msg` points only at them.
    let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    let mut fds = Vec::new();
    // SAFETY: `msg` was filled by recvmsg above; CMSG_FIRSTHDR/CMSG_NXTHDR walk its control
    // buffer within `msg_controllen`, and return null at its end.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: `cmsg` is a non-null header inside `control` (see above).
        let header = unsafe { &*cmsg };
        if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN only computes a size.
            let empty = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = (header.cmsg_len - empty) / 4;
            // SAFETY: an SCM_RIGHTS message's data is `count` ints inside the control buffer.
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<libc::c_int>();
            for i in 0..count {
                // SAFETY: `i < count`, in the message's data; read unaligned as the data
                // need not be aligned for an int.
                let fd = unsafe { data.add(i).read_unaligned() };
                // SAFETY: the kernel just installed `fd` in this process for us: nothing
                // else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        // SAFETY: as CMSG_FIRSTHDR above.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok((n, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn bytes_and_the_fds_sent_with_them_are_read() {
        use vmm_sys_util::sock_ctrl_msg::ScmSocket;
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        a.send_with_fd(&b"PUT /api/v1/vm.add-net"[..], file.as_fd().as_raw_fd())
            .unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"PUT /api/v1/vm.add-net");
        assert_eq!(fds.len(), 1);
        assert_ne!(fds[0].as_raw_fd(), file.as_raw_fd());
        (&a).write_all(b"x").unwrap();
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((n, fds.len()), (1, 0));
    }
}
