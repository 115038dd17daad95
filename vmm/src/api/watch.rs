//! The API server's epoll set, an `event-manager` one: the token each event carries in its
//! data (`Events::with_data`) names the descriptor; descriptors enter and leave it through
//! `EventOps`, and leave it before they are closed (the manager dispatches by descriptor
//! number, which the next one opened may reuse). Also the stop-signal eventfd it watches
//! while the server, not a VM, has the handlers.

use std::os::fd::AsRawFd;

use event_manager::{EventOps, EventSet, Events};
use vmm_sys_util::eventfd::EventFd;

use super::error::ApiError;
use crate::host::sys::stop_signals;

/// The token of the listener's events.
pub(super) const LISTENER: u32 = 0;
/// The token of the VM-ended eventfd's events.
pub(super) const VM_ENDED: u32 = 1;
/// The token of the stop-signal eventfd's events.
pub(super) const SIGNAL: u32 = 2;
/// Tokens from here on are connections.
pub(super) const FIRST_CLIENT: u32 = 3;

/// A host call's failure: `what` could not be made.
pub(super) fn host(what: &'static str) -> impl Fn(std::io::Error) -> ApiError {
    move |source| ApiError::Host { what, source }
}

/// An `event-manager` failure as the host error it is (an epoll call's errno).
pub(super) fn epoll(what: &'static str) -> impl Fn(event_manager::Error) -> ApiError {
    move |e| {
        let source = match e {
            event_manager::Error::Epoll(errno) => errno.into(),
            other => std::io::Error::other(other),
        };
        ApiError::Host { what, source }
    }
}

/// Puts `fd` in the epoll set for `set`, its events tagged with `token`.
pub(super) fn watch(
    ops: &mut EventOps,
    fd: &impl AsRawFd,
    set: EventSet,
    token: u32,
) -> Result<(), ApiError> {
    ops.add(Events::with_data(fd, token, set))
        .map_err(epoll("the API epoll set"))
}

/// Takes `fd` out of the epoll set. Every descriptor leaves it this way before it is closed:
/// the event manager dispatches by descriptor number, which the next one opened may reuse.
pub(super) fn unwatch(ops: &mut EventOps, fd: &impl AsRawFd) -> Result<(), ApiError> {
    ops.remove(Events::empty(fd))
        .map_err(epoll("the API epoll set"))
}

/// The eventfd the stop signals write while the server (not a VM) has the handlers.
pub(super) struct StopSignal {
    /// The eventfd the handlers write now.
    pub(super) event: EventFd,
    /// Eventfds of earlier installs: still watched until the wait that reported the run's end
    /// has been served (an event of theirs it reported is served as a signal).
    pub(super) replaced: Vec<EventFd>,
}

impl StopSignal {
    /// Takes the stop-signal handlers back from a VM whose run has ended.
    pub(super) fn reinstall(&mut self, ops: &mut EventOps) -> Result<(), ApiError> {
        let event = stop_signals::install().map_err(host("the stop-signal handlers"))?;
        self.replaced
            .push(std::mem::replace(&mut self.event, event));
        watch(ops, &self.event, EventSet::IN, SIGNAL)
    }

    /// Closes the replaced eventfds, out of the epoll set first.
    pub(super) fn close_replaced(&mut self, ops: &mut EventOps) {
        for old in self.replaced.drain(..) {
            let _ = unwatch(ops, &old);
        }
    }
}
