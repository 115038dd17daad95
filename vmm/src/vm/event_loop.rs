//! The VMM thread: its event loop over console input (stdin, or the main side of the serial
//! console's pseudo-terminal with `--serial pty`), stop requests, the stop signals
//! (SIGINT, SIGTERM, SIGHUP), the taps of virtio-net devices (edge-triggered: see `vm::nets`)
//! and, with `--device-timers timerfd`, the refill timerfds of rate-limited devices. It runs
//! until the first stop request (from any thread) and returns its reason.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use event_manager::{EventManager, EventOps, Events, MutEventSubscriber, SubscriberOps};
use timer::lock;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use super::devices::{Console, ConsoleParts};
use super::error::VmError;
use crate::config::{SerialMode, VmConfig};
use crate::host::console::{self, EscapeFilter};
use crate::host::sys::stop_signals;
use crate::host::sys::terminal::RawTerminal;
use crate::state::net_port::NetPort;
use crate::state::{StopReason, VcpuShared};

/// The VMM thread's loop, ready to run: signal handlers installed, terminal in raw mode.
pub struct EventLoop {
    manager: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>>,
    shared: Arc<VcpuShared>,
    _raw_terminal: Option<RawTerminal>,
}

impl EventLoop {
    /// The VMM thread's loop for a VM configured by `cfg`.
    /// `nets`: the virtio-net devices whose taps it watches.
    pub fn new(
        cfg: &VmConfig,
        shared: Arc<VcpuShared>,
        nets: Vec<Arc<dyn NetPort>>,
        console: &ConsoleParts,
        pty: Option<Arc<File>>,
    ) -> Result<Self, VmError> {
        let host = |what| move |source| VmError::Host { what, source };
        let signal = stop_signals::install().map_err(host("the stop-signal handlers"))?;
        let stdin_is_console = cfg.serial == SerialMode::Stdio;
        let mut manager: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>> =
            EventManager::new().map_err(VmError::EventLoop)?;
        manager.add_subscriber(Arc::new(Mutex::new(VmmEvents {
            shared: shared.clone(),
            nets,
            console: console.console.clone(),
            signal,
            drained: console.drained.clone(),
            stdin_open: stdin_is_console || pty.is_some(),
            pty,
            filter: EscapeFilter::default(),
            pending: Vec::new(),
        })));
        Ok(Self {
            manager,
            shared,
            _raw_terminal: stdin_is_console.then(RawTerminal::enable).flatten(),
        })
    }

    /// Runs until the VM stops; the terminal is restored when this returns.
    pub fn run(mut self) -> Result<StopReason, VmError> {
        crate::host::seccomp::apply(crate::host::seccomp::ThreadKind::Vmm)?;
        loop {
            if let Some(reason) = self.shared.stop.reason() {
                return Ok(reason);
            }
            if let Err(e) = self.manager.run() {
                return Ok(StopReason::VmmError(format!("event loop: {e:?}")));
            }
        }
    }
}

/// The VMM thread's subscriber: console input, stop requests and signals.
pub struct VmmEvents {
    shared: Arc<VcpuShared>,
    /// The virtio-net devices, in `--net` order: their taps wake the loop.
    nets: Vec<Arc<dyn NetPort>>,
    console: Arc<Mutex<Console>>,
    /// Written by the stop-signal handler.
    signal: EventFd,
    /// Written when the guest has drained the console's input FIFO.
    drained: Arc<EventFd>,
    /// Whether the console's input (stdin, or the pty) is still read.
    stdin_open: bool,
    /// The pseudo-terminal's main side, read instead of stdin (no escape: a pty's client has
    /// its own, `virsh console`'s Ctrl-]).
    pty: Option<Arc<File>>,
    filter: EscapeFilter,
    /// Input not yet taken by the guest.
    pending: Vec<u8>,
}

impl VmmEvents {
    /// The descriptor of the console's input: the pty's main side, or stdin.
    fn input_fd(&self) -> RawFd {
        self.pty
            .as_ref()
            .map_or_else(|| std::io::stdin().as_raw_fd(), |p| p.as_raw_fd())
    }

