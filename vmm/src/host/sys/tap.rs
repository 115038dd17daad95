//! A host tap device as a virtio-net backend: `/dev/net/tun` attached to an existing tap with
//! `TUNSETIFF` (`IFF_TAP | IFF_NO_PI`: whole Ethernet frames, no packet-information prefix, no
//! virtio-net header, so the tap hands lull no offloaded (GSO) packets and the device adds and
//! strips its 12-byte header itself), non-blocking and close-on-exec.
//!
//! lull attaches only to a tap that exists: `TUNSETIFF` would create a missing one when lull
//! has CAP_NET_ADMIN, but such a tap is down and has no address, which would only hide a
//! typo. So the name is looked up first (`if_nametoindex`, in lull's network namespace).
//! Errors say what to do: create the tap, give lull's user access to it, free it.
//!
//! A tap given as an fd may carry a virtio-net header ahead of each frame (`IFF_VNET_HDR`: how
//! libvirt opens a tap for an interface whose model is virtio, and Cloud Hypervisor its own):
//! lull then turns the tap's offloads off (`TUNSETOFFLOAD` 0: the kernel hands it no GSO or
//! partly-checksummed packet, as lull offers the guest none), writes a zero header (no flags,
//! no GSO) of the tap's header size (`TUNGETVNETHDRSZ`) ahead of each frame it sends, and
//! skips the one ahead of each frame it receives.
//!
//! nix does the rest safely (`if_nametoindex`, `fcntl`); the `unsafe` blocks left are the
//! `TUNSETIFF`, `TUNGETIFF`, `TUNGETVNETHDRSZ` and `TUNSETOFFLOAD` ioctls, which neither nix
//! nor vmm-sys-util wraps safely (their ioctl helpers are `unsafe` functions: the kernel's
//! argument type is not checked).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use devices::virtio::net::{NetBackend, FRAME_MAX};
use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// The clone device every tap is attached through.
pub const TUN_PATH: &str = "/dev/net/tun";
/// `TUNGETVNETHDRSZ` (`_IOR('T', 215, int)`): the size of an `IFF_VNET_HDR` tap's header.
pub const TUNGETVNETHDRSZ: u64 = 0x8004_54d7;
/// `TUNSETOFFLOAD` (`_IOW('T', 208, unsigned int)`): the offloads the tap may hand over.
pub const TUNSETOFFLOAD: u64 = 0x4004_54d0;
/// The header sizes lull takes: `struct virtio_net_hdr` (10, the default) up to
/// `virtio_net_hdr_v1_hash` (20).
const VNET_HDR_SIZES: std::ops::RangeInclusive<usize> = 10..=20;

/// How a message names a tap descriptor given to lull: by the number its giver chose (`--net
/// fd=N`), or as the one sent with an API request (its number in lull means nothing to the
/// client, so it is not said).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapFd {
    /// Known by this number.
    Number(RawFd),
    /// Sent with the request (`SCM_RIGHTS`).
    Sent,
}

impl fmt::Display for TapFd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(fd) => write!(f, "File descriptor {fd}"),
            Self::Sent => write!(f, "The fd sent with the request"),
        }
    }
}

/// `struct ifreq` as the tun ioctls use it: the name, then the flags (a `short`), padded to
/// the union's size. A struct of lull's, so reading the flags back needs no union access.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    pad: [u8; 22],
}

const _: () = assert!(std::mem::size_of::<IfReq>() == std::mem::size_of::<libc::ifreq>());

impl IfReq {
    fn new(name: &str, flags: libc::c_short) -> Self {
        let mut req = Self {
            name: [0; libc::IFNAMSIZ],
            flags,
            pad: [0; 22],
        };
        // Leave the last byte NUL: names are at most IFNAMSIZ - 1 bytes.
        for (dst, src) in req.name[..libc::IFNAMSIZ - 1].iter_mut().zip(name.bytes()) {
            *dst = src;
        }
        req
    }

