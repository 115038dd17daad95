//! The primitives of the mailbox's wake-up protocol: `std` normally, `loom` under
//! `--cfg loom`, so that `vmm/tests/loom_mailbox.rs` can explore every interleaving of a
//! sender and a vCPU going to sleep.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU8, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(loom)]
pub(crate) use loom::thread::{current as current_thread, Thread};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU8, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::thread::{current as current_thread, Thread};

/// A thread handle set once by the owner and read by everyone.
#[derive(Debug, Default)]
pub(crate) struct ThreadSlot {
    #[cfg(not(loom))]
    thread: std::sync::OnceLock<Thread>,
    #[cfg(loom)]
    thread: Mutex<Option<Thread>>,
}

impl ThreadSlot {
    /// Sets the handle (the first call wins).
    pub(crate) fn set(&self, t: Thread) {
        #[cfg(not(loom))]
        {
            let _ = self.thread.set(t);
        }
        #[cfg(loom)]
        {
            let mut slot = self.thread.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(t);
            }
        }
    }

    /// Unparks the thread, if set (the loom model's wake of a blocked owner).
    #[cfg(loom)]
    pub(crate) fn unpark(&self) {
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            t.unpark();
        }
    }

    /// Whether the handle is set.
    pub(crate) fn is_set(&self) -> bool {
        #[cfg(not(loom))]
        {
            self.thread.get().is_some()
        }
        #[cfg(loom)]
        {
            self.thread
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some()
        }
    }
}