    fn feed_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let taken = lock(&self.console).enqueue_input(&self.pending);
        self.pending.drain(..taken);
    }

    fn on_stdin(&mut self, ops: &mut EventOps) {
        let mut buf = [0u8; 64];
        let read = match &self.pty {
            Some(pty) => (&**pty).read(&mut buf),
            None => console::read_stdin(&mut buf),
        };
        match read {
            // Nothing there after all, or no client on the pty right now: read again later.
            Err(e)
                if self.pty.is_some()
                    && (e.kind() == std::io::ErrorKind::WouldBlock
                        || e.raw_os_error() == Some(libc::EIO)) => {}
            Ok(0) | Err(_) => {
                // End of input: the guest keeps running with no more console input.
                let _ = ops.remove(Events::empty_raw(self.input_fd()));
                self.stdin_open = false;
            }
            Ok(n) if self.pty.is_some() => {
                self.pending.extend_from_slice(&buf[..n]);
                self.feed_pending();
                if !self.pending.is_empty() {
                    // Wait for the guest to drain its FIFO before reading more.
                    let _ = ops.remove(Events::empty_raw(self.input_fd()));
                }
            }
            Ok(n) => {
                let out = self.filter.feed(&buf[..n]);
                self.pending.extend_from_slice(&out.to_guest);
                self.feed_pending();
                if out.quit {
                    self.shared.stop.request(StopReason::User);
                }
                if !self.pending.is_empty() {
                    // Wait for the guest to drain its FIFO before reading more.
                    let _ = ops.remove(Events::empty_raw(self.input_fd()));
                }
            }
        }
    }
}

impl MutEventSubscriber for VmmEvents {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.signal.as_raw_fd() {
            let _ = self.signal.read();
            let signal = stop_signals::last_signal().unwrap_or(libc::SIGTERM);
            self.shared.stop.request(StopReason::Signal(signal));
        } else if fd == self.shared.stop.event().as_raw_fd() {
            let _ = self.shared.stop.event().read();
        } else if fd == self.drained.as_raw_fd() {
            let _ = self.drained.read();
            let was_blocked = !self.pending.is_empty();
            self.feed_pending();
            if was_blocked && self.pending.is_empty() && self.stdin_open {
                let _ = ops.add(Events::new_raw(self.input_fd(), EventSet::IN));
            }
        } else if fd == self.input_fd() {
            self.on_stdin(ops);
        } else if let Some(net) = self.nets.iter().find(|n| n.fd() == fd) {
            net.poll_rx();
        } else if let Some((id, _)) = self.shared.device_timers.timerfds().find(|t| t.1 == fd) {
            self.shared.device_timers.on_timerfd(id);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::new(&self.signal, EventSet::IN));
        let _ = ops.add(Events::new(self.shared.stop.event(), EventSet::IN));
        let _ = ops.add(Events::new(self.drained.as_ref(), EventSet::IN));
        for (_, fd) in self.shared.device_timers.timerfds() {
            let _ = ops.add(Events::new_raw(fd, EventSet::IN));
        }
        for net in &self.nets {
            let _ = ops.add(Events::new_raw(
                net.fd(),
                EventSet::IN | EventSet::EDGE_TRIGGERED,
            ));
        }
        if self.stdin_open
            && ops
                .add(Events::new_raw(self.input_fd(), EventSet::IN))
                .is_err()
        {
            // stdin is a regular file or /dev/null: epoll cannot watch it; no console input.
            self.stdin_open = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    use devices::pio::PioDevice;
    use devices::serial::SerialPort;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;
    use crate::host::console::ConsoleSink;
    use crate::host::pty::Pty;
    use crate::irqchip::EdgeIrq;

    /// `--serial pty` both ways through the VMM loop's subscriber: what a client (`virsh
    /// console`) types into the pty lands in the UART's receive register, and what the guest
    /// writes to the UART comes out of the pty.
    #[test]
    fn the_pty_feeds_the_uart_and_the_uart_the_pty() {
        let pty = Pty::open().unwrap();
        let irq = EdgeIrq::Irqfd(EventFd::new(EFD_NONBLOCK).unwrap());
        let console = Arc::new(Mutex::new(SerialPort::new(
            irq,
            ConsoleSink::Pty(pty.main()),
        )));
        let shared = Arc::new(VcpuShared::new(1, Instant::now()).unwrap());
        let mut manager: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>> =
            EventManager::new().unwrap();
        manager.add_subscriber(Arc::new(Mutex::new(VmmEvents {
            shared,
            nets: Vec::new(),
            console: console.clone(),
            signal: EventFd::new(EFD_NONBLOCK).unwrap(),
            drained: Arc::new(EventFd::new(EFD_NONBLOCK).unwrap()),
            stdin_open: true,
            pty: Some(pty.main()),
            filter: EscapeFilter::default(),
            pending: Vec::new(),
        })));
        let mut client = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(pty.path())
            .unwrap();
        client.write_all(b"hi\x01x").unwrap();
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 4 && Instant::now() < deadline {
            let _ = manager.run_with_timeout(100);
            let mut port = lock(&console);
            loop {
                let mut lsr = [0u8];
                port.read(5, &mut lsr);
                if lsr[0] & 1 == 0 {
                    break;
                }
                let mut rbr = [0u8];
                port.read(0, &mut rbr);
                got.push(rbr[0]);
            }
        }
        // Byte for byte: no Ctrl-A escape on a pty (its client has its own).
        assert_eq!(got, b"hi\x01x");
        lock(&console).write(0, b"o");
        let mut out = [0u8; 1];
        client.read_exact(&mut out).unwrap();
        assert_eq!(&out, b"o");
    }
}
