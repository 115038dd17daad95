//! The one lock helper of the device buses.

use std::sync::{Mutex, MutexGuard};

/// Locks a device even if another thread panicked while holding it: device state stays usable.
pub(crate) fn lock<T: ?Sized>(device: &Mutex<T>) -> MutexGuard<'_, T> {
    device
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
