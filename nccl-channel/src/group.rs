//! Groups: several NCCL calls launched as one (`ncclGroupStart`/`ncclGroupEnd`).
//!
//! A call made inside a group only records its work; NCCL enqueues it at the group's end.
//! So a group is a [`DeferScope`]: the buffers, streams and communicators of its calls are
//! kept alive until then, even when their owners are dropped inside the group. NCCL's
//! group state belongs to the thread, so [`Group`] is not `Send`.

use std::cell::Cell;

use cuda_hal::DeferScope;
use nccl_sys::Nccl;

use crate::{Result, check};

thread_local! {
    /// How many groups started through this crate are open on this thread (NCCL's groups
    /// nest: only the outermost end launches).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// The outermost group of this thread ended in an error: what it launched may be
    /// incomplete (a peer's part missing) and stay queued in NCCL, to run, or pair with a
    /// later call, at any time. Its communicators are aborted before what it held goes
    /// (`Dependency::settle`).
    static FAILED: Cell<bool> = const { Cell::new(false) };
}

/// How many groups started through this crate are open on this thread.
pub(crate) fn depth() -> usize {
    DEPTH.try_with(Cell::get).unwrap_or(0)
}

/// Whether this thread's last group ended in an error (read while it lets go of what it
/// held, right after its end).
pub(crate) fn ended_in_error() -> bool {
    FAILED.try_with(Cell::get).unwrap_or(true)
}

/// Notes the end of a group: `rc` is `ncclGroupEnd`'s answer.
fn ended(rc: nccl_sys::ncclResult_t) {
    use nccl_sys::ncclResult_t as R;
    if rc != R::ncclSuccess && rc != R::ncclInProgress {
        let _ = FAILED.try_with(|f| f.set(true));
    }
}

/// An open NCCL group. [`end`](Self::end) closes it and reports its error; dropping it
/// closes it too, so a failing operation inside never leaves the group open.
///
/// One thread driving several ranks needs a group for each collective: each rank's part
/// waits for the others', and the group launches them together at its end. (The
/// [`group`] function does the same around a closure.)
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, DeviceBuffer, Stream};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{Communicator, Group, ReduceOp};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
/// let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
/// let comms = Communicator::init_all(&nccl, &ctxs)?;
/// let streams = [Stream::new(&ctxs[0])?, Stream::new(&ctxs[1])?];
/// let mut bufs = [
///     DeviceBuffer::from_slice(&ctxs[0], &[3u64])?,
///     DeviceBuffer::from_slice(&ctxs[1], &[5u64])?,
/// ];
/// let g = Group::start(&nccl)?;
/// for r in 0..2 {
///     comms[r].all_reduce_in_place(&mut bufs[r], ReduceOp::Prod, &streams[r])?;
/// }
/// g.end()?; // launches both ranks' parts
/// for r in 0..2 {
///     streams[r].synchronize()?;
///     assert_eq!(bufs[r].to_vec()?, [15]);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a group launches its operations when it ends"]
pub struct Group<'a> {
    nccl: &'a Nccl,
    open: bool,
    /// Dropped after `ncclGroupEnd` (fields drop after `Drop::drop`): releases what the
    /// group's calls hold once the work is enqueued.
    _scope: DeferScope,
}

static_assertions::assert_not_impl_any!(Group<'static>: Send, Sync);
static_assertions::assert_impl_all!(Group<'static>: std::fmt::Debug);

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("open", &self.open).finish()
    }
}

