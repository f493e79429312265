//! The mode's threads, counted while they run (network_threads), and the socket shutdown that ends a reader: a leaf the hub and the links both use.

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

/// Threads of hubs and links now running in this process.
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// Threads of the multi-process mode still running in this process: hubs, their
/// connections and the ranks' links. Zero once every communicator is destroyed or
/// aborted and every hub has ended (a hub ends with its last rank, or after its timeout
/// when no rank came).
pub fn network_threads() -> usize {
    THREADS.load(Ordering::Acquire)
}

/// Counts a running thread of this mode while it lives.
struct Counted;

impl Drop for Counted {
    fn drop(&mut self) {
        THREADS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Spawns a thread counted by [`network_threads`].
pub(super) fn spawn(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    THREADS.fetch_add(1, Ordering::AcqRel);
    let counted = Counted;
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _counted = counted;
            f();
        })
}

/// Closes both directions of `stream`, which wakes the thread reading it.
pub(super) fn stop(stream: &TcpStream) {
    let _ = stream.shutdown(Shutdown::Both);
}
