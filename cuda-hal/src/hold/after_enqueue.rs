//! Which order locks a thread holds, each guard accounting for itself (so locks released
//! in any order leave the record exact), and the [`Stream::after_enqueue`](crate::Stream::after_enqueue)
//! hooks waiting for one of them to be released.

use std::cell::{Cell, RefCell};

use crate::hold::group::{DeferScope, after_group};
use crate::hold::hooks::{Hook, run_all};

/// How many order locks a thread's record keeps by key; more nested ones are counted
/// only (`holds` says no for them: `after_enqueue` is then refused, never wrongly
/// accepted).
const SLOTS: usize = 8;

/// The order locks this thread holds, oldest first: a stream's key for an
/// [`EnqueueLock`](crate::EnqueueLock) taken with `Stream::enqueue_lock`, 0 for this
/// crate's own (a free's, a capture's), which run no hooks. Each guard removes its own
/// entry, so guards dropped in any order leave it exact. Cells without a destructor:
/// readable for the whole life of the thread, one thread-local access per lock.
struct Held {
    /// Locks held, also those past `SLOTS`.
    n: Cell<usize>,
    keys: [Cell<usize>; SLOTS],
}

thread_local! {
    static HELD: Held = const {
        Held {
            n: Cell::new(0),
            keys: [const { Cell::new(0) }; SLOTS],
        }
    };
    /// Whether `HOOKS` may hold anything: the lock's drop reads only this.
    static PENDING: Cell<bool> = const { Cell::new(false) };
    static HOOKS: RefCell<Vec<(usize, Hook)>> = const { RefCell::new(Vec::new()) };
}

/// A lock of `key` (0: one of this crate's own) is taken by this thread.
#[inline]
pub(crate) fn enter(key: usize) {
    HELD.with(|h| {
        let n = h.n.get();
        if let Some(slot) = h.keys.get(n) {
            slot.set(key);
        }
        h.n.set(n + 1);
    });
}

/// Whether this thread holds the enqueue lock of `key` (never 0).
pub(crate) fn holds(key: usize) -> bool {
    key != 0
        && HELD.with(|h| {
            let kept = h.n.get().min(SLOTS);
            h.keys[..kept].iter().any(|k| k.get() == key)
        })
}

/// Keeps `f` for the release of `key`'s lock, or for the end of the open group.
pub(crate) fn push(key: usize, f: Hook) -> crate::Result<()> {
    let torn = || crate::Error::Deferred {
        what: "Stream::after_enqueue",
        why: "the thread's storage is being torn down",
    };
    if DeferScope::is_open() {
        return after_group(f).map_err(|()| torn());
    }
    HOOKS
        .try_with(|h| h.borrow_mut().push((key, f)))
        .map_err(|_| torn())?;
    let _ = PENDING.try_with(|p| p.set(true));
    Ok(())
}

/// A lock of `key` taken by [`enter`] is released: its entry goes (the newest of that
/// key), and the hooks waiting for `key`'s release run.
#[inline]
pub(crate) fn leave(key: usize) {
    HELD.with(|h| {
        let n = h.n.get();
        match n {
            0 => {}
            _ if n <= SLOTS && h.keys[n - 1].get() == key => h.n.set(n - 1),
            _ => remove(h, key),
        }
    });
    if key != 0 && PENDING.try_with(Cell::get).unwrap_or(false) {
        run(key);
    }
}

/// Removes `key`'s newest entry from below the top (locks released out of order), or,
/// when it is not kept (a lock past `SLOTS`), one of the locks counted only.
#[cold]
fn remove(h: &Held, key: usize) {
    let n = h.n.get();
    let kept = n.min(SLOTS);
    if let Some(i) = h.keys[..kept].iter().rposition(|k| k.get() == key) {
        for j in i..kept - 1 {
            h.keys[j].set(h.keys[j + 1].get());
        }
        // The slot freed at the top stood for a lock counted only: unknown (0).
        h.keys[kept - 1].set(0);
    }
    h.n.set(n - 1);
}

#[cold]
fn run(key: usize) {
    let mine: Vec<Hook> = HOOKS
        .try_with(|h| {
            let mut h = h.borrow_mut();
            let (mine, rest): (Vec<_>, Vec<_>) = h.drain(..).partition(|(k, _)| *k == key);
            *h = rest;
            let _ = PENDING.try_with(|p| p.set(!h.is_empty()));
            mine.into_iter().map(|(_, f)| f).collect()
        })
        .unwrap_or_default();
    // Outside the borrow: a hook may enqueue (record an event) and take locks.
    run_all(mine);
}

#[cfg(test)]
mod tests {
    use super::{SLOTS, enter, holds, leave};

    #[test]
    fn each_lock_leaves_its_own_entry_in_any_order_beyond_the_slots_too() {
        let keys: Vec<usize> = (1..=SLOTS + 3).map(|k| k * 16).collect();
        for &k in &keys {
            enter(k);
        }
        // Kept by key up to SLOTS; the rest only counted (refused, never wrongly held).
        assert!(keys[..SLOTS].iter().all(|&k| holds(k)));
        assert!(keys[SLOTS..].iter().all(|&k| !holds(k)));
        // Out of order: the second, then the newest, then the first.
        leave(keys[1]);
        assert!(!holds(keys[1]) && holds(keys[0]) && holds(keys[2]));
        leave(keys[SLOTS + 2]);
        leave(keys[0]);
        assert!(!holds(keys[0]) && holds(keys[2]));
        for &k in keys[2..].iter().rev().skip(1) {
            leave(k);
        }
        assert!(keys.iter().all(|&k| !holds(k)));
        assert!(!holds(0), "0 is never a stream's lock");
        // Empty again: a new lock is kept and found.
        enter(7);
        assert!(holds(7));
        leave(7);
        assert!(!holds(7));
    }
}