    fn name(&self) -> String {
        let end = self
            .name
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(self.name.len());
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

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
    #[error("{fd} is not open: pass the tap's fd to lull (keep it open, without close-on-exec)")]
    BadFd {
        /// The descriptor.
        fd: TapFd,
    },
    /// A file descriptor given for a tap is not a tap (`TUNGETIFF` refuses it, or its
    /// device is a tun).
    #[error("{fd} is not a tap: give the fd of /dev/net/tun attached to a tap (IFF_TAP)")]
    FdNotATap {
        /// The descriptor.
        fd: TapFd,
    },
    /// A tap fd whose frames carry a packet-information prefix, or a virtio-net header lull
    /// cannot use.
    #[error(
        "{fd} is a tap ({name}) attached with {flag}: lull's virtio-net needs Ethernet frames \
         without a packet-information prefix (IFF_TAP | IFF_NO_PI; IFF_VNET_HDR taken)"
    )]
    FdFraming {
        /// The descriptor.
        fd: TapFd,
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
    /// The size of the virtio-net header ahead of each frame (`IFF_VNET_HDR`), 0 without.
    vnet_hdr: usize,
    /// Where a frame and its header are read, with `IFF_VNET_HDR`.
    scratch: Vec<u8>,
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
        let mut ifr = IfReq::new(name, short(libc::IFF_TAP | libc::IFF_NO_PI));
        // SAFETY: no safe wrapper serves (see the module's comment). TUNSETIFF reads and
        // writes one `struct ifreq`, which `ifr` is (same size and layout) and which outlives
        // the call; the fd is /dev/net/tun, owned by `file`.
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
            vnet_hdr: 0,
            scratch: Vec::new(),
        })
    }

    /// The tap already attached behind the open descriptor `fd` (inherited with `--net fd=N`,
    /// or received over the API socket and kept open by the caller): a duplicate of it,
    /// non-blocking, once `TUNGETIFF` says it is a tap that hands over whole Ethernet frames.
    pub fn from_fd(fd: RawFd) -> Result<Self, TapError> {
        let label = TapFd::Number(fd);
        let file = super::fds::duplicate(fd).ok_or(TapError::BadFd { fd: label })?;
        Self::from_file(File::from(file), label)
    }

    /// [`Tap::from_fd`] for the descriptor sent with an API request (`fd`), which errors do
    /// not name by lull's number.
    pub fn from_sent(fd: BorrowedFd<'_>) -> Result<Self, TapError> {
        let label = TapFd::Sent;
        let file = fd
            .try_clone_to_owned()
            .map_err(|_| TapError::BadFd { fd: label })?;
        Self::from_file(File::from(file), label)
    }

    /// `file`, a duplicate of the descriptor `fd` names, if it is a tap lull can use.
    fn from_file(file: File, fd: TapFd) -> Result<Self, TapError> {
        let mut ifr = IfReq::new("", 0);
        // SAFETY: no safe wrapper serves (see the module's comment). TUNGETIFF writes one
        // `struct ifreq`, which `ifr` is (same size and layout) and which outlives the call;
        // on any other file than a tun/tap it fails (EBADFD, ENOTTY, EINVAL).
        let rc = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                libc::TUNGETIFF,
                std::ptr::addr_of_mut!(ifr),
            )
        };
        let flags = libc::c_int::from(ifr.flags);
        if rc != 0 || flags & libc::IFF_TAP == 0 {
            return Err(TapError::FdNotATap { fd });
        }
        let name = ifr.name();
        let framing = |flag| TapError::FdFraming {
            fd,
            name: name.clone(),
            flag,
        };
        if flags & libc::IFF_NO_PI == 0 {
            return Err(framing("packet information (no IFF_NO_PI)"));
        }
        let vnet_hdr = if flags & libc::IFF_VNET_HDR != 0 {
            vnet_header(&file).ok_or_else(|| framing("IFF_VNET_HDR of a size lull cannot use"))?
        } else {
            0
        };
        // The status flags are the open file's, shared with the giver's descriptor: the
        // sender's copy becomes non-blocking too, as in Cloud Hypervisor.
        let nonblocking = fcntl(&file, FcntlArg::F_GETFL).and_then(|fl| {
            let fl = OFlag::from_bits_truncate(fl) | OFlag::O_NONBLOCK;
            fcntl(&file, FcntlArg::F_SETFL(fl))
        });
        if let Err(errno) = nonblocking {
            return Err(TapError::Attach {
                name,
                source: errno.into(),
            });
        }
        Ok(Self {
            file,
            name,
            vnet_hdr,
            scratch: vec![
                0;
                if vnet_hdr > 0 {
                    vnet_hdr + FRAME_MAX
                } else {
                    0
                }
            ],
        })
    }

    /// The size of the virtio-net header ahead of each frame (`IFF_VNET_HDR`), 0 without.
    pub fn vnet_header_size(&self) -> usize {
        self.vnet_hdr
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

/// The header size of the `IFF_VNET_HDR` tap `file`, its offloads turned off; `None` if either
/// fails or the size is not one lull takes.
fn vnet_header(file: &File) -> Option<usize> {
    let mut size: libc::c_int = 0;
    // SAFETY: no safe wrapper serves (see the module's comment). TUNGETVNETHDRSZ writes one
    // `int`, which `size` is and which outlives the call; the fd is a tap (TUNGETIFF said so).
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::TUNGETVNETHDRSZ,
            std::ptr::addr_of_mut!(size),
        )
    };
    let size = usize::try_from(size)
        .ok()
        .filter(|s| VNET_HDR_SIZES.contains(s));
    if rc != 0 {
        return None;
    }
    // SAFETY: as above; TUNSETOFFLOAD takes its argument by value (an unsigned long of
    // TUN_F_* bits; 0: none), so no memory is passed.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETOFFLOAD, 0 as libc::c_ulong) };
    (rc == 0).then_some(size).flatten()
}

