//! A user object's data and how its destructor runs: on another thread than the caller's,
//! where a CUDA call is a sanitizer finding (a leaf: the state names it, the driver
//! functions of `user_object.rs` use it).

use std::cell::Cell;
use std::ffi::c_void;

/// One user object: its pointer, destructor and references.
pub(crate) struct UserObj {
    pub(crate) ptr: usize,
    pub(crate) destroy: unsafe extern "C" fn(*mut c_void),
    pub(crate) refs: u64,
}

/// A destructor due: run it with [`run_destructors`] once the world's lock is released.
pub(crate) struct Due(
    pub(crate) unsafe extern "C" fn(*mut c_void),
    pub(crate) usize,
);

thread_local! {
    /// Set on the thread running a user object's destructor.
    static IN_DESTRUCTOR: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread runs a user object's destructor (which may not call CUDA).
pub(crate) fn in_destructor() -> bool {
    IN_DESTRUCTOR.try_with(Cell::get).unwrap_or(false)
}

/// Runs the destructors that are due, each on a thread of its own (as CUDA runs them on
/// an internal thread), waiting for them: their effects are seen when the call that
/// released the last reference returns.
pub(crate) fn run_destructors(due: Vec<Due>) {
    for Due(destroy, ptr) in due {
        let _ = std::thread::spawn(move || {
            IN_DESTRUCTOR.with(|d| d.set(true));
            // SAFETY: the destructor and pointer given to `cuUserObjectCreate`, called
            // once, when the last reference went (the caller's contract).
            unsafe { destroy(std::ptr::with_exposed_provenance_mut(ptr)) };
        })
        .join();
    }
}
