//! The VMM thread: its event loop over console input, stop requests and SIGINT/SIGTERM.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::console::{self, EscapeFilter};
use crate::vcpu::exit::StopReason;
use crate::vm::{Console, VmError, VmShared};

/// Eventfd the SIGINT/SIGTERM handler writes to (-1 until set).
static SIGNAL_EVENT_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_stop_signal(
    _num: libc::c_int,
    _info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    let fd = SIGNAL_EVENT_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; `fd` is an eventfd that lives for the whole
        // process (leaked on purpose), and `one` is 8 readable bytes.
        unsafe { libc::write(fd, std::ptr::addr_of!(one).cast(), 8) };
    }
}

/// Installs SIGINT/SIGTERM handlers that wake the VMM thread; returns the eventfd they write.
pub fn install_signal_handlers() -> Result<EventFd, VmError> {
    let evt = EventFd::new(EFD_NONBLOCK).map_err(|e| VmError::EventLoop(e.to_string()))?;
    let raw = evt
        .try_clone()
        .map_err(|e| VmError::EventLoop(e.to_string()))?;
    SIGNAL_EVENT_FD.store(raw.as_raw_fd(), Ordering::Relaxed);
    std::mem::forget(raw); // the handler may run until the process exits
    for sig in [libc::SIGINT, libc::SIGTERM] {
        vmm_sys_util::signal::register_signal_handler(sig, on_stop_signal)
            .map_err(|e| VmError::EventLoop(format!("signal handler: {e}")))?;
    }
    Ok(evt)
}

/// The VMM thread's subscriber: console input, stop requests and signals.
pub struct VmmEvents {
    /// Shared VM state.
    pub shared: Arc<VmShared>,
    /// The serial console.
    pub console: Arc<Mutex<Console>>,
    /// Written by the SIGINT/SIGTERM handler.
    pub signal: EventFd,
    /// Written when the guest has drained the console's input FIFO.
    pub drained: Arc<EventFd>,
    /// Whether stdin is still read.
    pub stdin_open: bool,
    /// The Ctrl-A escape filter.
    pub filter: EscapeFilter,
    /// Input not yet taken by the guest.
    pub pending: Vec<u8>,
}

impl VmmEvents {
    fn stdin_fd() -> RawFd {
        std::io::stdin().as_raw_fd()
    }

    fn feed_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let taken = self
            .console
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .enqueue_input(&self.pending);
        self.pending.drain(..taken);
    }

    fn on_stdin(&mut self, ops: &mut EventOps) {
        let mut buf = [0u8; 64];
        match console::read_stdin(&mut buf) {
            Ok(0) | Err(_) => {
                // End of input: the guest keeps running with no more console input.
                let _ = ops.remove(Events::empty_raw(Self::stdin_fd()));
                self.stdin_open = false;
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
                    let _ = ops.remove(Events::empty_raw(Self::stdin_fd()));
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
            self.shared.stop.request(StopReason::User);
        } else if fd == self.shared.stop.event().as_raw_fd() {
            let _ = self.shared.stop.event().read();
        } else if fd == self.drained.as_raw_fd() {
            let _ = self.drained.read();
            let was_blocked = !self.pending.is_empty();
            self.feed_pending();
            if was_blocked && self.pending.is_empty() && self.stdin_open {
                let _ = ops.add(Events::new_raw(Self::stdin_fd(), EventSet::IN));
            }
        } else if fd == Self::stdin_fd() {
            self.on_stdin(ops);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::new(&self.signal, EventSet::IN));
        let _ = ops.add(Events::new(self.shared.stop.event(), EventSet::IN));
        let _ = ops.add(Events::new(self.drained.as_ref(), EventSet::IN));
        if self.stdin_open
            && ops
                .add(Events::new_raw(Self::stdin_fd(), EventSet::IN))
                .is_err()
        {
            // stdin is a regular file or /dev/null: epoll cannot watch it; no console input.
            self.stdin_open = false;
        }
    }
}
