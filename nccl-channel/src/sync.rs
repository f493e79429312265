//! How this crate takes a mutex: a poisoned one is taken all the same, so that a panic on
//! one thread does not turn every later call on the communicator into a panic too. A leaf:
//! it imports nothing of the crate, so every module may use it.

use std::sync::{Mutex, MutexGuard};

/// The guard of `m`, also when a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
