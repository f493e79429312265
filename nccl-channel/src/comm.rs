//! [`Communicator`]: one rank's NCCL communicator, bound to one device context.
//!
//! The NCCL handle lives in a shared [`CommShared`], so that work which has not been
//! launched yet (an open group) or can be launched again (a captured graph) keeps it
//! alive, and a graph launch can check it was not aborted in the meantime.

use std::cell::{Cell, OnceCell};
use std::ffi::c_int;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::ThreadId;
use std::time::Instant;

use cuda_hal::{Context, Dependency, Device, DeviceBuffer, KeepAlive, Stream};
use nccl_sys::{Nccl, ncclComm_t, ncclResult_t};

use crate::backoff::Backoff;
use crate::config::CommConfig;
use crate::notice::{self, Deadline, Notice};
use crate::registered::pool::Pool;
use crate::registered::registry::{CommState, Registry};
use crate::registered::release::{CommOwner, release_deferred};
use crate::reliability::{AbortHandle, poll};
use crate::sync::lock;
use crate::{Error, Result, UniqueId, check};

/// The NCCL handle and its life: live until aborted or destroyed, exactly once, after
/// which the handle is never passed to NCCL again.
pub(crate) struct CommShared {
    nccl: Arc<Nccl>,
    raw: ncclComm_t,
    ctx: Context,
    rank: usize,
    size: usize,
    config: CommConfig,
    abort: AbortHandle,
    /// Set once the handle is freed (aborted or destroyed).
    dead: AtomicBool,
    /// Shared by graph launches, exclusive for the teardown.
    gate: RwLock<()>,
    /// Holds by open groups (work NCCL has not enqueued yet), and the thread whose group
    /// they are: until they are released, no other thread may use or tear down the handle.
    grouped: AtomicUsize,
    group_thread: Mutex<Option<ThreadId>>,
    /// Buffer registrations and windows, and releases waiting for the owner's thread.
    /// Dropped after the teardown: NCCL releases them with the communicator, and only
    /// then may their memory go.
    pub(crate) registry: Registry,
    /// Suspended or not, and what may still run on it (suspend/).
    pub(crate) suspend: crate::suspend::state::SuspendState,
    /// The crate's own exchanges between the ranks made on it so far (agreement.rs
    /// numbers each, so that one cannot pair with another).
    agreements: std::sync::atomic::AtomicU64,
    /// The checked mode is on (call_check.rs), and the checked calls made so far.
    checks_calls: bool,
    checked_calls: std::sync::atomic::AtomicU64,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time. Calls come from
// the thread that holds the owning `Communicator` (not `Sync`), except two: `settle`, on
// the thread whose group releases its holds, calls only `ncclCommGetAsyncError`, which NCCL
// allows from another thread during the owner's calls (it is how watchdog threads poll),
// and never frees the handle (on failure it asks the owner to abort); and the teardown,
// which may run where the last holder drops, runs once (`dead`) under `gate` taken
// exclusively, while graph launches hold `gate` shared and call no NCCL function. While a
// group holds the handle, the owner's calls from other threads are refused (`grouped`).
unsafe impl Send for CommShared {}
// SAFETY: as above; the rest is atomics, locks and immutable data.
unsafe impl Sync for CommShared {}

/// How a teardown releases the handle.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Teardown {
    /// `ncclCommAbort`: never waits for peers.
    Abort,
    /// `ncclCommFinalize` (bounded by the deadline when non-blocking) then `ncclCommDestroy`.
    Close,
}

