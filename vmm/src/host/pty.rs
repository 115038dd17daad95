//! A pseudo-terminal for the guest's serial console (`--serial pty`, Cloud Hypervisor's
//! `"serial": {"mode": "Pty"}`): lull holds the main side, a client (`virsh console`,
//! `screen PATH`) opens the other side by its path, which `vm.info` reports as Cloud
//! Hypervisor does (`config.serial.file`).
//!
//! ```text
//!  guest UART ──output──► main (non-blocking; a full pty drops output, never stalls a vCPU)
//!  guest UART ◄──input─── main ◄── /dev/pts/N ◄── virsh console
//! ```
//! lull keeps the other side open too, in raw mode, for the VM's life: the pty exists (and
//! buffers the guest's first output) before any client opens it, and a client that comes and
//! goes hangs nothing up. Safe code over nix, in as few system calls as the seccomp filter of
//! the thread that builds a VM must allow ([`OPEN_FLAGS`], `TIOCSPTLCK`, `TIOCGPTN`, `TCGETS`,
//! `TCSETS`): `/dev/ptmx` opened, unlocked, its number asked, `/dev/pts/N` opened.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};

/// `open(2)` flags of both sides (the seccomp filters allow exactly these).
pub const OPEN_FLAGS: i32 = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
/// `TIOCSPTLCK` (`_IOW('T', 0x31, int)`): the pty's other side unlocked.
pub const TIOCSPTLCK: u64 = 0x4004_5431;
/// `TIOCGPTN` (`_IOR('T', 0x30, unsigned int)`): the pty's number, for its path.
pub const TIOCGPTN: u64 = 0x8004_5430;

/// An open pseudo-terminal.
#[derive(Debug)]
pub struct Pty {
    main: Arc<File>,
    /// The client side, held open so that the pty outlives its clients.
    _other: File,
    path: PathBuf,
}

impl Pty {
    /// Opens a new pseudo-terminal: its client side in raw mode, its main side non-blocking;
    /// both close-on-exec.
    pub fn open() -> io::Result<Self> {
        let ptmx = nix::pty::posix_openpt(OFlag::from_bits_retain(OPEN_FLAGS))?;
        nix::pty::unlockpt(&ptmx)?;
        let path = PathBuf::from(nix::pty::ptsname_r(&ptmx)?);
        let main = File::from(ptmx.as_fd().try_clone_to_owned()?);
        drop(ptmx);
        let other = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(&path)?;
        let flags = OFlag::from_bits_truncate(fcntl(&main, FcntlArg::F_GETFL)?);
        fcntl(&main, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
        let mut mode = tcgetattr(other.as_fd())?;
        cfmakeraw(&mut mode);
        tcsetattr(other.as_fd(), SetArg::TCSANOW, &mode)?;
        Ok(Self {
            main: Arc::new(main),
            _other: other,
            path,
        })
    }

    /// The main side: the guest's output is written to it, its input read from it.
    pub fn main(&self) -> Arc<File> {
        self.main.clone()
    }

    /// The path a client opens (`/dev/pts/N`).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn what_is_written_to_one_side_is_read_from_the_other_unchanged() {
        let pty = Pty::open().unwrap();
        assert!(
            pty.path().starts_with("/dev/pts"),
            "{}",
            pty.path().display()
        );
        let mut client = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(pty.path())
            .unwrap();
        // Raw: no "\n" -> "\r\n", no echo, no line buffering.
        (&*pty.main()).write_all(b"out\n").unwrap();
        let mut buf = [0u8; 4];
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"out\n");
        client.write_all(b"in").unwrap();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < 2 && std::time::Instant::now() < deadline {
            let mut b = [0u8; 8];
            match (&*pty.main()).read(&mut b) {
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, b"in");
    }
}
