//! One `--net`: a host tap device behind a virtio-net device,
//! `tap=NAME[,mac=XX:XX:XX:XX:XX:XX][,bandwidth=BYTES][,ops=N][,burst=BYTES][,refill=D]`.
//!
//! Without `mac=`, the device's address is 52:54:00 (QEMU's locally administered prefix)
//! followed by three bytes of the FNV-1a hash of the tap's name: the same name gives the same
//! address on every run and every host, so a guest's ARP caches and DHCP leases stay valid.

use std::fmt;
use std::str::FromStr;

use devices::rate_limiter::{RateLimit, RateLimitError};

/// Bytes of an interface name, less its NUL (Linux's `IFNAMSIZ` - 1).
pub const TAP_NAME_MAX: usize = 15;

/// An Ethernet (MAC) address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The address lull gives the device of tap `name` when none is configured.
    pub fn derived(name: &str) -> Self {
        // FNV-1a (32-bit): stable across Rust versions, unlike std's hasher.
        let hash = name.bytes().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        let [a, b, c, _] = hash.to_be_bytes();
        Self([0x52, 0x54, 0x00, a, b, c])
    }
}

/// A `mac=` value that is not six hex octets of a unicast address.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "'{0}' is not a unicast MAC address: write six hex octets, e.g. 52:54:00:12:34:56 \
     (the first octet even)"
)]
pub struct MacAddrError(String);

impl FromStr for MacAddr {
    type Err = MacAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || MacAddrError(s.to_string());
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut mac {
            let part = parts.next().filter(|p| p.len() == 2).ok_or_else(bad)?;
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        // Bit 0 of the first octet marks a group (multicast) address: no device has one.
        if parts.next().is_some() || mac[0] & 1 != 0 {
            return Err(bad());
        }
        Ok(Self(mac))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// One `--net`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// The host tap device (it must exist or be creatable by lull: see `sys::tap`).
    pub tap: String,
    /// The device's MAC address; `None`: [`MacAddr::derived`] from the tap's name.
    pub mac: Option<MacAddr>,
    /// Rate limit of the frames the guest sends (`bandwidth=`, `ops=`, `burst=`, `refill=`).
    pub rate: RateLimit,
    /// An open descriptor of the tap, already attached (`--net fd=N` of the
    /// `cloud-hypervisor` command line, or an fd sent with `vm.add-net`), which lull uses
    /// instead of attaching to `tap` by name. Never read from a `--net` value or a JSON
    /// configuration (a client could name any of lull's descriptors); shown as `fd=N`.
    pub fd: Option<i32>,
}

impl NetConfig {
    /// The device's MAC address: the configured one or the one derived from the tap's name.
    pub fn mac(&self) -> MacAddr {
        self.mac.unwrap_or_else(|| MacAddr::derived(&self.tap))
    }
}

/// A `--net` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetConfigError {
    /// No `tap=`.
    #[error("'{0}' is not a network device: use tap=NAME[,mac=XX:XX:XX:XX:XX:XX]")]
    NoTap(String),
    /// A tap name Linux would refuse.
    #[error(
        "'{0}' is not a tap device name: use 1 to {TAP_NAME_MAX} characters, none of them \
         '/', ':', ',', '=' or white space"
    )]
    BadTapName(String),
    /// An option lull does not know.
    #[error(
        "Unknown --net option '{0}': the options are tap=NAME, mac=XX:XX:XX:XX:XX:XX, \
         bandwidth=BYTES (a second), ops=N (a second), burst=BYTES and refill=DURATION"
    )]
    UnknownOption(String),
    /// `fd=` in a `--net` value or a configuration.
    #[error(
        "--net fd=N is taken only on the cloud-hypervisor command line and from fds sent \
         with vm.add-net: name the tap (tap=NAME)"
    )]
    FdNotHere,
    /// A bad `mac=`.
    #[error("--net: {0}")]
    Mac(#[from] MacAddrError),
    /// A rate option with a bad value.
    #[error("--net: {0}")]
    Rate(#[from] RateLimitError),
}

fn valid_tap_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= TAP_NAME_MAX
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '/' | ':' | ',' | '=') || c.is_control())
}

