//! A note on stderr when a rank waits long: a rank whose peers or rank 0 never come would
//! otherwise be silent until its deadline.

use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::Duration;

use nccl_channel::World;

/// When [`watched`] speaks up.
const NOTE_AFTER: Duration = Duration::from_secs(5);

/// Runs `f`; if it takes more than a few seconds, says once on stderr what the rank waits
/// for.
pub(crate) fn watched<T>(world: World, waiting_for: &str, f: impl FnOnce() -> T) -> T {
    let (done, rx) = channel::<()>();
    let note = format!(
        "rank {}/{}: still waiting for {waiting_for}",
        world.rank, world.size
    );
    let watcher = std::thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(NOTE_AFTER) {
            eprintln!("{note}");
        }
    });
    let out = f();
    drop(done);
    let _ = watcher.join();
    out
}
