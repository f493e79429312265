//! [`Communicator`]: one rank's NCCL communicator, bound to one device context; the type,
//! what it is (rank, size, device) and the checks its methods share. Its methods live
//! by family in the files the type's docs list.
//!
//! The NCCL handle lives in a shared [`CommShared`] (shared.rs), so that work which has
//! not been launched yet (an open group) or can be launched again (a captured graph)
//! keeps it alive, and a graph launch can check it was not aborted in the meantime.

pub(crate) mod init;
pub(crate) mod private;
mod shared;
mod teardown;

pub(crate) use shared::CommShared;
use shared::{Teardown, held};

use std::cell::{Cell, OnceCell};
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cuda_hal::{Context, Device, DeviceBuffer, KeepAlive, Stream};
use nccl_sys::{Nccl, ncclComm_t, ncclResult_t};

use crate::config::CommConfig;
use crate::registered::pool::Pool;
use crate::registered::registry::{CommState, Registry};
use crate::registered::release::{CommOwner, release_deferred};
use crate::reliability::AbortHandle;
use crate::{Error, Result, check};

/// One rank of an NCCL communicator.
///
/// It belongs to one device's [`Context`]: streams and buffers passed to its collectives
/// must be of the same context, which is checked before every call. A communicator must
/// not be used by two threads at once (NCCL's rule), so it is `Send` but not `Sync`.
///
/// Every method goes through one state check: after an abort or destroy, no NCCL call is
/// made with its handle, and methods return [`Error::Aborted`].
///
/// Dropping it aborts it (`ncclCommAbort`, which never waits for peers) when it is
/// blocking, and finalises and destroys it within its deadline when it is non-blocking;
/// [`close`](Self::close) finalises and reports errors. An operation that fails with a
/// system, remote, internal, CUDA or timeout error aborts it at once. Work that is not
/// launched yet (an open group) or can be launched again (a captured graph) keeps the
/// NCCL communicator alive past the drop; a graph refuses to launch once it was aborted.
///
/// A rank per thread or process joins with [`init_rank`](Self::init_rank) (the crate's
/// quick start); one thread driving every local device makes them all with
/// [`init_all`](Self::init_all) and launches their parts of a collective in one
/// [`group`](crate::group), since each rank's part waits for the others':
///
/// ```
/// use std::sync::Arc;
/// use cuda_hal::{Cuda, DeviceBuffer, Stream};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{Communicator, ReduceOp, group};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let (nccl, _world) = MockNccl::new(&gpus).build()?;
/// let nccl = Arc::new(nccl);
/// let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
/// let comms = Communicator::init_all(&nccl, &ctxs)?;
/// let streams = [Stream::new(&ctxs[0])?, Stream::new(&ctxs[1])?];
/// let mut bufs = [
///     DeviceBuffer::from_slice(&ctxs[0], &[1.0f32, 2.0])?,
///     DeviceBuffer::from_slice(&ctxs[1], &[10.0f32, 20.0])?,
/// ];
/// group(&nccl, || {
///     for ((comm, buf), stream) in comms.iter().zip(&mut bufs).zip(&streams) {
///         comm.all_reduce_in_place(buf, ReduceOp::Sum, stream)?;
///     }
///     Ok(())
/// })?;
/// for (buf, stream) in bufs.iter().zip(&streams) {
///     stream.synchronize()?;
///     assert_eq!(buf.to_vec()?, [11.0, 22.0]);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Its methods, by family
///
/// Each family lives in one file of the crate's source (`src/`):
///
/// | Family | Methods | File |
/// |---|---|---|
/// | Making one | [`init_rank`](Self::init_rank), [`init_rank_with`](Self::init_rank_with), [`init_all`](Self::init_all), [`from_raw`](Self::from_raw), [`from_raw_all`](Self::from_raw_all) | `comm/init.rs` |
/// | Making one at scale | [`init_rank_scalable`](Self::init_rank_scalable) | `scalable.rs` |
/// | Splitting and shrinking | [`split`](Self::split), [`split_with`](Self::split_with), [`split_all`](Self::split_all), [`shrink`](Self::shrink), [`shrink_all`](Self::shrink_all) | `split.rs` |
/// | Growing | [`grow_id`](Self::grow_id), [`grow`](Self::grow), [`grow_with`](Self::grow_with), [`grow_all`](Self::grow_all), [`join_grown`](Self::join_grown), [`join_grown_with`](Self::join_grown_with) | `grow.rs` |
/// | What it is | [`rank`](Self::rank), [`size`](Self::size), [`device`](Self::device), [`context`](Self::context), [`nccl`](Self::nccl), [`config`](Self::config), [`as_raw`](Self::as_raw), [`keep_alive`](Self::keep_alive) | `comm/mod.rs` |
/// | Collectives | [`all_reduce`](Self::all_reduce), [`all_gather`](Self::all_gather), [`reduce_scatter`](Self::reduce_scatter), [`broadcast`](Self::broadcast), [`reduce`](Self::reduce) (each also `_in_place`), [`all_to_all`](Self::all_to_all), [`all_to_all_v`](Self::all_to_all_v), [`gather`](Self::gather), [`scatter`](Self::scatter), [`send`](Self::send), [`recv`](Self::recv), [`barrier`](Self::barrier) | `collective.rs` |
/// | Collectives on raw addresses | [`raw`](Self::raw) | `raw.rs` |
/// | Pooled memory | [`buffer`](Self::buffer), [`set_pool_policy`](Self::set_pool_policy), [`pooled_buffers`](Self::pooled_buffers), [`trim_pool`](Self::trim_pool) | `registered/pool_methods.rs` |
/// | NCCL memory | [`alloc_nccl`](Self::alloc_nccl) | `registered/nccl_memory.rs` |
/// | Registration and windows | [`register`](Self::register), [`register_window`](Self::register_window), [`register_windows`](Self::register_windows) | `registered/register.rs` |
/// | One-sided | [`signal`](Self::signal), [`wait_signal`](Self::wait_signal) ([`Window::put_signal`](crate::Window::put_signal)) | `onesided.rs` |
/// | Suspending | [`suspend`](Self::suspend), [`resume`](Self::resume), [`is_suspended`](Self::is_suspended), [`mem_stats`](Self::mem_stats) | `suspend/calls.rs` |
/// | Ending, aborts and deadlines | [`close`](Self::close), [`abort`](Self::abort), [`abort_handle`](Self::abort_handle), [`wait`](Self::wait), [`revoke`](Self::revoke), [`async_error`](Self::async_error), [`is_aborted`](Self::is_aborted) | `comm/teardown.rs` |
///
/// # Following a call
///
/// [`all_gather`](Self::all_gather) (collective.rs) takes the one order every call takes
/// (enqueue.rs), in three steps:
///
/// 1. `enqueue` (enqueue.rs): the element type exists in the loaded NCCL, the handle is live
///    (`handle`, comm/mod.rs) and not suspended (suspend/), the stream is of this
///    context; it takes the stream's order lock until the work is enqueued.
/// 2. `Enqueue::buf` (enqueue.rs), per buffer: same context, the length, the buffer told of
///    its use on the stream (`cuda_hal::Enqueuing::begin`: cuda-hal orders its free after
///    the work), the pool's registration (registered/pool_methods.rs, by
///    [`PoolPolicy`](crate::PoolPolicy)) and the communicator's record of the memory NCCL
///    may touch (registered/registry.rs); only then the guard gives the buffer's address.
/// 3. `Enqueue::call` (enqueue.rs): in the checked mode the ranks compare their calls on the
///    private channel (call_check/, exchange/, comm/private.rs), after every local check;
///    then the one `unsafe` call of `ncclAllGather` from
///    [`nccl_sys::NcclFns`](nccl_sys::NcclFns), the table nccl-sys resolved when NCCL was
///    loaded, through the `nccl_raw_call!` macro (lib.rs); `check` (comm/mod.rs) turns its
///    status into a [`Result`], polling a non-blocking communicator and aborting on the
///    failures NCCL cannot recover from.
///
/// # Its private channel
///
/// Every communicator this crate makes (or adopts) gets a second communicator of the same
/// ranks, split from it before the program holds it: the crate's own exchanges between
/// the ranks (a window's size, a symmetric allocation's outcome, the checked mode's
/// comparisons) travel there, where no collective of the program can pair with them. It
/// uses one CTA (and the communicator's NCCL resources where it was made with
/// [`split_share`](crate::CommConfig::split_share)), and goes with
/// it; BENCHMARKS.md gives what it costs.
pub struct Communicator {
    /// The private channel (comm/private.rs), where the crate's own exchanges travel
    /// (its handle is torn down with this one's: `CommShared::private`). `None` for a
    /// private channel itself.
    pub(crate) private: Option<Box<Communicator>>,
    /// Dropped early: its memory is freed after the streams that used it are done.
    scratch: OnceCell<DeviceBuffer<i32>>,
    /// The stream and buffers of the crate's exchanges, made at the first (exchange/kit.rs).
    pub(crate) kit: std::cell::RefCell<Option<crate::exchange::kit::Kit>>,
    /// Registered NCCL memory kept for reuse ([`buffer`](Self::buffer)).
    pub(crate) pool: Pool,
    shared: Arc<CommShared>,
    /// Not `Sync`, deliberately: NCCL allows one thread at a time per communicator.
    _not_sync: PhantomData<Cell<()>>,
}

