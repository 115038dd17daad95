//! Locking that survives a panicked thread: a panic in any lull thread already stops the VM
//! (the thread records a stop reason or the process ends), so the threads still running take
//! over a poisoned lock rather than panic in turn while the VM winds down.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking over a poisoned lock.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
