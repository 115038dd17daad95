//! A host tap device as a virtio-net backend: `/dev/net/tun` attached to an existing tap with
//! `TUNSETIFF` (`IFF_TAP | IFF_NO_PI`: whole Ethernet frames, no packet-information prefix, no
//! virtio-net header, so the tap hands lull no offloaded (GSO) packets and the device adds and
//! strips its 12-byte header itself), non-blocking and close-on-exec.
//!
//! lull attaches only to a tap that exists: `TUNSETIFF` would create a missing one when lull
//! has CAP_NET_ADMIN, but such a tap is down and has no address, which would only hide a
//! typo. So the name is looked up first (`if_nametoindex`, in lull's network namespace).
//! Errors say what to do: create the tap, give lull's user access to it, free it.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use devices::virtio::net::NetBackend;

/// The clone device every tap is attached through.
pub const TUN_PATH: &str = "/dev/net/tun";

/// Why a tap cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// No interface has the name (in lull's network namespace).
    #[error(
        "Tap device {name} does not exist: create it first, e.g. \
         `ip tuntap add dev {name} mode tap && ip link set {name} up`"
    )]
    NoSuchDevice {
        /// The name.
        name: String,
    },
    /// `/dev/net/tun` cannot be opened.
    #[error("Cannot open {TUN_PATH} for tap {name}: {source} (is the tun module loaded, and may lull's user read and write it?)")]
    OpenTun {
        /// The tap.
        name: String,
        /// Why.
        source: io::Error,
    },
    /// The tap belongs to another user or group and lull lacks CAP_NET_ADMIN.
    #[error(
        "No permission to attach to tap {name}: create it for lull's user \
         (`ip tuntap add dev {name} mode tap user USER`) or run lull with CAP_NET_ADMIN"
    )]
    Permission {
        /// The tap.
        name: String,
    },
    /// Another process (or another `--net`) has the tap open.
    #[error("Tap {name} is busy: another process has it open; stop it or use another tap")]
    Busy {
        /// The tap.
        name: String,
    },
    /// The interface exists but is not a tap (a tun, a bridge, a physical device...).
    #[error("{name} is not a tap device (`ip -d link show {name}` says what it is): use a tap, `ip tuntap add dev NAME mode tap`")]
    NotATap {
        /// The interface.
        name: String,
    },
    /// A file descriptor given for a tap is not open.
    #[error("File descriptor {fd} is not open: pass the tap's fd to lull (keep it open, without close-on-exec)")]
    BadFd {
        /// The descriptor.
        fd: RawFd,
    },
    /// A file descriptor given for a tap is not a tap (`TUNGETIFF` refuses it, or its
    /// device is a tun).
    #[error("File descriptor {fd} is not a tap: give the fd of /dev/net/tun attached to a tap (IFF_TAP)")]
    FdNotATap {
        /// The descriptor.
        fd: RawFd,
    },
    /// A tap fd whose frames carry a packet-information or virtio-net header.
    #[error(
        "The tap of file descriptor {fd} ({name}) was attached with {flag}: lull's virtio-net \
         needs whole Ethernet frames (IFF_TAP | IFF_NO_PI, no IFF_VNET_HDR)"
    )]
    FdFraming {
        /// The descriptor.
        fd: RawFd,
        /// The tap.
        name: String,
        /// The flag in the way.
        flag: &'static str,
    },
    /// Any other refusal of `TUNSETIFF`.
    #[error("Cannot attach to tap {name}: {source}")]
    Attach {
        /// The tap.
        name: String,
        /// Why.
        source: io::Error,
    },
}

