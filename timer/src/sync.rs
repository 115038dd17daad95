//! The synchronization primitives the lock-free parts use: `std` normally, `loom` under
//! `--cfg loom` so the model checker can explore every interleaving.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;

/// [`lock`](crate::lock) for this module's mutex: loom's under `--cfg loom`.
#[cfg(loom)]
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
#[cfg(not(loom))]
pub(crate) use crate::lock::lock;
