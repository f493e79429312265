//! Ordering this crate's streams after another library's stream, which that library may
//! begin capturing on another thread at any moment (cudarc's, for memory moved in or lent).
//!
//! No question asked of that stream before the ordering can be trusted: the capture may
//! begin right after the answer, the event recorded there then lands in that library's
//! graph, and a stream of ours that waits for it joins that capture, so that our work is
//! recorded into a graph that holds nothing it uses. So the ordering goes through a private
//! stream, the relay: the relay waits for the other library's stream first, and only then
//! is the driver asked whether the relay joined a capture. Nothing but this ordering
//! enqueues on the relay (one ordering at a time), so the answer stays true: if it joined,
//! the ordering is refused and our stream was never touched; if not, an event recorded on
//! the relay outside any capture is what our stream waits for, and no capture can be
//! joined through it.

use std::sync::Mutex;

use crate::hold::foreign_capture::give_to_capturing_graph;
use crate::hold::lock::lock;
use crate::{Error, Event, Result, Stream};

/// A private stream to order through (made at the first ordering, kept for the next).
pub(crate) struct Relay {
    stream: Mutex<Option<Stream>>,
}

impl Relay {
    pub(crate) fn new() -> Relay {
        Relay {
            stream: Mutex::new(None),
        }
    }

    /// Makes `later` wait for the work enqueued so far on `theirs` (another library's
    /// stream of the same context), and never joins a capture of `theirs` to `later`:
    /// `refused` when the relay joined one (that library began capturing `theirs` before
    /// the ordering reached it), with `later` untouched. A driver error in the event path
    /// falls back to a host wait for `theirs`, as the orderings without a relay do (which
    /// fails, refused, while `theirs` is captured).
    pub(crate) fn order(&self, theirs: &Stream, later: &Stream, refused: Error) -> Result<()> {
        // Held to the end: nothing else enqueues on the relay between its wait, the
        // question and its record.
        let mut slot = lock(&self.stream);
        let relay = match slot.take() {
            Some(r) => r,
            None => Stream::non_blocking(theirs.context())?,
        };
        let waited = Event::without_timing(theirs.context())
            .and_then(|e| e.record_unlocked(theirs).map(|()| e))
            .and_then(|e| relay.wait_event_unlocked(&e));
        if waited.is_err() {
            *slot = Some(relay);
            return theirs.synchronize();
        }
        // Asked after the act. An error answers nothing: the relay is treated as joined.
        if relay.is_capturing().unwrap_or(true) {
            retire(theirs, relay);
            return Err(refused);
        }
        let ordered = Event::without_timing(theirs.context())
            .and_then(|e| e.record_unlocked(&relay).map(|()| e))
            .and_then(|e| later.wait_event_unlocked(&e));
        *slot = Some(relay);
        match ordered {
            Ok(()) => Ok(()),
            Err(_) => theirs.synchronize(),
        }
    }
}

/// A relay that joined another library's capture of `theirs`: joined back into `theirs`
/// (so that library can end its capture), and never used again. It is given to the
/// capturing graph, which keeps it alive until the graph and its instances are gone (a
/// stream destroyed while its capture runs would spoil that capture); a relay whose capture
/// ended meanwhile is destroyed at once.
fn retire(theirs: &Stream, relay: Stream) {
    let rejoined = Event::without_timing(theirs.context())
        .and_then(|e| e.record_unlocked(&relay).map(|()| e))
        .and_then(|e| theirs.wait_event_unlocked(&e));
    // A failed rejoin leaves the capture unjoined: the other library's end of capture then
    // fails and no graph is made, so nothing recorded runs. Nothing more to undo here.
    let _ = rejoined;
    let ctx = relay.context().clone();
    let raw = relay.as_raw();
    // On error the relay is kept for the rest of the process (a leak, never a spoilt
    // capture): `give_to_capturing_graph` says so by leaking what it was given.
    if give_to_capturing_graph(&ctx, raw, Box::new(relay)).is_err() {
        eprintln!(
            "cuda-hal: a stream joined another library's capture while ordering after it, and \
             that capture's graph could not be given it: it is kept for the rest of the process"
        );
    }
}
