//! Locking the memory model's plain lists.

use std::sync::{Mutex, MutexGuard};

/// A mutex whose data stays consistent across a panic elsewhere (plain lists).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