impl CommShared {
    /// Whether the handle was freed (aborted or destroyed).
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Excludes graph launches (which hold the gate shared) while the state changes.
    pub(crate) fn exclusive(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an open group still holds the handle (on any thread).
    pub(crate) fn in_group(&self) -> bool {
        self.grouped.load(Ordering::Acquire) > 0
    }

    /// Whether an open group of another thread holds the handle.
    fn grouped_elsewhere(&self) -> bool {
        self.in_group()
            && lock(&self.group_thread).is_some_and(|t| t != std::thread::current().id())
    }

    /// The handle while it is live.
    fn live_raw(&self) -> Option<ncclComm_t> {
        (!self.is_dead()).then_some(self.raw)
    }

    /// Frees the handle, once; waits for graph launches in progress, and later launches
    /// see it dead.
    fn teardown(&self, how: Teardown) -> Result<()> {
        let _excl = self.gate.write().unwrap_or_else(|e| e.into_inner());
        if self.is_dead() {
            return Err(Error::Aborted);
        }
        let r = match how {
            Teardown::Abort => {
                // SAFETY: a live communicator, freed once (`dead` is set below, under the lock).
                unsafe { nccl_call!(self.nccl, ncclCommAbort(self.raw)) }
            }
            Teardown::Close => self.finalize_and_destroy(),
        };
        self.dead.store(true, Ordering::Release);
        r
    }

    /// Finalize (waiting for a non-blocking one within the deadline), then destroy; abort
    /// when the finalize fails.
    fn finalize_and_destroy(&self) -> Result<()> {
        let _g = self.ctx.bind()?;
        // SAFETY: a live communicator.
        let (rc, call) = unsafe { nccl_raw_call!(self.nccl, ncclCommFinalize(self.raw)) };
        let fin = if rc == ncclResult_t::ncclInProgress {
            self.poll_self(call)
        } else {
            check(&self.nccl, rc, call, Some(self.raw))
        };
        if let Err(e) = fin {
            // SAFETY: still live; freed once (the caller marks it dead).
            unsafe { (self.nccl.fns().ncclCommAbort)(self.raw) };
            return Err(e);
        }
        // SAFETY: finalised; destroyed once (the caller marks it dead).
        unsafe { nccl_call!(self.nccl, ncclCommDestroy(self.raw)) }
    }

    fn poll_self(&self, what: &'static str) -> Result<()> {
        let timeout = self.config.get_timeout();
        poll(
            &self.nccl,
            self.raw,
            what,
            crate::backoff::deadline_after(timeout),
            timeout,
            &self.abort,
            || self.describe(what),
        )
    }

    /// `what` of this rank, for a wait notice: "ncclAllReduce of rank 1 of 2 on device 1".
    fn describe(&self, what: &str) -> String {
        format!(
            "{what} of rank {} of {} on device {}",
            self.rank,
            self.size,
            self.ctx.device().ordinal()
        )
    }
}

// What registrations and pooled buffers hold of the communicator (from any thread).
impl CommState for CommShared {
    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn is_dead(&self) -> bool {
        CommShared::is_dead(self)
    }
}

impl Dependency for CommShared {
    fn gated(&self) -> bool {
        true
    }

    fn while_usable(
        &self,
        launch: &mut dyn FnMut() -> cuda_hal::Result<()>,
    ) -> cuda_hal::Result<()> {
        let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
        if self.suspend.is_suspended() {
            return Err(cuda_hal::Error::Unusable {
                what: format!(
                    "it uses the NCCL communicator of rank {} of {}, which is suspended",
                    self.rank, self.size
                ),
            });
        }
        if self.is_dead() {
            return Err(cuda_hal::Error::Unusable {
                what: format!(
                    "it uses the NCCL communicator of rank {} of {}, which was aborted or destroyed",
                    self.rank, self.size
                ),
            });
        }
        launch()
    }

    fn deferred(&self) {
        // The id and the count change together, under the lock, so a reader that sees the
        // count and then takes the lock sees the id of the group that holds the handle.
        let mut thread = lock(&self.group_thread);
        if self.grouped.load(Ordering::Acquire) == 0 {
            *thread = Some(std::thread::current().id());
        }
        self.grouped.fetch_add(1, Ordering::AcqRel);
    }

    /// Deferred (grouped) work of a non-blocking communicator is enqueued in the
    /// background after `ncclGroupEnd` returns: wait until it is, within the deadline,
    /// before what it uses is released. If that fails, ask for an abort (the owner makes
    /// it) and keep what the group holds alive. A group that ended in an error aborts the
    /// communicator at once: NCCL's work of it is over then. Then the group lets go of the
    /// handle.
    fn settle(&self) -> bool {
        // A group that ended in an error may have launched work without a peer's part,
        // still queued in NCCL, which could run, or pair with a later call, at any time:
        // the communicator is aborted here (the group is over), which ends that work.
        if crate::group::ended_in_error() && !self.is_dead() {
            self.abort.abort();
            let _ = self.teardown(Teardown::Abort);
        }
        let settled = self.config.is_blocking()
            || self.is_dead()
            || self.poll_self("the work of a group (ncclGroupEnd)").is_ok();
        if !settled {
            self.abort.abort();
        }
        // The thread id may stay behind: it is read only while `grouped` is above 0, and
        // the next first hold writes it again.
        self.grouped.fetch_sub(1, Ordering::AcqRel);
        settled
    }
}

impl Drop for CommShared {
    fn drop(&mut self) {
        if self.is_dead() {
            return;
        }
        // A blocking finalize could wait forever for a peer that is gone: a drop aborts
        // (`Communicator::close` finalises). A non-blocking one finalises within its
        // deadline, unless an abort was asked for (a failed call asks for one).
        let how = if self.config.is_blocking() || self.abort.is_requested() {
            Teardown::Abort
        } else {
            Teardown::Close
        };
        let _ = self.teardown(how);
    }
}

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
pub struct Communicator {
    /// Dropped first: its memory is freed after the streams that used it are done.
    scratch: OnceCell<DeviceBuffer<i32>>,
    /// The checked mode's stream and buffers, made at its first check (call_check.rs).
    pub(crate) checks: std::cell::RefCell<Option<crate::call_check::kit::CheckKit>>,
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

fn to_c_int(what: &'static str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::InvalidArgument {
        what,
        problem: format!("{v} does not fit NCCL's int"),
    })
}

