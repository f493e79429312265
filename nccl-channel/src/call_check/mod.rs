//! The checked mode ([`CommConfig::check_calls`](crate::CommConfig::check_calls), or
//! `NCCL_CHANNEL_CHECK_CALLS=1`): before each collective the ranks compare what they are
//! about to call, so that a program whose ranks disagree gets a typed error naming both
//! calls on every rank instead of a hang or corrupt data.
//!
//! Each rank all-gathers a record of its call (a mark, the number of the call among the
//! checked calls of this communicator, the collective, element type, count, reduction and
//! root) on a stream of its own, waits for it, and compares every rank's record with its
//! own. Every rank must check, or none: a rank that is not checking pairs its own
//! collective with the others' exchange, which on real NCCL hangs or corrupts data (the
//! record says so only when that collective happens to look like the exchange).

pub(crate) mod kit;
mod record;
pub(crate) mod setting;

use cuda_hal::{DeviceBuffer, Stream};

pub(crate) use kit::CheckKit;
pub(crate) use record::Call;
use record::{WORDS, describe, exchanged, first_difference};

use crate::{Communicator, Error, Result};

impl Communicator {
    /// In the checked mode, compares `call` with every rank's before the caller issues it:
    /// [`Error::CallMismatch`] when they differ. Off (the default), it costs one test.
    /// Calls inside an open group or on a capturing stream are not checked: they cannot
    /// wait for the comparison. (Whether to check depends on this thread's program only, so
    /// that every rank decides alike.) While a capture forbids this thread host waits (one
    /// begun here in thread-local mode, or a global one of any thread), the comparison
    /// cannot wait: the call fails with [`cuda_hal::Error::Capturing`] before anything is
    /// issued, and its peers wait for their deadline. A global capture on another thread is
    /// a matter of timing, so with the checked mode capture in thread-local mode.
    #[inline]
    pub(crate) fn check_call(&self, what: &'static str, call: Call, stream: &Stream) -> Result<()> {
        if !self.checks_calls() {
            return Ok(());
        }
        self.compare_call(what, call, stream)
    }

    #[cold]
    fn compare_call(&self, what: &'static str, call: Call, stream: &Stream) -> Result<()> {
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
        self.handle()?;
        self.shared().suspend.refuse(what)?;
        let mut slot = self
            .checks
            .try_borrow_mut()
            .map_err(|_| Error::InvalidArgument {
                what,
                problem: "called while this communicator checks another call".into(),
            })?;
        let kit = match &mut *slot {
            Some(kit) => kit,
            None => slot.insert(self.check_kit()?),
        };
        // Numbered once issued: a rank whose exchange fails before NCCL has it keeps the
        // number, as its peers keep theirs.
        let sent = call.record(self.checked_calls());
        // The kit's buffers are this communicator's alone, used on its stream only (their
        // use is noted there, so their release waits for it).
        kit.send.copy_from_host_on(&sent, &kit.stream)?;
        self.all_gather_unchecked(&kit.send, &mut kit.recv, &kit.stream)?;
        self.checked_call_issued();
        // Polled, not a bare synchronize: a peer that never comes is said on stderr and
        // ends at the communicator's deadline (which aborts it), as any wait does.
        let waited = if kit.stream.is_idle()? {
            Ok(())
        } else {
            self.wait(&kit.stream)
        };
        let got = match (
            kit.stream.synchronize().and_then(|()| kit.recv.to_vec()),
            waited,
        ) {
            (Ok(got), waited) => (got, waited),
            (Err(e), Ok(())) => return Err(e.into()),
            (Err(_), Err(w)) => return Err(w),
        };
        let (got, waited) = got;
        let mismatch = |(other_rank, other_call)| Error::CallMismatch {
            what,
            rank: self.rank(),
            call: describe(&sent),
            other_rank,
            other_call,
        };
        let difference = first_difference(&sent, &got, self.size());
        // Every rank's record of this very exchange came (its mark and number): a
        // difference there is the answer, even when the wait failed after (a peer that
        // got its answer may have left, aborting, before this rank looked).
        if exchanged(&sent, &got, self.size())
            && let Some(d) = difference
        {
            return Err(mismatch(d));
        }
        // A failed wait aborted the communicator: the call must not go on to NCCL.
        waited?;
        difference.map_or(Ok(()), |d| Err(mismatch(d)))
    }

    fn check_kit(&self) -> Result<CheckKit> {
        Ok(CheckKit {
            stream: Stream::non_blocking(self.context())?,
            send: DeviceBuffer::zeroed(self.context(), WORDS)?,
            recv: DeviceBuffer::zeroed(self.context(), WORDS * self.size())?,
        })
    }
}
