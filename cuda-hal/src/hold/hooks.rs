//! Code to run once work is really enqueued (an order lock let go, a group ended):
//! [`Stream::after_enqueue`](crate::Stream::after_enqueue)'s hooks.

/// A hook: runs once, on the thread that registered it.
pub(crate) type Hook = Box<dyn FnOnce()>;

/// Runs every hook, even when one panics (the others order owners' memory after
/// work already enqueued). Hooks run from drops (a lock's release, a group's end),
/// which never panic: a hook's panic is said on stderr instead.
pub(crate) fn run_all(hooks: Vec<Hook>) {
    for f in hooks {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            eprintln!("cuda-hal: a Stream::after_enqueue hook panicked; the others ran");
        }
    }
}
