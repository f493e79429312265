//! Why the calling thread's last name lookup failed: the message `cuGetErrorString` gives
//! for that status next on this thread, once (init.rs writes and reads it; every entry
//! point clears it, through `mock_fns!`). A leaf, below both.

use std::cell::Cell;
use std::ffi::CStr;

thread_local! {
    /// (status, full message) of the last failed lookup on this thread.
    static DETAIL: Cell<Option<(u32, &'static CStr)>> = const { Cell::new(None) };
}

/// Notes the detail of a failed lookup (or `None`: forget the last one).
pub(crate) fn set(detail: Option<(u32, &'static CStr)>) {
    DETAIL.with(|d| d.set(detail));
}

/// Forgets the last detail: another call came in between.
#[inline]
pub(crate) fn clear() {
    let _ = DETAIL.try_with(|d| d.set(None));
}

/// The noted detail for status `code`, taken.
pub(crate) fn take(code: u32) -> Option<&'static CStr> {
    DETAIL.with(|d| match d.get() {
        Some((c, m)) if c == code => {
            d.set(None);
            Some(m)
        }
        _ => None,
    })
}
