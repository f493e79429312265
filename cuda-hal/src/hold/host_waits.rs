//! The captures that forbid host waits: CUDA refuses a synchronisation from a thread
//! that a global-mode capture (any thread) or a thread-local-mode capture (the thread
//! that began it) forbids, and the refusal spoils the capture, so this crate refuses
//! first.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use crate::hold::core::{CaptureLog, Forbids};
use crate::hold::lock::lock;

thread_local! {
    /// The thread-local-mode captures this thread began (live while not ended).
    static STRICT_HERE: RefCell<Vec<std::sync::Weak<CaptureLog>>> = const { RefCell::new(Vec::new()) };
}
/// The global-mode captures of any thread.
static STRICT_GLOBAL: Mutex<Vec<std::sync::Weak<CaptureLog>>> = Mutex::new(Vec::new());

/// Notes a capture just begun in global or thread-local mode: until it ends, host
/// synchronisations from this thread (global: from every thread) fail on a real device
/// and spoil it, so this crate refuses them first ([`forbidding_capture`]).
pub(crate) fn note_strict(log: &Arc<CaptureLog>) {
    match log.forbids {
        None => {}
        Some(Forbids::Everyone) => {
            let mut g = lock(&STRICT_GLOBAL);
            g.retain(|w| w.upgrade().is_some_and(|l| !l.is_ended()));
            g.push(Arc::downgrade(log));
        }
        Some(Forbids::Thread(_)) => {
            let _ = STRICT_HERE.try_with(|v| {
                let mut v = v.borrow_mut();
                v.retain(|w| w.upgrade().is_some_and(|l| !l.is_ended()));
                v.push(Arc::downgrade(log));
            });
        }
    }
}

/// A running capture begun through this crate in `driver` that forbids this thread host
/// synchronisations there (one this thread began in thread-local mode, or any global one).
pub(crate) fn forbidding_capture(driver: usize) -> Option<Arc<CaptureLog>> {
    let live = |w: &std::sync::Weak<CaptureLog>| {
        w.upgrade().filter(|l| l.driver == driver && !l.is_ended())
    };
    STRICT_HERE
        .try_with(|v| v.borrow().iter().find_map(live))
        .ok()
        .flatten()
        .or_else(|| lock(&STRICT_GLOBAL).iter().find_map(live))
}
