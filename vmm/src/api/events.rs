//! Cloud Hypervisor's event monitor (`--event-monitor path=P|fd=N`): a JSON record for each
//! step of the VMM's and the VM's life, which libvirt's ch driver reads from a FIFO to learn
//! that the VM stopped (`vm`/`vmm` `shutdown`).
//!
//! Each record is what Cloud Hypervisor writes (`event_monitor/src/lib.rs`, its event-monitor
//! thread): the event pretty-printed by serde, then a blank line.
//!
//! ```text
//! {
//!   "timestamp": {
//!     "secs": 0,
//!     "nanos": 29228206
//!   },
//!   "source": "vm",
//!   "event": "booted",
//!   "properties": null
//! }
//!
//! ```
//! `timestamp` is the time since the monitor was opened. The events lull writes, and when:
//!
//! | source | event | when |
//! |---|---|---|
//! | `vmm` | `starting` | the monitor is opened, before the API serves |
//! | `vm` | `booting`, `booted` | `vm.boot` (`booted` once every vCPU runs) |
//! | `vm` | `pausing`, `paused`, `resuming`, `resumed` | `vm.pause`, `vm.resume` |
//! | `vm` | `snapshotting`, `snapshotted` | `vm.snapshot` |
//! | `vm` | `restoring`, `restored` | `vm.restore`, `--restore` |
//! | `vm` | `rebooting`, `booting`, `booted`, `rebooted` | `vm.reboot` (no `shutdown` in between) |
//! | `vm` | `shutdown` | the VM stopped: `vm.shutdown`, `vm.delete`, a signal, the guest's own stop |
//! | `vm` | `deleted` | `vm.delete` |
//! | `vmm` | `shutdown` | lull ends: `vmm.shutdown`, a signal |
//!
//! The file is written without blocking (as Cloud Hypervisor sets `O_NONBLOCK`): a reader that
//! stops reading loses records, lull never stalls on it.

use std::fs::File;
use std::io::Write;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::ch::cli::EventMonitorArg;
use crate::host::files;
use crate::host::sys::fds;

/// Why the event monitor cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum EventMonitorError {
    /// The path cannot be opened for writing.
    #[error("--event-monitor path={path}: {source}")]
    Open {
        /// The path given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The fd given is not open.
    #[error(
        "--event-monitor fd={0}: the descriptor is not open: pass it to lull without close-on-exec"
    )]
    NotOpen(RawFd),
    /// The fd given cannot be made non-blocking.
    #[error("--event-monitor fd={fd}: {source}")]
    Fd {
        /// The fd given.
        fd: RawFd,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// One record, as Cloud Hypervisor serializes it.
#[derive(Serialize)]
struct Record<'a> {
    timestamp: Duration,
    source: &'a str,
    event: &'a str,
    properties: Option<()>,
}

/// Where the events go: nowhere, or a file (FIFO) opened at start.
#[derive(Default)]
pub struct EventMonitor {
    out: Option<(File, Instant)>,
}

impl EventMonitor {
    /// A monitor that writes nothing (no `--event-monitor`).
    pub fn none() -> Self {
        Self::default()
    }

    /// Opens `target` (a FIFO waits for its reader) and writes `vmm` `starting`.
    pub fn open(target: &EventMonitorArg) -> Result<Self, EventMonitorError> {
        let file = match target {
            EventMonitorArg::Path(path) => {
                files::open_event_monitor(path).map_err(|source| EventMonitorError::Open {
                    path: path.clone(),
                    source,
                })?
            }
            EventMonitorArg::Fd(fd) => {
                let owned = fds::claim_inherited(*fd).ok_or(EventMonitorError::NotOpen(*fd))?;
                let file = File::from(owned);
                set_nonblocking(&file)
                    .map_err(|source| EventMonitorError::Fd { fd: *fd, source })?;
                file
            }
        };
        let mut monitor = Self::to(file);
        monitor.vmm("starting");
        Ok(monitor)
    }

    /// A monitor writing to `file` as it is.
    fn to(file: File) -> Self {
        Self {
            out: Some((file, Instant::now())),
        }
    }

    /// Writes the `vm` event `event`.
    pub fn vm(&mut self, event: &str) {
        self.write("vm", event);
    }

    /// Writes the `vmm` event `event`.
    pub fn vmm(&mut self, event: &str) {
        self.write("vmm", event);
    }

    fn write(&mut self, source: &str, event: &str) {
        let Some((file, start)) = &mut self.out else {
            return;
        };
        let record = Record {
            timestamp: start.elapsed(),
            source,
            event,
            properties: None,
        };
        let Ok(mut text) = serde_json::to_vec_pretty(&record) else {
            return;
        };
        text.extend_from_slice(b"\n\n");
        // One write, so that a reader never sees half a record from it unless the pipe is full
        // (which only a reader that stopped reading causes).
        if let Err(e) = file.write_all(&text) {
            tracing::warn!("event monitor: cannot write {source} {event}: {e}");
        }
    }
}

fn set_nonblocking(file: &File) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(file, FcntlArg::F_GETFL)?);
    fcntl(file, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_cloud_hypervisor_s_pretty_json_each_followed_by_a_blank_line() {
        let (reader, writer) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut monitor = EventMonitor::to(File::from(std::os::fd::OwnedFd::from(writer)));
        monitor.vmm("starting");
        monitor.vm("booted");
        drop(monitor);
        let text = std::io::read_to_string(reader).unwrap();
        let records: Vec<&str> = text.split_terminator("\n\n").collect();
        assert_eq!(records.len(), 2, "{text}");
        for (record, (source, event)) in records.iter().zip([("vmm", "starting"), ("vm", "booted")])
        {
            assert!(
                record.starts_with("{\n  \"timestamp\": {\n    \"secs\": "),
                "{record}"
            );
            let v: serde_json::Value = serde_json::from_str(record).unwrap();
            assert_eq!(v["source"], source);
            assert_eq!(v["event"], event);
            assert!(v["properties"].is_null());
            assert!(v["timestamp"]["nanos"].is_u64());
        }
    }

    #[test]
    fn none_writes_nothing() {
        let mut monitor = EventMonitor::none();
        monitor.vm("shutdown");
        assert!(monitor.out.is_none());
    }
}