/// An attached tap: frames in and out, without blocking.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Attaches to the existing tap `name` (at most 15 bytes, checked by the configuration).
    pub fn open(name: &str) -> Result<Self, TapError> {
        let owned = || name.to_string();
        if !interface_exists(name) {
            return Err(TapError::NoSuchDevice { name: owned() });
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(TUN_PATH)
            .map_err(|source| TapError::OpenTun {
                name: owned(),
                source,
            })?;
        let mut ifr = libc::ifreq {
            ifr_name: [0; libc::IFNAMSIZ],
            ifr_ifru: libc::__c_anonymous_ifr_ifru {
                ifru_flags: short(libc::IFF_TAP | libc::IFF_NO_PI),
            },
        };
        // Leave the last byte NUL: names are at most IFNAMSIZ - 1 bytes.
        for (dst, src) in ifr.ifr_name[..libc::IFNAMSIZ - 1]
            .iter_mut()
            .zip(name.bytes())
        {
            *dst = libc::c_char::from_ne_bytes([src]);
        }
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `ifr` is and which
        // outlives the call; the fd is /dev/net/tun, owned by `file`.
        let rc = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                libc::TUNSETIFF,
                std::ptr::addr_of_mut!(ifr),
            )
        };
        if rc != 0 {
            let source = io::Error::last_os_error();
            return Err(match source.raw_os_error() {
                Some(libc::EPERM | libc::EACCES) => TapError::Permission { name: owned() },
                Some(libc::EBUSY) => TapError::Busy { name: owned() },
                Some(libc::EINVAL) => TapError::NotATap { name: owned() },
                _ => TapError::Attach {
                    name: owned(),
                    source,
                },
            });
        }
        Ok(Self {
            file,
            name: owned(),
        })
    }

    /// The tap already attached behind the open descriptor `fd` (inherited with `--net fd=N`,
    /// or received over the API socket and kept open by the caller): a duplicate of it,
    /// non-blocking, once `TUNGETIFF` says it is a tap that hands over whole Ethernet frames.
    pub fn from_fd(fd: RawFd) -> Result<Self, TapError> {
        // SAFETY: F_GETFD only reads the descriptor's flags; it fails with EBADF if `fd` is
        // not open, and nothing is done with `fd` then.
        if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(TapError::BadFd { fd });
        }
        // SAFETY: `fd` is open (above) and is only borrowed for the dup below, within this
        // call; the caller keeps it open (its documented contract).
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let file = File::from(
            borrowed
                .try_clone_to_owned()
                .map_err(|_| TapError::BadFd { fd })?,
        );
        let mut ifr = libc::ifreq {
            ifr_name: [0; libc::IFNAMSIZ],
            ifr_ifru: libc::__c_anonymous_ifr_ifru { ifru_flags: 0 },
        };
        // SAFETY: TUNGETIFF writes one `struct ifreq`, which `ifr` is and which outlives the
        // call; on any other file than a tun/tap it fails (EBADFD, ENOTTY, EINVAL).
        let rc = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                libc::TUNGETIFF,
                std::ptr::addr_of_mut!(ifr),
            )
        };
        // SAFETY: TUNGETIFF succeeded and set the flags member of the union.
        let flags = libc::c_int::from(unsafe { ifr.ifr_ifru.ifru_flags });
        if rc != 0 || flags & libc::IFF_TAP == 0 {
            return Err(TapError::FdNotATap { fd });
        }
        let name: String = ifr
            .ifr_name
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| char::from(c.to_ne_bytes()[0]))
            .collect();
        let framing = |flag| TapError::FdFraming {
            fd,
            name: name.clone(),
            flag,
        };
        if flags & libc::IFF_NO_PI == 0 {
            return Err(framing("packet information (no IFF_NO_PI)"));
        }
        if flags & libc::IFF_VNET_HDR != 0 {
            return Err(framing("IFF_VNET_HDR"));
        }
        // SAFETY: F_GETFL/F_SETFL read and set the status flags of `file`'s descriptor (shared
        // with the original: the sender's copy becomes non-blocking too, as in Cloud
        // Hypervisor).
        let nonblocking = unsafe {
            let fl = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
            fl >= 0 && libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !nonblocking {
            return Err(TapError::Attach {
                name,
                source: io::Error::last_os_error(),
            });
        }
        Ok(Self { file, name })
    }

    /// The attached descriptor, given away (e.g. to a child process that takes the tap as
    /// `--net fd=N`).
    pub fn into_fd(self) -> std::os::fd::OwnedFd {
        self.file.into()
    }

    /// The tap's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// `flags` as the `short` of `ifr_flags` (the IFF_ bits lull uses fit in 15 bits).
fn short(flags: libc::c_int) -> libc::c_short {
    libc::c_short::try_from(flags).unwrap_or(0)
}

/// Whether an interface named `name` exists in this network namespace.
pub fn interface_exists(name: &str) -> bool {
    let Ok(c_name) = CString::new(name) else {
        return false;
    };
    // SAFETY: if_nametoindex reads the NUL-terminated string `c_name`, which outlives the
    // call; it returns 0 for an unknown name.
    unsafe { libc::if_nametoindex(c_name.as_ptr()) != 0 }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl NetBackend for Tap {
    /// One `read`: the tap hands over one frame per read, `WouldBlock` when its queue is empty.
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.file.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    /// One `write` per frame (a tap takes a frame whole or not at all).
    fn write_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        loop {
            match self.file.write(frame) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
                Ok(n) if n == frame.len() => return Ok(()),
                Ok(_) => return Err(io::ErrorKind::WriteZero.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fd_that_is_not_an_open_tap_is_refused() {
        assert!(matches!(Tap::from_fd(-1), Err(TapError::BadFd { fd: -1 })));
        let file = File::open("/dev/null").unwrap();
        let raw = file.as_raw_fd();
        let e = Tap::from_fd(raw).unwrap_err();
        assert!(matches!(e, TapError::FdNotATap { .. }), "{e}");
        drop(file);
        assert!(matches!(Tap::from_fd(raw), Err(TapError::BadFd { .. })));
    }

    #[test]
    fn a_missing_tap_is_refused_before_tun_is_touched() {
        let e = Tap::open("lull-no-such0").unwrap_err();
        assert!(matches!(e, TapError::NoSuchDevice { .. }), "{e}");
        assert!(e.to_string().contains("ip tuntap add dev lull-no-such0"));
    }

    /// `lo` exists in every network namespace (the kernel creates it with the namespace) and
    /// is no tap: `TUNSETIFF` answers EINVAL for an existing interface of another kind before
    /// it checks any permission (`drivers/net/tun.c`, `tun_set_iff`). So the one error is
    /// decided by whether this host lets us open the clone device at all.
    #[test]
    fn an_interface_that_is_not_a_tap_is_refused() {
        assert!(
            interface_exists("lo"),
            "no loopback device in this namespace"
        );
        let tun_opens = OpenOptions::new()
            .read(true)
            .write(true)
            .open(TUN_PATH)
            .is_ok();
        match (tun_opens, Tap::open("lo")) {
            (true, Err(TapError::NotATap { name }))
            | (false, Err(TapError::OpenTun { name, .. })) => {
                assert_eq!(name, "lo");
            }
            (tun_opens, other) => {
                panic!("attaching to lo ({TUN_PATH} opens: {tun_opens}): {other:?}")
            }
        }
    }
}
