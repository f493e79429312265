//! The end of a process of the multi-process mode. Two promises of a simulator that
//! other projects' CI runs:
//!
//! * A process that ends without destroying its communicator (`exit`, or `main`
//!   returning with the communicator still in a static) *leaves* it, as its destroy
//!   would: its peers are not told of a death, and their finished work is not failed.
//!   Only a process that really dies (a signal, an abort) is reported as gone.
//! * The process of a hub (rank 0's) stays until every rank of the hub's communicator
//!   has left or died, so that ending first never takes its peers' answers, or the
//!   place they leave at, with it. Bounded by the hub's timeout; said on stderr when it
//!   takes a while.
//!
//! Both run from a process-exit handler (`atexit`), registered when the first link or
//! hub of the process starts.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use super::wire::{self, Msg};

/// A link of this process, as the exit handler sees it.
struct LiveLink {
    id: u64,
    /// A clone of the link's connection, to say its leave on.
    stream: TcpStream,
    /// Set by the link's reader once the hub closed the connection (the leave handled).
    closed: Arc<AtomicBool>,
}

/// A hub of this process, as the exit handler sees it.
pub(super) struct HubWatch {
    /// Every rank came: a communicator formed, whose ranks may still talk to the hub.
    pub(super) formed: AtomicBool,
    /// The hub's thread ended (every rank gone, or its timeout).
    pub(super) ended: AtomicBool,
    /// How long the hub waits for a silent rank: the longest the exit waits for it too.
    pub(super) timeout: Duration,
}

static LINKS: Mutex<Vec<LiveLink>> = Mutex::new(Vec::new());
static HUBS: Mutex<Vec<Arc<HubWatch>>> = Mutex::new(Vec::new());
static NEXT_LINK: AtomicU64 = AtomicU64::new(1);
static REGISTERED: Once = Once::new();

/// How long a leave said at exit waits for the hub to handle it.
const LEAVE_WAIT: Duration = Duration::from_secs(2);
/// How long the hub's process waits at exit before it says why.
const SAY_AFTER: Duration = Duration::from_secs(2);

fn guard<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// SAFETY: the C library's `atexit`, with its C signature.
unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

fn register_handler() {
    REGISTERED.call_once(|| {
        // SAFETY: `at_exit` is an `extern "C" fn()` that never unwinds (it catches
        // panics) and lives as long as the code of this library, whose unloading runs the
        // handlers registered from it first (glibc ties them to the object).
        let _ = unsafe { atexit(at_exit) };
    });
}

/// Notes a live link (its connection cloned, and the flag its reader sets once the hub
/// closed the connection); its id, to [`forget_link`] it when it leaves or aborts.
pub(super) fn note_link(stream: &TcpStream, closed: Arc<AtomicBool>) -> u64 {
    register_handler();
    let id = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
    if let Ok(stream) = stream.try_clone() {
        guard(&LINKS).push(LiveLink { id, stream, closed });
    }
    id
}

/// The link left, aborted or went: the exit has nothing to say for it.
pub(super) fn forget_link(id: u64) {
    guard(&LINKS).retain(|l| l.id != id);
}

/// Notes a hub started in this process.
pub(super) fn note_hub(timeout: Duration) -> Arc<HubWatch> {
    register_handler();
    let watch = Arc::new(HubWatch {
        formed: AtomicBool::new(false),
        ended: AtomicBool::new(false),
        timeout,
    });
    let mut hubs = guard(&HUBS);
    hubs.retain(|h| !h.ended.load(Ordering::Acquire));
    hubs.push(watch.clone());
    watch
}

extern "C" fn at_exit() {
    // Nothing may unwind out of an exit handler.
    let _ = std::panic::catch_unwind(|| {
        leave_all();
        wait_for_hubs();
    });
}

/// Every live link of this process leaves its communicator, and waits (briefly) for its
/// hub to handle that.
fn leave_all() {
    let links = std::mem::take(&mut *guard(&LINKS));
    for l in &links {
        let _ = wire::send(&l.stream, &Msg::Leave);
    }
    let deadline = Instant::now() + LEAVE_WAIT;
    while Instant::now() < deadline && !links.iter().all(|l| l.closed.load(Ordering::Acquire)) {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until every hub of this process whose communicator formed has ended, each at
/// most its timeout.
fn wait_for_hubs() {
    let hubs: Vec<Arc<HubWatch>> = guard(&HUBS).clone();
    let start = Instant::now();
    let mut said = false;
    loop {
        let waiting: Vec<&Arc<HubWatch>> = hubs
            .iter()
            .filter(|h| {
                h.formed.load(Ordering::Acquire)
                    && !h.ended.load(Ordering::Acquire)
                    && start.elapsed() < h.timeout
            })
            .collect();
        if waiting.is_empty() {
            return;
        }
        if !said && start.elapsed() >= SAY_AFTER {
            eprintln!(
                "nccl-mock: this process hosts the simulated communicator's hub (rank 0's); it \
                 ends once every other rank has destroyed its communicator or ended (at most \
                 {:?})",
                waiting.iter().map(|h| h.timeout).max().unwrap_or_default()
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
