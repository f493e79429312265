//! A communicator's suspension state (calls.rs has the calls): whether it is suspended,
//! and what may still run on it. Below the communicator, which keeps one.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cuda_hal::Stream;

use crate::sync::lock;
use crate::{Error, Result};

/// A communicator's suspension, and the streams its work went to.
#[derive(Default)]
pub(crate) struct SuspendState {
    suspended: AtomicBool,
    /// The stream noted last (its key), so that noting it again is one load.
    last: AtomicUsize,
    /// Streams the communicator enqueued on, whose work may not be done.
    streams: Mutex<Vec<Stream>>,
    /// One clone per live hold of a capture or group (comm.rs's `held`).
    pub(crate) holds: Arc<()>,
}

impl SuspendState {
    /// Marks the communicator suspended or not (after NCCL said so).
    pub(crate) fn set(&self, suspended: bool) {
        self.suspended.store(suspended, Ordering::Release);
    }

    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended.load(Ordering::Acquire)
    }

    /// [`Error::Suspended`] while suspended.
    pub(crate) fn refuse(&self, what: &'static str) -> Result<()> {
        if self.is_suspended() {
            return Err(Error::Suspended { what });
        }
        Ok(())
    }

    /// Work is about to be enqueued on `stream`: kept (a clone, so the stream lives as long
    /// as the communicator or until a suspend finds its work done).
    #[inline]
    pub(crate) fn note(&self, stream: &Stream) {
        let key = Arc::as_ptr(&self.holds).addr() ^ stream.as_raw().addr();
        if self.last.load(Ordering::Relaxed) != key {
            self.note_new(stream, key);
        }
    }

    #[cold]
    fn note_new(&self, stream: &Stream, key: usize) {
        // No query here: work may be being captured, and a query of a capturing stream
        // spoils its capture. The list is pruned by `busy`.
        let mut v = lock(&self.streams);
        if !v.iter().any(|s| s.as_raw() == stream.as_raw()) {
            v.push(stream.clone());
        }
        self.last.store(key, Ordering::Relaxed);
    }

    /// Why work may still use the communicator, if it may.
    pub(crate) fn busy(&self) -> Option<String> {
        if Arc::strong_count(&self.holds) > 1 {
            return Some(
                "an open group or a captured graph holds work that uses the communicator: end \
                 the group or drop the graph first"
                    .into(),
            );
        }
        let mut v = lock(&self.streams);
        // A capturing stream is not queried (that would spoil its capture): busy.
        v.retain(|s| s.is_capturing().unwrap_or(true) || !matches!(s.is_idle(), Ok(true)));
        self.last.store(0, Ordering::Relaxed);
        v.first().map(|s| {
            format!(
                "work it enqueued on stream {:?} is not done: synchronize the stream (or \
                 Communicator::wait) first",
                s.as_raw()
            )
        })
    }
}