/// `flags` as the `short` of `ifr_flags` (the IFF_ bits lull uses fit in 15 bits).
fn short(flags: libc::c_int) -> libc::c_short {
    libc::c_short::try_from(flags).unwrap_or(0)
}

/// Whether an interface named `name` exists in this network namespace.
pub fn interface_exists(name: &str) -> bool {
    nix::net::if_::if_nametoindex(name).is_ok()
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl NetBackend for Tap {
    /// One `read`: the tap hands over one frame per read, `WouldBlock` when its queue is empty
    /// (with `IFF_VNET_HDR`, the header ahead of it skipped).
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let read = if self.vnet_hdr == 0 {
                self.file.read(buf)
            } else {
                self.file.read(&mut self.scratch).and_then(|n| {
                    let frame = self
                        .scratch
                        .get(self.vnet_hdr..n)
                        .ok_or(io::ErrorKind::InvalidData)?;
                    let len = frame.len().min(buf.len());
                    buf[..len].copy_from_slice(&frame[..len]);
                    Ok(len)
                })
            };
            match read {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    /// One `write` per frame (a tap takes a frame whole or not at all; with `IFF_VNET_HDR`, a
    /// zero header ahead of it, in the same `writev`).
    fn write_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        const ZEROS: [u8; 20] = [0; 20];
        let header = &ZEROS[..self.vnet_hdr];
        let whole = header.len() + frame.len();
        loop {
            match self
                .file
                .write_vectored(&[IoSlice::new(header), IoSlice::new(frame)])
            {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
                Ok(n) if n == whole => return Ok(()),
                Ok(_) => return Err(io::ErrorKind::WriteZero.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_numbers_the_seccomp_filter_allows_are_libc_s() {
        assert_eq!(TUNGETVNETHDRSZ, libc::TUNGETVNETHDRSZ);
        assert_eq!(TUNSETOFFLOAD, libc::TUNSETOFFLOAD);
    }

    #[test]
    fn an_fd_that_is_not_an_open_tap_is_refused() {
        assert!(matches!(
            Tap::from_fd(-1),
            Err(TapError::BadFd {
                fd: TapFd::Number(-1)
            })
        ));
        let file = File::open("/dev/null").unwrap();
        let raw = file.as_raw_fd();
        let e = Tap::from_fd(raw).unwrap_err();
        assert!(matches!(e, TapError::FdNotATap { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("File descriptor {raw} ")),
            "{e}"
        );
        // One sent with a request is not named by lull's number for it.
        use std::os::fd::AsFd;
        let e = Tap::from_sent(file.as_fd()).unwrap_err();
        assert!(matches!(e, TapError::FdNotATap { fd: TapFd::Sent }), "{e}");
        assert!(!e.to_string().contains(&raw.to_string()), "{e}");
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
