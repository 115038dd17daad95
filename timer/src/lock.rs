//! lull's one lock helper: devices and the VMM lock through it too.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking over a poisoned lock. A panic in any lull thread already stops the VM (the
/// thread records a stop reason or the process ends), and every critical section leaves its
/// data consistent before it can panic, so the threads still running take over the lock rather
/// than panic in turn while the VM winds down.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