static_assertions::assert_impl_all!(Communicator: Send, std::fmt::Debug);
static_assertions::assert_not_impl_any!(Communicator: Sync);

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.shared.rank)
            .field("size", &self.shared.size)
            .field("device", &self.shared.ctx.device().ordinal())
            .field("aborted", &self.shared.is_dead())
            .finish()
    }
}

impl Communicator {
    /// This rank.
    #[doc(alias = "ncclCommUserRank")]
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// Number of ranks.
    #[doc(alias = "ncclCommCount")]
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// The device the communicator runs on (`ncclCommCuDevice`; its ordinal is
    /// `device().ordinal()`), as for buffers and contexts.
    #[doc(alias = "ncclCommCuDevice")]
    pub fn device(&self) -> &Device {
        self.shared.ctx.device()
    }

    /// The context the communicator belongs to.
    pub fn context(&self) -> &Context {
        &self.shared.ctx
    }

    /// The NCCL library.
    pub fn nccl(&self) -> &Arc<Nccl> {
        &self.shared.nccl
    }

    /// The raw handle, for calls through the raw table. It is freed once
    /// [`is_aborted`](Self::is_aborted) says so.
    pub fn as_raw(&self) -> ncclComm_t {
        self.shared.raw
    }

    /// A shared owner of the NCCL communicator (for code that enqueues work on it through
    /// the raw table and must keep it alive, see [`cuda_hal::Stream::hold`]).
    #[must_use = "the communicator is held only while the KeepAlive lives"]
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new(self.shared.clone())
    }

    /// The handle if it is live (no abort performed).
    pub(crate) fn live_handle(&self) -> Option<ncclComm_t> {
        self.shared.live_raw()
    }

    /// The shared state (registrations and pooled buffers keep it).
    pub(crate) fn shared(&self) -> &Arc<CommShared> {
        &self.shared
    }

    /// Waits, within the deadline, for a non-blocking communicator's background work
    /// (`what` names it in errors); aborts on failure.
    pub(crate) fn wait_async(&self, what: &'static str) -> Result<()> {
        let r = self.shared.poll_self(what);
        if r.is_err() {
            self.abort_now();
        }
        r
    }

    /// The one state check: the live handle, after performing an abort requested through
    /// an [`AbortHandle`]; [`Error::Aborted`] once it is aborted or destroyed.
    pub(crate) fn handle(&self) -> Result<ncclComm_t> {
        if self.shared.grouped_elsewhere() {
            return Err(Error::GroupedElsewhere {
                what: "Communicator",
            });
        }
        if self.shared.abort.is_requested() {
            self.abort_now();
            return Err(Error::Aborted);
        }
        if self.shared.registry.has_deferred() {
            // Registrations whose last holder let go on another thread.
            release_deferred(self);
        }
        self.shared.live_raw().ok_or(Error::Aborted)
    }

    /// `Ok` when `ctx` is the communicator's context; else [`Error::WrongDevice`] naming
    /// the object's device, or, for another context on the same device (another
    /// `cuda_hal::Cuda` instance), [`Error::WrongContext`].
    pub(crate) fn same_context(
        &self,
        what: &'static str,
        object: &'static str,
        ctx: &Context,
    ) -> Result<()> {
        if ctx == self.context() {
            return Ok(());
        }
        let (expected, found) = (self.device().ordinal(), ctx.device().ordinal());
        if found == expected {
            return Err(Error::WrongContext {
                what,
                object,
                device: found,
            });
        }
        Err(Error::WrongDevice {
            what,
            object,
            expected,
            found,
        })
    }

    /// How many of the crate's own exchanges between the ranks were issued on this
    /// communicator's private channel: the number of the next one.
    pub(crate) fn exchanges_issued(&self) -> u64 {
        self.shared.exchanges.load(Ordering::Relaxed)
    }

    /// One more of the crate's own exchanges was issued.
    pub(crate) fn exchange_issued(&self) {
        self.shared.exchanges.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether its collectives are compared between the ranks before they are issued.
    #[inline]
    pub(crate) fn checks_calls(&self) -> bool {
        self.shared.checks_calls
    }

    /// Notes, before enqueueing work on `stream`, that it needs this communicator: kept
    /// alive by an open capture or group.
    #[inline]
    pub(crate) fn hold_for(&self, stream: &Stream) {
        self.shared.suspend.note(stream);
        stream.hold(|| held(&self.shared));
    }

    /// An error recorded by NCCL for this communicator's background work.
    #[doc(alias = "ncclCommGetAsyncError")]
    pub fn async_error(&self) -> Result<()> {
        let raw = self.handle()?;
        let mut e = ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid out-pointer.
        let (rc, call) = unsafe { nccl_raw_call!(self.nccl(), ncclCommGetAsyncError(raw, &mut e)) };
        self.check(rc, call)?;
        self.check(e, call)
    }

    #[inline]
    pub(crate) fn check(&self, rc: ncclResult_t, call: &'static str) -> Result<()> {
        if rc == ncclResult_t::ncclSuccess {
            return Ok(());
        }
        self.check_failed(rc, call)
    }

    /// [`check`](Self::check) of anything but success.
    #[cold]
    fn check_failed(&self, rc: ncclResult_t, call: &'static str) -> Result<()> {
        if rc == ncclResult_t::ncclInProgress && !self.shared.config.is_blocking() {
            let r = self.shared.poll_self(call);
            if r.is_err() {
                self.abort_now();
            }
            return r;
        }
        let r = check(&self.shared.nccl, rc, call, self.shared.live_raw());
        match rc {
            ncclResult_t::ncclSuccess
            | ncclResult_t::ncclInvalidArgument
            | ncclResult_t::ncclInvalidUsage => {}
            // The communicator cannot be trusted after these: abort it now, so that later
            // calls say so and nothing ever waits on a peer that may be gone.
            _ => {
                self.abort_now();
            }
        }
        r
    }

    /// Aborts in place (idempotent); the handle is freed and every later call fails.
    /// Inside an open group on this thread, whose deferred work still names the handle,
    /// the abort is requested and happens at the first call after the group, or when
    /// the last owner lets go.
    pub(crate) fn abort_now(&self) {
        self.shared.abort.abort();
        if !self.shared.in_group() {
            let _ = self.shared.teardown(Teardown::Abort);
        }
    }

    /// Whether an abort was asked for but could not happen yet (an open group still holds
    /// the communicator): work NCCL accepted may still be in progress.
    pub(crate) fn is_unsettled(&self) -> bool {
        self.shared.abort.is_requested() && !self.shared.is_dead()
    }

    /// Whether the communicator was aborted or destroyed (by [`abort`](Self::abort), a
    /// handle, a failed wait or a deadline).
    pub fn is_aborted(&self) -> bool {
        self.shared.is_dead()
    }

    /// The configuration it was created with.
    pub fn config(&self) -> &CommConfig {
        &self.shared.config
    }

    pub(crate) fn abort_flag(&self) -> &AbortHandle {
        &self.shared.abort
    }

    /// Takes `abort` as its abort flag (a private channel shares its parent's), while it
    /// is not shared yet.
    pub(crate) fn share_abort(&mut self, abort: AbortHandle) {
        if let Some(s) = Arc::get_mut(&mut self.shared) {
            s.abort = abort;
        }
    }

    /// A one-element scratch buffer (for barriers).
    pub(crate) fn scratch(&self) -> Result<&DeviceBuffer<i32>> {
        if let Some(b) = self.scratch.get() {
            return Ok(b);
        }
        let b = DeviceBuffer::<i32>::zeroed(self.context(), 1)?;
        Ok(self.scratch.get_or_init(|| b))
    }
}

// What registered memory does through the communicator, on its owner's thread.
impl CommOwner for Communicator {
    fn state(&self) -> Arc<dyn CommState> {
        self.shared.clone()
    }

    fn registry(&self) -> &Registry {
        &self.shared.registry
    }

    fn nccl(&self) -> &Nccl {
        &self.shared.nccl
    }

    fn context(&self) -> &Context {
        &self.shared.ctx
    }

    fn live_handle(&self) -> Option<ncclComm_t> {
        self.shared.live_raw()
    }

    fn is_aborted(&self) -> bool {
        self.shared.is_dead()
    }

    fn grouped_elsewhere(&self) -> bool {
        self.shared.grouped_elsewhere()
    }

    fn check(&self, rc: ncclResult_t, call: &'static str) -> Result<()> {
        Communicator::check(self, rc, call)
    }
}
