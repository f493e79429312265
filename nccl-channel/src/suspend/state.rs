//! A communicator's suspension state (calls.rs has the calls): whether it is suspended,
//! and what may still run on it. Below the communicator, which keeps one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cuda_hal::{Stream, StreamLog};

use crate::{Error, Result};

/// A communicator's suspension, and the streams its work went to.
#[derive(Default)]
pub(crate) struct SuspendState {
    suspended: AtomicBool,
    /// Streams the communicator enqueued on, whose work may not be done (kept by the
    /// memory model, which a capture nobody can end any more does not wait for).
    streams: StreamLog,
    /// One clone per live hold of a capture or group (comm/shared.rs's `held`).
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

    /// Work is about to be enqueued on `stream`: kept, so the stream lives as long as the
    /// communicator or until a suspend finds its work done. Noting the stream noted last
    /// is one load.
    #[inline]
    pub(crate) fn note(&self, stream: &Stream) {
        self.streams.note(stream);
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
        // A capturing stream is not queried (that would spoil its capture): busy.
        self.streams
            .retain(|s| s.is_capturing().unwrap_or(true) || !matches!(s.is_idle(), Ok(true)));
        self.streams.streams().first().map(|s| {
            format!(
                "work it enqueued on stream {:?} is not done: synchronize the stream (or \
                 Communicator::wait) first",
                s.as_raw()
            )
        })
    }
}
