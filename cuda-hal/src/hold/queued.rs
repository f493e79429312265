//! Releases that could not finish when their owner was dropped, because a stream they are
//! ordered on was locked for a capture (one beginning, ending or being joined): kept whole
//! (the memory with its context, streams and releaser, in the owner's value) and finished
//! when that lock is let go, or at this crate's next release. A contended lock never
//! decides between freeing and leaking; only a process that ends first leaks them, whole.

use std::any::Any;
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// The owners waiting for their release (each one's drop releases it).
static QUEUE: Mutex<Vec<Box<dyn Any + Send>>> = Mutex::new(Vec::new());
/// Whether `QUEUE` may hold anything: the calls that retry read only this.
static WAITING: AtomicBool = AtomicBool::new(false);
/// How many capture locks were let go so far. A release reads it before it tries its
/// locks and again after it queued itself: if a lock was let go in between, that lock's
/// retry may have looked at the queue before the release was in it, so it retries itself
/// (otherwise the lock's retry, which comes after, finds it).
static LET_GO: AtomicU64 = AtomicU64::new(0);
/// Owners a retry took from the queue and has not finished releasing.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// How long a retry waits for the releases another thread is finishing.
const IN_FLIGHT_WAIT: Duration = Duration::from_millis(100);

thread_local! {
    /// Set while this thread retries: a release it runs that calls [`retry`] again
    /// returns at once (its own item, queued again, waits for the next chance).
    static RETRYING: Cell<bool> = const { Cell::new(false) };
}

/// What [`queue`] compares with: read it before trying the locks whose failure queues.
pub(crate) fn generation() -> u64 {
    LET_GO.load(SeqCst)
}

/// Keeps `owner` until a retry drops it: its drop is the release that had to wait.
/// `seen` is [`generation`] from before the caller tried its locks.
pub(crate) fn queue(owner: Box<dyn Any + Send>, seen: u64) {
    queue_only(owner);
    if LET_GO.load(SeqCst) != seen {
        retry_now();
    }
}

/// As [`queue`], never releasing anything on this thread (a user object's destructor,
/// on CUDA's thread, where no CUDA call is allowed): the next retry elsewhere drops it.
pub(crate) fn queue_only(owner: Box<dyn Any + Send>) {
    QUEUE.lock().unwrap_or_else(|e| e.into_inner()).push(owner);
    WAITING.store(true, SeqCst);
}

/// A capture lock was let go: the releases it made wait may finish now.
pub(crate) fn lock_let_go() {
    LET_GO.fetch_add(1, SeqCst);
    retry();
}

/// Drops every queued owner (each release either finishes or queues itself again), and
/// waits (briefly) for those another thread is releasing. Two atomic loads when nothing
/// waits.
#[inline]
pub(crate) fn retry() {
    if WAITING.load(SeqCst) || IN_FLIGHT.load(SeqCst) > 0 {
        retry_now();
    }
}

/// Clears `RETRYING` when the retry ends, however it ends.
struct Retrying;

impl Drop for Retrying {
    fn drop(&mut self) {
        let _ = RETRYING.try_with(|r| r.set(false));
    }
}

#[cold]
fn retry_now() {
    if RETRYING.try_with(|r| r.replace(true)).unwrap_or(true) {
        return;
    }
    let _retrying = Retrying;
    // Again while a lock was let go during a round and something was queued meanwhile (a
    // few rounds at most: what is left waits for the next chance).
    for _ in 0..4 {
        let seen = LET_GO.load(SeqCst);
        let owners = {
            let mut q = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
            WAITING.store(false, SeqCst);
            IN_FLIGHT.fetch_add(q.len(), SeqCst);
            std::mem::take(&mut *q)
        };
        // Outside the queue's lock: a release that cannot finish yet queues itself again.
        for owner in owners {
            release(owner);
            IN_FLIGHT.fetch_sub(1, SeqCst);
        }
        if !WAITING.load(SeqCst) || LET_GO.load(SeqCst) == seen {
            break;
        }
    }
    // Releases another thread took before this call finish before it returns, so that
    // a caller sees what was queued before it released (bounded: that thread's release
    // may wait for this one, as a communicator's teardown waits for its peers).
    let until = Instant::now() + IN_FLIGHT_WAIT;
    while IN_FLIGHT.load(SeqCst) > 0 && Instant::now() < until {
        std::thread::yield_now();
    }
}

/// Drops one owner. A panic there (a dependency's own `Drop`) is said on stderr and goes
/// no further: the retry runs inside unrelated calls, and drops never panic.
fn release(owner: Box<dyn Any + Send>) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(owner))).is_err() {
        eprintln!("cuda-hal: a release that had to wait panicked; the others went on");
    }
}
