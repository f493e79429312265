//! Non-blocking communicators, deadlines and aborts: a dead peer gives an error, not a hang.
//!
//! What lies below the communicator: the [`AbortHandle`], the poll of a non-blocking
//! call, the error for a missing optional function. It never names the communicator,
//! whose own calls on top of it (`wait`, `revoke`, `abort_handle`) are in comm/teardown.rs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nccl_sys::{Nccl, NcclFns, NcclVersion, ncclComm_t, ncclResult_t};

use crate::backoff::Backoff;
use crate::notice::{Deadline, Notice};
use crate::{Error, Result, check};

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

/// Polls `ncclCommGetAsyncError(raw)` until it leaves `ncclInProgress`; past the wait
/// notice's time, says on stderr that it waits for what `about` names.
pub(crate) fn poll(
    nccl: &Nccl,
    raw: ncclComm_t,
    what: &'static str,
    deadline: Instant,
    timeout: Duration,
    abort: &AbortHandle,
    about: impl FnOnce() -> String,
) -> Result<()> {
    let mut backoff = Backoff::poll();
    let mut notice = Notice::new(Instant::now(), Deadline::Config(timeout), about);
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
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: timeout,
            });
        }
        notice.tick(now);
        std::thread::sleep(backoff.pause_until(deadline));
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