impl FromStr for NetConfig {
    type Err = NetConfigError;

    /// `tap=NAME[,mac=MAC][,bandwidth=BYTES][,ops=N][,burst=BYTES][,refill=DURATION]`, the
    /// options in any order.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut tap = None;
        let mut mac = None;
        let mut rate = RateLimit::default();
        for option in s.split(',') {
            let (key, value) = option.split_once('=').unwrap_or((option, ""));
            if rate.apply_option(key, value)? {
                continue;
            }
            match key {
                "fd" => return Err(NetConfigError::FdNotHere),
                "tap" if valid_tap_name(value) => tap = Some(value.to_string()),
                "tap" => return Err(NetConfigError::BadTapName(value.to_string())),
                "mac" => mac = Some(value.parse()?),
                _ => return Err(NetConfigError::UnknownOption(option.to_string())),
            }
        }
        match tap {
            Some(tap) => Ok(Self {
                tap,
                mac,
                rate,
                fd: None,
            }),
            None => Err(NetConfigError::NoTap(s.to_string())),
        }
    }
}

impl fmt::Display for NetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tap={}", self.tap)?;
        if let Some(mac) = self.mac {
            write!(f, ",mac={mac}")?;
        }
        if let Some(fd) = self.fd {
            write!(f, ",fd={fd}")?;
        }
        write!(f, "{}", self.rate)
    }
}

crate::string_serde!(NetConfig);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nets_parse_and_round_trip() {
        let n: NetConfig = "tap=lulltap0".parse().unwrap();
        assert_eq!(n.tap, "lulltap0");
        assert_eq!(n.mac, None);
        assert_eq!(n.to_string(), "tap=lulltap0");
        let m: NetConfig = "mac=52:54:00:AB:cd:0e,tap=t1,ops=100".parse().unwrap();
        assert_eq!(m.mac(), MacAddr([0x52, 0x54, 0, 0xab, 0xcd, 0x0e]));
        assert_eq!(m.rate.ops_per_sec, 100);
        assert_eq!(m.to_string(), "tap=t1,mac=52:54:00:ab:cd:0e,ops=100");
        assert_eq!(m.to_string().parse::<NetConfig>(), Ok(m));
        let bad = |s: &str| s.parse::<NetConfig>().unwrap_err();
        assert_eq!(
            bad("mac=52:54:00:00:00:01"),
            NetConfigError::NoTap("mac=52:54:00:00:00:01".into())
        );
        assert!(matches!(bad("tap="), NetConfigError::BadTapName(_)));
        assert!(matches!(bad("tap=a/b"), NetConfigError::BadTapName(_)));
        assert!(matches!(
            bad("tap=sixteen-chars-xy"),
            NetConfigError::BadTapName(_)
        ));
        assert!(matches!(
            bad("tap=t,vhost=on"),
            NetConfigError::UnknownOption(_)
        ));
        assert!(matches!(bad("tap=t,ops=x"), NetConfigError::Rate(_)));
        assert_eq!(bad("tap=t,fd=3"), NetConfigError::FdNotHere);
        for mac in [
            "52:54:00:00:00",
            "52:54:00:00:00:00:00",
            "5:54:00:00:00:00",
            "zz:54:00:00:00:00",
            "01:00:5e:00:00:01",
            "",
        ] {
            assert!(
                matches!(bad(&format!("tap=t,mac={mac}")), NetConfigError::Mac(_)),
                "{mac}"
            );
        }
    }

    #[test]
    fn derived_macs_are_stable_local_unicast_and_differ_by_name() {
        let a = MacAddr::derived("lulltap0");
        assert_eq!(a, MacAddr::derived("lulltap0"));
        assert_ne!(a, MacAddr::derived("lulltap1"));
        assert_eq!(&a.0[..3], &[0x52, 0x54, 0x00]);
        // FNV-1a of "lulltap0" is 0xbc84f129: the address must not change between versions.
        assert_eq!(a.to_string(), "52:54:00:bc:84:f1");
        assert_eq!(a.to_string().parse::<MacAddr>(), Ok(a));
        let n: NetConfig = "tap=lulltap0".parse().unwrap();
        assert_eq!(n.mac(), a);
    }
}
