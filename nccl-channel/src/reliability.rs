//! Non-blocking communicators, deadlines and aborts: a dead peer gives an error, not a hang.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cuda_hal::Stream;
use nccl_sys::{Nccl, NcclFns, NcclVersion, ncclComm_t, ncclResult_t};

use crate::backoff::Backoff;
use crate::{Communicator, Error, Result, check};

/// Aborts a communicator from another thread: the owner's current or next wait stops,
/// aborts the communicator and returns [`Error::Aborted`]. Cheap to clone.
///
/// A watchdog's tool: here rank 1 never joins rank 0's all-reduce, and a watchdog thread
/// stops rank 0's wait long before its 30 s deadline.
///
/// ```
/// # use std::sync::Arc;
/// use std::time::Duration;
/// use cuda_hal::{Cuda, DeviceBuffer, Stream};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{CommConfig, Communicator, Error, ReduceOp, UniqueId};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
/// let id = UniqueId::generate(&nccl)?;
/// let config = CommConfig::non_blocking(Duration::from_secs(30));
/// let join = |rank: usize| -> nccl_channel::Result<(Communicator, Stream)> {
///     let ctx = cuda.device(rank)?.primary_context()?;
///     let comm = Communicator::init_rank_with(&nccl, &ctx, &id, 2, rank, &config)?;
///     Ok((comm, Stream::new(&ctx)?))
/// };
/// std::thread::scope(|s| -> nccl_channel::Result<()> {
///     let peer = s.spawn(|| join(1)); // joins, then never takes part
///     let (comm, stream) = join(0)?;
///     let _idle_peer = peer.join().expect("rank 1 panicked")?;
///
///     let watchdog = comm.abort_handle();
///     s.spawn(move || {
///         std::thread::sleep(Duration::from_millis(100));
///         watchdog.abort();
///     });
///     let mut buf = DeviceBuffer::from_slice(comm.context(), &[1i32])?;
///     let r = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream);
///     assert_eq!(r, Err(Error::Aborted));
///     assert!(comm.is_aborted());
///     Ok(())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct AbortHandle {
    flag: Arc<AtomicBool>,
}

static_assertions::assert_impl_all!(AbortHandle: Send, Sync, std::fmt::Debug);

impl AbortHandle {
    /// Requests the abort.
    pub fn abort(&self) {
        self.flag.store(true, Ordering::Release);
    }

    /// Whether an abort was requested.
    #[must_use]
    pub fn is_requested(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

/// Polls `ncclCommGetAsyncError(raw)` until it leaves `ncclInProgress`.
pub(crate) fn poll(
    nccl: &Nccl,
    raw: ncclComm_t,
    what: &'static str,
    deadline: Instant,
    timeout: Duration,
    abort: &AbortHandle,
) -> Result<()> {
    let mut backoff = Backoff::poll();
    loop {
        let mut e = ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid out-pointer.
        let (rc, call) = unsafe { nccl_raw_call!(nccl, ncclCommGetAsyncError(raw, &mut e)) };
        check(nccl, rc, call, Some(raw))?;
        match e {
            ncclResult_t::ncclSuccess => return Ok(()),
            ncclResult_t::ncclInProgress => {}
            other => return check(nccl, other, what, Some(raw)),
        }
        if abort.is_requested() {
            return Err(Error::Aborted);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: timeout,
            });
        }
        std::thread::sleep(backoff.next_pause());
    }
}

/// The version NCCL needs for an optional function, for an [`Error::Unsupported`].
pub(crate) fn unsupported(nccl: &Nccl, function: &'static str) -> Error {
    let needed = NcclFns::OPTIONAL
        .iter()
        .find(|(n, _)| *n == function)
        .map(|(_, v)| NcclVersion(*v).to_string())
        .unwrap_or_else(|| "newer".into());
    Error::Unsupported {
        feature: function,
        needed,
        found: nccl.version().to_string(),
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
        let raw = self.handle()?;
        self.same_context("Communicator::wait", "stream", stream.context())?;
        let deadline = crate::backoff::deadline_after(self.config().get_timeout());
        let mut backoff = Backoff::poll();
        loop {
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
            if Instant::now() >= deadline {
                self.abort_now();
                return Err(Error::Timeout {
                    what: format!(
                        "the stream work of rank {} (communicator aborted)",
                        self.rank()
                    ),
                    after: self.config().get_timeout(),
                });
            }
            std::thread::sleep(backoff.next_pause());
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
