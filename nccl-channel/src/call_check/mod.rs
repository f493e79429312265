//! The checked mode ([`CommConfig::check_calls`](crate::CommConfig::check_calls), or
//! `NCCL_CHANNEL_CHECK_CALLS=1`): before each collective the ranks compare what they are
//! about to call, so that a program whose ranks disagree gets a typed error naming both
//! calls on every rank instead of a hang or corrupt data.
//!
//! Each rank exchanges a record of its call (the collective, element type, count,
//! reduction, root, and where its buffers lie in symmetric windows) on the private channel
//! (exchange/), and compares every rank's with its own. The crate's own agreements travel
//! the same channel in records of the same shape, so a rank that allocates symmetric
//! memory or registers a window while its peer checks a collective gets a `CallMismatch`
//! naming both, on both. Every rank must check, or none: a rank that is not checking
//! issues its collective without a comparison, and the others wait for theirs until their
//! deadline.

mod record;
pub(crate) mod setting;

pub(crate) use record::Call;
pub(crate) use record::{agreement, describe, first_difference, value};

use cuda_hal::Stream;

use crate::exchange::{Payload, exchange};
use crate::{Communicator, Error, Result};

impl Communicator {
    /// In the checked mode, compares `call` with every rank's before the caller issues it:
    /// [`Error::CallMismatch`] when they differ. Off (the default), it is never called.
    /// Calls inside an open group or on a capturing stream are not checked: they cannot
    /// wait for the comparison. (Whether to check depends on this thread's program only, so
    /// that every rank decides alike.) While a capture forbids this thread host waits (one
    /// begun here in thread-local mode, or a global one of any thread), the comparison
    /// cannot wait: the call fails with [`cuda_hal::Error::Capturing`] before anything is
    /// issued, and its peers wait for their deadline. A global capture on another thread is
    /// a matter of timing, so with the checked mode capture in thread-local mode.
    ///
    /// Only [`Enqueue::call`](crate::enqueue::Enqueue::call) calls it, after every local check of
    /// the call: a rank refused locally never takes part in a comparison its peers then
    /// act on.
    /// (The caller tests [`checks_calls`](Self::checks_calls) first.)
    #[cold]
    pub(crate) fn check_call(&self, what: &'static str, call: Call, stream: &Stream) -> Result<()> {
        if crate::group::depth() > 0 || stream.is_capturing()? {
            return Ok(());
        }
        if stream.host_waits_forbidden() {
            return Err(cuda_hal::Error::Capturing {
                what: "the checked mode's comparison (a capture forbids this thread host \
                       waits: capture on another thread, or turn the checked mode off)",
            }
            .into());
        }
        let mine = call.payload();
        let seq = self.exchanges_issued();
        let got = exchange(what, &[(self, mine)])?;
        let got = got.first().map_or(&[][..], Vec::as_slice);
        match first_difference(&mine, got) {
            None => Ok(()),
            Some(d) => Err(self.mismatch(what, &mine, seq, d)),
        }
    }

    /// [`Error::CallMismatch`]: this rank's `mine` against `other`'s, in exchange `seq`.
    pub(crate) fn mismatch(
        &self,
        what: &'static str,
        mine: &Payload,
        seq: u64,
        (other_rank, other): (usize, Payload),
    ) -> Error {
        Error::CallMismatch {
            what,
            rank: self.rank(),
            call: describe(mine, seq, crate::topic::topic_name),
            other_rank,
            other_call: describe(&other, seq, crate::topic::topic_name),
        }
    }
}