/// An init, for a wait notice: "init of rank 1 of 2 on device 0 (ncclCommInitRank)".
pub(crate) fn init_of(rank: usize, size: usize, ctx: &Context, call: &str) -> String {
    let device = ctx.device().ordinal();
    format!("init of rank {rank} of {size} on device {device} ({call})")
}

/// Checks a size and rank for init and converts them to NCCL's ints.
pub(crate) fn world_args(what: &'static str, size: usize, rank: usize) -> Result<(c_int, c_int)> {
    if size == 0 || rank >= size {
        return Err(Error::InvalidRank { what, rank, size });
    }
    Ok((to_c_int("size", size)?, to_c_int("rank", rank)?))
}

impl Communicator {
    /// Joins the communicator `id` as `rank` of `size`, on `ctx`'s device (blocking until
    /// every rank has joined).
    ///
    /// Every rank passes the same id, which rank 0 made with [`UniqueId::generate`] and
    /// shared (as bytes, hex, a file or a [`Rendezvous`](crate::Rendezvous)). Each rank
    /// calls it from its own thread or process: the call returns once all have come.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{Communicator, UniqueId};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(3).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let id = UniqueId::generate(&nccl)?;
    /// let joined = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..3)
    ///         .map(|rank| {
    ///             let (cuda, nccl) = (&cuda, &nccl);
    ///             s.spawn(move || -> nccl_channel::Result<(usize, usize)> {
    ///                 let ctx = cuda.device(rank)?.primary_context()?;
    ///                 let comm = Communicator::init_rank(nccl, &ctx, &id, 3, rank)?;
    ///                 Ok((comm.rank(), comm.size()))
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(joined, [(0, 3), (1, 3), (2, 3)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommInitRank")]
    pub fn init_rank(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        id: &UniqueId,
        size: usize,
        rank: usize,
    ) -> Result<Communicator> {
        let (n, r) = world_args("Communicator::init_rank", size, rank)?;
        let _g = ctx.bind()?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // NCCL blocks in the call until every rank came: the watchdog says so if it lasts.
        let watch = notice::watch(Deadline::Blocking, || {
            init_of(rank, size, ctx, "ncclCommInitRank")
        });
        // SAFETY: valid out-pointer; the context of the device NCCL should use is current.
        let rc = unsafe { nccl_call!(nccl, ncclCommInitRank(&mut raw, n, id.to_raw(), r)) };
        drop(watch);
        rc?;
        // SAFETY: `raw` was just created by NCCL on `ctx`'s device and is ours.
        unsafe { Self::from_raw(nccl, ctx, raw) }
    }

    /// Joins with a [`CommConfig`]: through `ncclCommInitRankConfig` when it is
    /// non-blocking or sets any NCCL field (else `ncclCommInitRank`). A field newer than
    /// the loaded NCCL is [`Error::Unsupported`] and a value NCCL cannot take is
    /// [`Error::InvalidArgument`], both before anything is created. Non-blocking: waits
    /// for the other ranks at most the config's timeout, then aborts and returns
    /// [`Error::Timeout`] (a peer that never joins is an error, not a hang).
    ///
    /// Rank 1 never comes:
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use std::time::Duration;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{CommConfig, Communicator, Error, UniqueId};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let ctx = cuda.device(0)?.primary_context()?;
    /// let id = UniqueId::generate(&nccl)?;
    /// let config = CommConfig::non_blocking(Duration::from_millis(200));
    /// let e = Communicator::init_rank_with(&nccl, &ctx, &id, 2, 0, &config).unwrap_err();
    /// assert_eq!(
    ///     e,
    ///     Error::Timeout { what: "ncclCommInitRankConfig".into(), after: Duration::from_millis(200) }
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommInitRankConfig")]
    pub fn init_rank_with(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> Result<Communicator> {
        config.check_timeout()?;
        if config.is_blocking() && !config.sets_nccl_fields() {
            let c = Self::init_rank(nccl, ctx, id, size, rank)?;
            return Ok(c.with_config(config.clone()));
        }
        let (n, r) = world_args("Communicator::init_rank_with", size, rank)?;
        let f = nccl.fns().ncclCommInitRankConfig;
        init_via(
            nccl,
            ctx,
            (size, rank),
            config,
            "ncclCommInitRankConfig",
            // SAFETY: valid out-pointer and config (`init_via` keeps it alive until the
            // communicator is ready); the device's context is current there.
            |raw, cfg| unsafe { f(raw, n, id.to_raw(), r, cfg) },
        )
    }

    /// One communicator per context, all in this process (`ncclCommInitAll`); rank `i`
    /// uses `contexts[i]`. Drive them from one thread with [`crate::group`] (a collective
    /// of every rank in one group), and split or shrink them together with
    /// [`split_all`](Self::split_all) and [`shrink_all`](Self::shrink_all), which make
    /// their own group: [`split`](Self::split) of one rank would wait for the others.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::Communicator;
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(4).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// // Devices 3 and 1, in that order: rank i is on contexts[i]'s device.
    /// let ctxs = [cuda.device(3)?.primary_context()?, cuda.device(1)?.primary_context()?];
    /// let comms = Communicator::init_all(&nccl, &ctxs)?;
    /// let ranks: Vec<_> = comms.iter().map(|c| (c.rank(), c.size())).collect();
    /// assert_eq!(ranks, [(0, 2), (1, 2)]);
    /// assert!(comms[0].context() == &ctxs[0] && comms[1].context() == &ctxs[1]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommInitAll")]
    pub fn init_all(nccl: &Arc<Nccl>, contexts: &[Context]) -> Result<Vec<Communicator>> {
        if contexts.is_empty() {
            return Err(Error::InvalidArgument {
                what: "Communicator::init_all",
                problem: "no device given".into(),
            });
        }
        let n = to_c_int("devices", contexts.len())?;
        let devs: Vec<c_int> = contexts.iter().map(|c| c.device().ordinal()).collect();
        let mut raws: Vec<ncclComm_t> = vec![std::ptr::null_mut(); contexts.len()];
        // SAFETY: room for `n` handles and `n` device ordinals.
        unsafe { nccl_call!(nccl, ncclCommInitAll(raws.as_mut_ptr(), n, devs.as_ptr())) }?;
        let mut comms = Vec::with_capacity(raws.len());
        let mut raws = raws.into_iter();
        for ctx in contexts {
            let Some(raw) = raws.next() else { break };
            // SAFETY: NCCL created this handle for `ctx`'s device (checked in from_raw).
            match unsafe { Self::from_raw(nccl, ctx, raw) } {
                Ok(c) => comms.push(c),
                Err(e) => {
                    for rest in raws {
                        // SAFETY: the remaining handles are ours and destroyed once.
                        unsafe { (nccl.fns().ncclCommDestroy)(rest) };
                    }
                    return Err(e);
                }
            }
        }
        Ok(comms)
    }

    /// Takes ownership of a raw, blocking communicator of `ctx`'s device. Checks its
    /// device, reads its rank and size. On error the handle is destroyed.
    ///
    /// For a handle made through the raw table ([`nccl_sys`]) or handed over by other code:
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::Communicator;
    /// use nccl_sys::{ncclComm_t, ncclResult_t};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let ctx = cuda.device(0)?.primary_context()?;
    /// let mut raw: ncclComm_t = std::ptr::null_mut();
    /// let devices = [0];
    /// // SAFETY: room for one handle and one device ordinal.
    /// let rc = unsafe { (nccl.fns().ncclCommInitAll)(&mut raw, 1, devices.as_ptr()) };
    /// assert_eq!(rc, ncclResult_t::ncclSuccess);
    /// // SAFETY: a live, initialised communicator of device 0 (`ctx`'s), made by `nccl`;
    /// // nothing else owns it (`comm` destroys it).
    /// let comm = unsafe { Communicator::from_raw(&nccl, &ctx, raw) }?;
    /// assert_eq!((comm.rank(), comm.size()), (0, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// `raw` must be a live, initialised communicator made by `nccl`, owned by nobody else.
    pub unsafe fn from_raw(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        raw: ncclComm_t,
    ) -> Result<Communicator> {
        // SAFETY: the caller's contract.
        unsafe { Self::adopt(nccl, ctx, raw, CommConfig::default()) }
    }

    /// As [`from_raw`](Self::from_raw), with the configuration the handle was made with.
    ///
    /// # Safety
    /// As for `from_raw`.
    pub(crate) unsafe fn adopt(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        raw: ncclComm_t,
        config: CommConfig,
    ) -> Result<Communicator> {
        let mut shared = CommShared {
            nccl: nccl.clone(),
            raw,
            ctx: ctx.clone(),
            rank: 0,
            size: 0,
            config,
            abort: AbortHandle::default(),
            dead: AtomicBool::new(false),
            gate: RwLock::new(()),
            grouped: AtomicUsize::new(0),
            group_thread: Mutex::new(None),
            registry: Registry::default(),
            suspend: Default::default(),
            agreements: std::sync::atomic::AtomicU64::new(0),
            checks_calls: false,
            checked_calls: std::sync::atomic::AtomicU64::new(0),
        };
        let (mut rank, mut size, mut dev) = (0, 0, 0);
        // SAFETY: a live communicator and valid out-pointers. On error `shared` drops and
        // releases the handle.
        unsafe {
            nccl_call!(nccl, ncclCommUserRank(raw, &mut rank))?;
            nccl_call!(nccl, ncclCommCount(raw, &mut size))?;
            nccl_call!(nccl, ncclCommCuDevice(raw, &mut dev))?;
        }
        if dev != ctx.device().ordinal() {
            return Err(Error::WrongDevice {
                what: "Communicator::from_raw",
                object: "communicator",
                expected: ctx.device().ordinal(),
                found: dev,
            });
        }
        shared.checks_calls = match shared.config.get_check_calls() {
            Some(on) => on,
            None => crate::call_check::setting::from_env()?,
        };
        shared.rank = usize::try_from(rank).unwrap_or(0);
        shared.size = usize::try_from(size).unwrap_or(0);
        if shared.size == 0 || shared.rank >= shared.size {
            return Err(Error::InvalidRank {
                what: "Communicator::from_raw",
                rank: shared.rank,
                size: shared.size,
            });
        }
        Ok(Communicator {
            shared: Arc::new(shared),
            scratch: OnceCell::new(),
            checks: Default::default(),
            pool: Pool::default(),
            _not_sync: PhantomData,
        })
    }

    pub(crate) fn with_config(self, config: CommConfig) -> Communicator {
        match Arc::try_unwrap(self.shared) {
            Ok(mut s) => {
                s.checks_calls = config.get_check_calls().unwrap_or(s.checks_calls);
                s.config = config;
                Communicator {
                    shared: Arc::new(s),
                    scratch: self.scratch,
                    checks: self.checks,
                    pool: self.pool,
                    _not_sync: PhantomData,
                }
            }
            Err(shared) => Communicator {
                shared,
                scratch: self.scratch,
                checks: self.checks,
                pool: self.pool,
                _not_sync: PhantomData,
            },
        }
    }

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
    /// communicator: the number of the next one.
    pub(crate) fn agreements_issued(&self) -> u64 {
        self.shared.agreements.load(Ordering::Relaxed)
    }

    /// Whether its collectives are compared between the ranks before they are issued.
    #[inline]
    pub(crate) fn checks_calls(&self) -> bool {
        self.shared.checks_calls
    }

    /// How many checked calls were issued on this communicator: the number of the next.
    pub(crate) fn checked_calls(&self) -> u64 {
        self.shared.checked_calls.load(Ordering::Relaxed)
    }

    /// One more checked call's exchange was issued.
    pub(crate) fn checked_call_issued(&self) {
        self.shared.checked_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// One more of the crate's own exchanges was issued on this communicator.
    pub(crate) fn agreement_issued(&self) {
        self.shared.agreements.fetch_add(1, Ordering::Relaxed);
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

    /// A one-element scratch buffer (for barriers).
    pub(crate) fn scratch(&self) -> Result<&DeviceBuffer<i32>> {
        if let Some(b) = self.scratch.get() {
            return Ok(b);
        }
        let b = DeviceBuffer::<i32>::zeroed(self.context(), 1)?;
        Ok(self.scratch.get_or_init(|| b))
    }

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
        drop(self.checks.into_inner());
        self.shared.teardown(how)
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

// Deadlines and aborts, on the machinery of reliability.rs.
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
        let timeout = self.config().get_timeout();
        let deadline = crate::backoff::deadline_after(timeout);
        let mut backoff = Backoff::poll();
        let mut notice = Notice::new(Instant::now(), Deadline::Config(timeout), || {
            self.shared.describe("the stream work (Communicator::wait)")
        });
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

/// What a capture or group holds of a communicator for work it recorded: the communicator,
/// counted, so that a suspend can see that work may still run.
struct Held {
    shared: Arc<CommShared>,
    _count: Arc<()>,
}

impl Dependency for Held {
    fn gated(&self) -> bool {
        self.shared.gated()
    }
    fn while_usable(
        &self,
        launch: &mut dyn FnMut() -> cuda_hal::Result<()>,
    ) -> cuda_hal::Result<()> {
        self.shared.while_usable(launch)
    }
    fn used_on(&self, stream: &Stream) -> cuda_hal::Result<()> {
        // A graph's launch runs the communicator's work on `stream`: a suspend must see
        // it (the graph may be dropped before the launch is done).
        self.shared.suspend.note(stream);
        self.shared.used_on(stream)
    }
    fn launched(&self, stream: &Stream) {
        self.shared.launched(stream);
    }
    fn deferred(&self) {
        self.shared.deferred();
    }
    fn settle(&self) -> bool {
        self.shared.settle()
    }
}

/// A counted hold of `shared` for a capture or group.
fn held(shared: &Arc<CommShared>) -> KeepAlive {
    KeepAlive::new(Arc::new(Held {
        shared: shared.clone(),
        _count: shared.suspend.holds.clone(),
    }))
}

/// Creates one rank's communicator through `issue(newcomm, config)` (an NCCL init taking
/// a config), then waits for it as [`Communicator::init_rank_with`] does: a blocking
/// config blocks in the call (watched), a non-blocking one is polled within its
/// deadline and aborted when the wait fails.
pub(crate) fn init_via(
    nccl: &Arc<Nccl>,
    ctx: &Context,
    (size, rank): (usize, usize),
    config: &CommConfig,
    call: &'static str,
    issue: impl FnOnce(*mut ncclComm_t, *mut nccl_sys::ncclConfig_t) -> ncclResult_t,
) -> Result<Communicator> {
    // Checked and lowered before anything is created; it (and the names it points to)
    // lives until the communicator is ready, past NCCL's reading of it.
    let mut cfg = config.to_raw(nccl.version())?;
    let _g = ctx.bind()?;
    let mut raw: ncclComm_t = std::ptr::null_mut();
    let watch = config
        .is_blocking()
        .then(|| notice::watch(Deadline::Blocking, || init_of(rank, size, ctx, call)));
    let rc = issue(&mut raw, cfg.as_mut_ptr());
    drop(watch);
    if rc != ncclResult_t::ncclInProgress
        && let Err(e) = check(nccl, rc, call, None)
    {
        if !raw.is_null() {
            // NCCL handed out a communicator that failed (a grow writes it early):
            // nobody will own it.
            // SAFETY: NCCL made `raw` for us; aborting frees it, once.
            unsafe { (nccl.fns().ncclCommAbort)(raw) };
        }
        return Err(e);
    }
    if !config.is_blocking() || rc == ncclResult_t::ncclInProgress {
        let abort = AbortHandle::default();
        let timeout = config.get_timeout();
        if let Err(e) = poll(
            nccl,
            raw,
            call,
            crate::backoff::deadline_after(timeout),
            timeout,
            &abort,
            || init_of(rank, size, ctx, call),
        ) {
            // SAFETY: NCCL made `raw`; aborting frees it, once.
            unsafe { (nccl.fns().ncclCommAbort)(raw) };
            return Err(e);
        }
    }
    // SAFETY: initialised by NCCL for `ctx`'s device; owned here.
    let c = unsafe { Communicator::from_raw(nccl, ctx, raw) }?;
    drop(cfg);
    Ok(c.with_config(config.clone()))
}
