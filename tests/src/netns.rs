//! A network namespace with a tap for the virtio-net tests (`virtio_net.rs`, `libvirt.rs`):
//! `lulltap0` at 10.0.2.1/24, up; the kit's Linux at [`GUEST_ADDR`] behind it, configured by
//! [`GUEST_IP_CONFIG`] on its command line. Deleted, tap and all, on drop.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::{sh, Failed};

/// The tap in the namespace.
pub const TAP: &str = "lulltap0";
/// The kit's Linux's address, on the tap's /24.
pub const GUEST_ADDR: &str = "10.0.2.15";
/// The kernel's IP autoconfiguration (IP_PNP) for eth0: [`GUEST_ADDR`], the tap as gateway.
pub const GUEST_IP_CONFIG: &str = "ip=10.0.2.15::10.0.2.1:255.255.255.0::eth0:off";

/// A network namespace with [`TAP`] (10.0.2.1/24, up); deleted, tap and all, on drop.
pub struct Netns {
    /// Its name (`ip netns exec NAME ...`).
    pub name: String,
}

impl Netns {
    /// A new namespace for test `test`, its loopback and [`TAP`] up.
    pub fn new(test: &str) -> Result<Self, Failed> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("lull-{}-{n}-{test}", std::process::id());
        sh("ip", &["netns", "add", &name])?;
        // From here on, drop deletes it whatever fails next.
        let ns = Self { name };
        ns.exec("ip", &["link", "set", "lo", "up"])?;
        ns.exec("ip", &["tuntap", "add", "dev", TAP, "mode", "tap"])?;
        ns.exec("ip", &["addr", "add", "10.0.2.1/24", "dev", TAP])?;
        ns.exec("ip", &["link", "set", TAP, "up"])?;
        Ok(ns)
    }

    /// `ip netns exec NS PROGRAM ARGS...`: its stdout.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String, Failed> {
        let mut all = vec!["netns", "exec", &self.name, program];
        all.extend_from_slice(args);
        sh("ip", &all)
    }

    /// The words that run a command in the namespace under `ip`.
    pub fn wrapper(&self) -> [&str; 3] {
        ["netns", "exec", &self.name]
    }

    /// Pings the guest ([`GUEST_ADDR`]) until it answers, up to `within`.
    pub fn ping_guest(&self, within: Duration) -> Result<(), Failed> {
        let deadline = Instant::now() + within;
        loop {
            let last = self.exec("ping", &["-c", "1", "-W", "2", GUEST_ADDR]);
            if last.as_ref().is_ok_and(|t| t.contains("1 received")) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let why = match last {
                    Ok(text) => text,
                    Err(e) => e.message().unwrap_or("").to_string(),
                };
                return Err(format!("the guest did not answer pings in {within:?}: {why}").into());
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh("ip", &["netns", "del", &self.name]);
    }
}
