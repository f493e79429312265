//! Ending a communicator and bounding its waits: [`Communicator::close`] and
//! [`abort`](Communicator::abort), an [`AbortHandle`] for other threads, and the waits and
//! revocation that deadlines and aborts end (the machinery is reliability.rs's).

use std::time::Instant;

use cuda_hal::Stream;
use nccl_sys::ncclResult_t;

use super::Communicator;
use super::shared::Teardown;
use crate::backoff::Backoff;
use crate::notice::{Deadline, Notice};
use crate::reliability::AbortHandle;
use crate::{Error, Result, check};

impl Communicator {
    /// Finalises (flushing pending work; a blocking communicator waits for its peers) and
    /// destroys, reporting errors that a drop would swallow. Inside an open group it
    /// returns [`Error::InvalidArgument`] and the communicator is released when the group
    /// ends.
    #[doc(alias = "ncclCommFinalize")]
    #[doc(alias = "ncclCommDestroy")]
    pub fn close(self) -> Result<()> {
        self.release(Teardown::Close, "Communicator::close")
    }

    /// Aborts: stops pending work without waiting for peers, and frees the communicator.
    /// Inside an open group the abort happens when the group ends.
    ///
    /// The way out of a communicator whose peers may be gone (a blocking
    /// [`close`](Self::close) would wait for them). From another thread, or while this one
    /// waits, use an [`AbortHandle`].
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use cuda_hal::Cuda;
    /// # use cuda_mock::MockDriver;
    /// # use nccl_channel::Communicator;
    /// # use nccl_mock::MockNccl;
    /// # let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// # let (nccl, world) = MockNccl::new(&gpus).build()?;
    /// # let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
    /// let mut comms = Communicator::init_all(&Arc::new(nccl), &ctxs)?;
    /// comms.pop().expect("rank 1").abort()?; // does not wait for rank 0
    /// comms.pop().expect("rank 0").abort()?;
    /// assert!(world.live().is_empty()); // the simulated NCCL holds no communicator
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommAbort")]
    pub fn abort(self) -> Result<()> {
        if self.shared.in_group() {
            self.shared.abort.abort();
            return Ok(());
        }
        match self.shared.teardown(Teardown::Abort) {
            Err(Error::Aborted) => Ok(()),
            r => r,
        }
    }

    fn release(self, how: Teardown, what: &'static str) -> Result<()> {
        if self.shared.in_group() {
            return Err(Error::InvalidArgument {
                what,
                problem: "called inside an open group, whose work still needs the \
                          communicator; it is released when the group ends"
                    .into(),
            });
        }
        drop(self.scratch.into_inner());
        drop(self.kit.into_inner());
        // The private channel's handle goes with this one's (first).
        drop(self.private);
        self.shared.teardown(how)
    }
}

impl Communicator {
    /// A handle that aborts this communicator from another thread.
    #[must_use]
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort_flag().clone()
    }

    /// Waits until the work enqueued on `stream` is done, checking the communicator's
    /// asynchronous error while it waits. A failure, the deadline
    /// ([`CommConfig::timeout`](crate::CommConfig::timeout)) or an [`AbortHandle`] aborts
    /// the communicator and returns
    /// an error; a dead peer thus gives an error instead of a hang. A stream of another
    /// device or context than the communicator's is refused ([`Error::WrongDevice`],
    /// [`Error::WrongContext`]), as the collectives refuse it.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use std::time::Duration;
    /// use cuda_hal::{Cuda, DeviceBuffer, Stream};
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{CommConfig, Communicator, ReduceOp, UniqueId};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let id = UniqueId::generate(&nccl)?;
    /// // Non-blocking, with 10 s for any one wait: a dead peer is an error, not a hang.
    /// let config = CommConfig::non_blocking(Duration::from_secs(10));
    /// let sums = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..2)
    ///         .map(|rank| {
    ///             let (cuda, nccl, config) = (&cuda, &nccl, &config);
    ///             s.spawn(move || -> nccl_channel::Result<Vec<u64>> {
    ///                 let ctx = cuda.device(rank)?.primary_context()?;
    ///                 let comm = Communicator::init_rank_with(nccl, &ctx, &id, 2, rank, config)?;
    ///                 let stream = Stream::new(&ctx)?;
    ///                 let mut buf = DeviceBuffer::from_slice(&ctx, &[rank as u64 + 1; 3])?;
    ///                 comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
    ///                 comm.wait(&stream)?; // instead of stream.synchronize()
    ///                 let sum = buf.to_vec()?;
    ///                 comm.close()?;
    ///                 Ok(sum)
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(sums, [[3, 3, 3], [3, 3, 3]]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(&self, stream: &Stream) -> Result<()> {
        self.wait_within_deadline(stream, false)
    }

    /// [`wait`](Self::wait) for the crate's own exchanges: on a blocking communicator,
    /// work found done is done, whatever a peer that finished too and left since did to
    /// the asynchronous error (a non-blocking one asks NCCL first: its work may not be
    /// enqueued yet).
    pub(crate) fn wait_for_exchange(&self, stream: &Stream) -> Result<()> {
        self.wait_within_deadline(stream, self.config().is_blocking())
    }

    fn wait_within_deadline(&self, stream: &Stream, done_when_idle: bool) -> Result<()> {
        let raw = self.handle()?;
        self.same_context("Communicator::wait", "stream", stream.context())?;
        let timeout = self.config().get_timeout();
        let deadline = crate::backoff::deadline_after(timeout);
        let mut backoff = Backoff::poll();
        let mut notice = Notice::new(Instant::now(), Deadline::Config(timeout), || {
            self.shared.describe("the stream work (Communicator::wait)")
        });
        loop {
            if done_when_idle && stream.is_idle()? {
                return Ok(());
            }
            let mut e = ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator and a valid out-pointer.
            let (rc, call) =
                unsafe { nccl_raw_call!(self.nccl(), ncclCommGetAsyncError(raw, &mut e)) };
            let r = check(self.nccl(), rc, call, Some(raw)).and_then(|_| match e {
                ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => Ok(()),
                other => check(self.nccl(), other, "Communicator::wait", Some(raw)),
            });
            if let Err(err) = r {
                self.abort_now();
                return Err(err);
            }
            if e == ncclResult_t::ncclSuccess && stream.is_idle()? {
                return Ok(());
            }
            if self.abort_flag().is_requested() {
                self.abort_now();
                return Err(Error::Aborted);
            }
            let now = Instant::now();
            if now >= deadline {
                self.abort_now();
                return Err(Error::Timeout {
                    what: format!(
                        "the stream work of rank {} (communicator aborted)",
                        self.rank()
                    ),
                    after: timeout,
                });
            }
            notice.tick(now);
            std::thread::sleep(backoff.pause_until(deadline));
        }
    }

    /// Revokes the communicator (NCCL ≥ 2.28.7): pending and later operations fail, so
    /// every rank can leave a collective that cannot finish and then shrink or destroy.
    #[doc(alias = "ncclCommRevoke")]
    pub fn revoke(&self) -> Result<()> {
        let raw = self.handle()?;
        let (f, call) = optional!(self.nccl(), ncclCommRevoke)?;
        // SAFETY: a live communicator; flags 0 (NCCL_REVOKE_DEFAULT).
        let rc = unsafe { f(raw, 0) };
        self.check(rc, call)
    }
}
