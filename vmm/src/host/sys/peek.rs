//! What waits in a connected socket's receive queue, looked at without taking it: the API
//! server asks before it closes an idle connection, so that it never closes one whose client
//! has already sent (part of) a request.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// What a socket's receive queue holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// Nothing: the peer has sent nothing not yet read.
    Empty,
    /// At least one byte.
    Data,
    /// Nothing, and the peer has closed its end (or shut down its writing).
    Closed,
}

/// Looks at `stream`'s receive queue without blocking and without taking anything from it.
pub fn receive_queue(stream: &UnixStream) -> io::Result<Queue> {
    let mut byte = [0u8; 1];
    // SAFETY: recv(2) writes at most 1 byte (the length passed) into `byte`, which outlives the
    // call; the descriptor is `stream`'s, open for as long as `stream` is borrowed. MSG_PEEK
    // leaves the byte in the queue and MSG_DONTWAIT makes the call return at once.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            byte.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => Ok(Queue::Closed),
        n if n > 0 => Ok(Queue::Data),
        _ => {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => Ok(Queue::Empty),
                io::ErrorKind::Interrupted => receive_queue(stream),
                _ => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::Shutdown;

    use super::*;

    #[test]
    fn the_queue_is_seen_and_left_as_it_is() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        assert_eq!(receive_queue(&b).unwrap(), Queue::Empty);
        a.write_all(b"GET").unwrap();
        assert_eq!(receive_queue(&b).unwrap(), Queue::Data);
        assert_eq!(receive_queue(&b).unwrap(), Queue::Data);
        let mut buf = [0u8; 8];
        assert_eq!(b.read(&mut buf).unwrap(), 3);
        assert_eq!(receive_queue(&b).unwrap(), Queue::Empty);
        a.shutdown(Shutdown::Write).unwrap();
        assert_eq!(receive_queue(&b).unwrap(), Queue::Closed);
    }

    /// What the API server relies on: once it shuts down its reading, a client's write fails
    /// (EPIPE) instead of landing in a queue the server would then close unread, and what
    /// landed before is still there to be read.
    #[test]
    fn after_a_read_shutdown_the_peer_cannot_send_and_earlier_bytes_stay() {
        let (mut client, server) = UnixStream::pair().unwrap();
        client.write_all(b"PUT").unwrap();
        server.shutdown(Shutdown::Read).unwrap();
        assert_eq!(receive_queue(&server).unwrap(), Queue::Data);
        let err = client.write_all(b" /api").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        let mut buf = [0u8; 8];
        assert_eq!((&server).read(&mut buf).unwrap(), 3);
        assert_eq!(receive_queue(&server).unwrap(), Queue::Closed);
    }
}