impl<'a> Group<'a> {
    /// `ncclGroupStart`.
    ///
    /// Refused with [`Error::InvalidArgument`](crate::Error::InvalidArgument) from a
    /// thread-local's destructor once this crate's per-thread state is gone: such a group
    /// could not keep what its calls use alive until it ends.
    #[doc(alias = "ncclGroupStart")]
    pub fn start(nccl: &'a Nccl) -> Result<Group<'a>> {
        // Opened first: the scope exists whenever NCCL's group does (what the calls use is
        // held from the first one on), and a thread that cannot keep one never starts one.
        let scope = DeferScope::try_open().map_err(|_| crate::Error::InvalidArgument {
            what: "Group::start",
            problem: "called from a thread-local's destructor after this crate's per-thread \
                      group state was torn down: the group could not keep what its calls use"
                .into(),
        })?;
        // SAFETY: no preconditions.
        unsafe { nccl_call!(nccl, ncclGroupStart()) }?;
        let _ = DEPTH.try_with(|d| {
            if d.get() == 0 {
                let _ = FAILED.try_with(|f| f.set(false));
            }
            d.set(d.get() + 1);
        });
        Ok(Group {
            nccl,
            open: true,
            _scope: scope,
        })
    }

    /// `ncclGroupEnd`: launches the group's operations. With non-blocking
    /// communicators NCCL may answer "in progress": that is success here, and
    /// [`Communicator::wait`](crate::Communicator::wait) waits for the work (what the
    /// group's calls use is released only once NCCL has enqueued them).
    #[doc(alias = "ncclGroupEnd")]
    pub fn end(mut self) -> Result<()> {
        self.open = false;
        // SAFETY: ends the group this value started.
        let (rc, call) = unsafe { nccl_raw_call!(self.nccl, ncclGroupEnd()) };
        ended(rc);
        if rc == nccl_sys::ncclResult_t::ncclInProgress {
            return Ok(());
        }
        check(self.nccl, rc, call, None)
    }
}

impl Group<'_> {
    /// Ends the group without launching it (`ncclGroupSimulateEnd`, NCCL ≥ 2.22) and
    /// returns NCCL's prediction of its time (`ncclSimInfo_t.estimatedTime`, in
    /// microseconds). None of the group's collectives and sends/receives runs (a peer
    /// that launches its part for real waits for this rank's, as with NCCL); inits and
    /// splits in the group do complete. What the calls held is released at once. A group
    /// with nothing to launch predicts zero. Before 2.22.3 it is
    /// [`Error::Unsupported`](crate::Error::Unsupported) and the group ends as
    /// [`end`](Self::end) ends it (NCCL has no other way to close it): its calls run.
    ///
    /// Refused with [`Error::InvalidArgument`](crate::Error::InvalidArgument) (after
    /// ending the group) when NCCL answers "in progress": a group of non-blocking
    /// communicators, which NCCL launches for real in the background and does not
    /// simulate. The simulated NCCL predicts each call as 10 µs plus its largest buffer at
    /// 100 GB/s ([`nccl_mock::LATENCY_US`](https://docs.rs/nccl-mock)):
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use std::time::Duration;
    /// use cuda_hal::{Cuda, DeviceBuffer, Stream};
    /// use nccl_channel::{Communicator, Group, ReduceOp};
    /// # let (cuda, gpus) = cuda_mock::MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// # let nccl = Arc::new(nccl_mock::MockNccl::new(&gpus).build()?.0);
    /// let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
    /// let comms = Communicator::init_all(&nccl, &ctxs)?;
    /// let streams = [Stream::new(&ctxs[0])?, Stream::new(&ctxs[1])?];
    /// let mut bufs = [
    ///     DeviceBuffer::from_slice(&ctxs[0], &[1u8; 1_000_000])?,
    ///     DeviceBuffer::from_slice(&ctxs[1], &[2u8; 1_000_000])?,
    /// ];
    /// let g = Group::start(&nccl)?;
    /// for r in 0..2 {
    ///     comms[r].all_reduce_in_place(&mut bufs[r], ReduceOp::Sum, &streams[r])?;
    /// }
    /// let predicted = g.simulate_end()?;
    /// // Two ranks' parts, each 10 µs + 1 MB at 100 GB/s.
    /// assert_eq!(predicted, Duration::from_micros(40));
    /// assert_eq!(bufs[0].to_vec()?[0], 1, "nothing ran");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclGroupSimulateEnd")]
    pub fn simulate_end(mut self) -> Result<std::time::Duration> {
        let (f, call) = optional!(self.nccl, ncclGroupSimulateEnd)?;
        if DEPTH.try_with(Cell::get).unwrap_or(0) > 1 {
            // NCCL would only close this level, and the outermost end would run the calls.
            self.end()?;
            return Err(crate::Error::InvalidArgument {
                what: "Group::simulate_end",
                problem: "the group is nested in another one, whose end runs the calls: \
                          simulate the outermost group"
                    .into(),
            });
        }
        self.open = false;
        let mut info = nccl_sys::NCCL_SIM_INFO_INITIALIZER;
        // SAFETY: ends the group this value started; `info` is initialised by
        // NCCL_SIM_INFO_INITIALIZER and outlives the call.
        let rc = unsafe { f(&mut info) };
        ended(rc);
        if rc == nccl_sys::ncclResult_t::ncclInProgress {
            return Err(crate::Error::InvalidArgument {
                what: "Group::simulate_end",
                problem: "the group holds non-blocking communicators, which NCCL launches for \
                          real instead of simulating"
                    .into(),
            });
        }
        check(self.nccl, rc, call, None)?;
        let us = f64::from(info.estimatedTime);
        if info.estimatedTime == nccl_sys::NCCL_SIM_INFO_INITIALIZER.estimatedTime {
            // Left as initialised: the group held nothing to launch.
            return Ok(std::time::Duration::ZERO);
        }
        if !us.is_finite() || us < 0.0 {
            return Err(crate::Error::InvalidArgument {
                what: "Group::simulate_end",
                problem: format!("NCCL gave no estimate (estimatedTime = {us})"),
            });
        }
        Ok(std::time::Duration::from_nanos((us * 1e3).round() as u64))
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
        if self.open {
            // SAFETY: ends the group this value started; the error has nowhere to go
            // but to what the group held.
            ended(unsafe { (self.nccl.fns().ncclGroupEnd)() });
        }
    }
}

/// Runs `f` inside a group. The group always ends; `f`'s error wins over the group's.
/// A group whose end fails aborts the communicators its calls used before it drops
/// what they used: their work may be incomplete, and would stay queued in NCCL.
///
/// ```
/// # use cuda_hal::DeviceBuffer;
/// use nccl_channel::{Communicator, Error, group};
/// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
/// // Two ranks on this thread (`comms`, `ctxs`, `streams`, as in `Group`'s example).
/// let mut bufs = [
///     DeviceBuffer::from_slice(&ctxs[0], &[1u8, 0])?,
///     DeviceBuffer::from_slice(&ctxs[1], &[0u8, 2])?,
/// ];
/// let peers = group(&nccl, || {
///     for r in 0..2 {
///         comms[r].all_gather_in_place(&mut bufs[r], &streams[r])?;
///     }
///     Ok(comms.len()) // the closure's value comes out of the group
/// })?;
/// assert_eq!(peers, 2);
/// streams[1].synchronize()?;
/// assert_eq!(bufs[1].to_vec()?, [1, 2]);
///
/// // An error inside still ends the group, and is the one returned.
/// let r = group(&nccl, || comms[0].all_gather_in_place(&mut bufs[0], &streams[1]));
/// // (Rank 0's communicator, rank 1's stream: refused before any NCCL call.)
/// assert!(matches!(r, Err(Error::WrongDevice { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn group<R>(nccl: &Nccl, f: impl FnOnce() -> Result<R>) -> Result<R> {
    let g = Group::start(nccl)?;
    let r = f();
    let e = g.end();
    let v = r?;
    e?;
    Ok(v)
}
