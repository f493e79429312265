//! [`Communicator`]: one rank's NCCL communicator, bound to one device context.

use std::cell::{Cell, OnceCell};
use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_hal::{Context, DeviceBuffer};
use nccl_sys::{NCCL_SPLIT_NOCOLOR, Nccl, ncclComm_t, ncclResult_t};

use crate::reliability::{AbortHandle, CommConfig, poll};
use crate::{Error, Result, UniqueId, check};

/// One rank of an NCCL communicator.
///
/// It belongs to one device's [`Context`]: streams and buffers passed to its collectives
/// must be of the same context, which is checked before every call. A communicator must
/// not be used by two threads at once (NCCL's rule), so it is `Send` but not `Sync`.
///
/// Dropping it finalises and destroys it. An operation that fails with a system, remote,
/// internal, CUDA or timeout error aborts it at once (later calls return
/// [`Error::Aborted`]), so neither a call nor a drop ever waits on a dead peer.
pub struct Communicator {
    nccl: Arc<Nccl>,
    raw: ncclComm_t,
    ctx: Context,
    rank: usize,
    size: usize,
    failed: Cell<bool>,
    aborted: Cell<bool>,
    config: CommConfig,
    abort: AbortHandle,
    scratch: OnceCell<DeviceBuffer<i32>>,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time; `Communicator`
// is not `Sync`, so shared use across threads is impossible.
unsafe impl Send for Communicator {}

static_assertions::assert_impl_all!(Communicator: Send);
static_assertions::assert_not_impl_any!(Communicator: Sync);

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.ctx.device().ordinal())
            .finish()
    }
}

fn to_c_int(what: &'static str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::InvalidArgument {
        what,
        problem: format!("{v} does not fit NCCL's int"),
    })
}

/// Checks a size and rank for init and converts them to NCCL's ints.
fn world_args(what: &'static str, size: usize, rank: usize) -> Result<(c_int, c_int)> {
    if size == 0 || rank >= size {
        return Err(Error::InvalidRank { what, rank, size });
    }
    Ok((to_c_int("size", size)?, to_c_int("rank", rank)?))
}

impl Communicator {
    /// Joins the communicator `id` as `rank` of `size`, on `ctx`'s device (blocking until
    /// every rank has joined).
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
        // SAFETY: valid out-pointer; the context of the device NCCL should use is current.
        let rc = unsafe { (nccl.fns().ncclCommInitRank)(&mut raw, n, id.to_raw(), r) };
        check(nccl, rc, "ncclCommInitRank", None)?;
        // SAFETY: `raw` was just created by NCCL on `ctx`'s device and is ours.
        unsafe { Self::from_raw(nccl, ctx, raw) }
    }

    /// Joins with a [`CommConfig`] (`ncclCommInitRankConfig`). Non-blocking: waits for
    /// the other ranks at most `config.timeout`, then aborts and returns
    /// [`Error::Timeout`] (a peer that never joins is an error, not a hang).
    #[doc(alias = "ncclCommInitRankConfig")]
    pub fn init_rank_with(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> Result<Communicator> {
        if config.blocking {
            let mut c = Self::init_rank(nccl, ctx, id, size, rank)?;
            c.config = *config;
            return Ok(c);
        }
        let (n, r) = world_args("Communicator::init_rank_with", size, rank)?;
        let mut cfg = nccl_sys::NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        // Fields newer than the loaded library are ignored by it; say which layout we mean.
        cfg.version = cfg.version.min(nccl.version().0 as u32);
        let _g = ctx.bind()?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer and config; the device's context is current.
        let rc =
            unsafe { (nccl.fns().ncclCommInitRankConfig)(&mut raw, n, id.to_raw(), r, &mut cfg) };
        if rc != ncclResult_t::ncclInProgress {
            check(nccl, rc, "ncclCommInitRankConfig", None)?;
        }
        let abort = AbortHandle::default();
        let deadline = Instant::now() + config.timeout;
        if let Err(e) = poll(
            nccl,
            raw,
            "ncclCommInitRankConfig",
            deadline,
            config.timeout,
            &abort,
        ) {
            // SAFETY: NCCL made `raw`; aborting frees it, once.
            unsafe { (nccl.fns().ncclCommAbort)(raw) };
            return Err(e);
        }
        // SAFETY: initialised by NCCL for `ctx`'s device; owned here.
        let mut c = unsafe { Self::from_raw(nccl, ctx, raw) }?;
        c.config = *config;
        Ok(c)
    }

    /// One communicator per context, all in this process (`ncclCommInitAll`); rank `i`
    /// uses `contexts[i]`. Drive them from one thread with [`crate::group`].
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
        let rc = unsafe { (nccl.fns().ncclCommInitAll)(raws.as_mut_ptr(), n, devs.as_ptr()) };
        check(nccl, rc, "ncclCommInitAll", None)?;
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

    /// Takes ownership of a raw communicator of `ctx`'s device. Checks its device, reads
    /// its rank and size.
    ///
    /// # Safety
    /// `raw` must be a live communicator made by `nccl`, owned by nobody else.
    pub unsafe fn from_raw(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        raw: ncclComm_t,
    ) -> Result<Communicator> {
        let mut comm = Communicator {
            nccl: nccl.clone(),
            raw,
            ctx: ctx.clone(),
            rank: 0,
            size: 0,
            failed: Cell::new(false),
            aborted: Cell::new(false),
            config: CommConfig::default(),
            abort: AbortHandle::default(),
            scratch: OnceCell::new(),
        };
        let (mut rank, mut size, mut dev) = (0, 0, 0);
        let f = nccl.fns();
        // SAFETY: a live communicator and valid out-pointers.
        unsafe {
            check(
                nccl,
                (f.ncclCommUserRank)(raw, &mut rank),
                "ncclCommUserRank",
                Some(raw),
            )?;
            check(
                nccl,
                (f.ncclCommCount)(raw, &mut size),
                "ncclCommCount",
                Some(raw),
            )?;
            check(
                nccl,
                (f.ncclCommCuDevice)(raw, &mut dev),
                "ncclCommCuDevice",
                Some(raw),
            )?;
        }
        if dev != ctx.device().ordinal() {
            return Err(Error::WrongDevice {
                what: "Communicator::from_raw",
                object: "communicator",
                expected: ctx.device().ordinal(),
                found: dev,
            });
        }
        comm.rank = usize::try_from(rank).unwrap_or(0);
        comm.size = usize::try_from(size).unwrap_or(0);
        Ok(comm)
    }

    /// Splits into sub-communicators: ranks with the same `color` form one, ordered by
    /// `key` then by rank; `None` opts out (returns `Ok(None)`). Collective over all ranks.
    #[doc(alias = "ncclCommSplit")]
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        let color = match color {
            Some(c) => to_c_int("color", c as usize)?,
            None => NCCL_SPLIT_NOCOLOR,
        };
        let _g = self.ctx.bind()?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: a live communicator; valid out-pointer; NULL config inherits ours.
        let rc = unsafe {
            (self.nccl.fns().ncclCommSplit)(self.raw, color, key, &mut raw, std::ptr::null_mut())
        };
        self.check(rc, "ncclCommSplit")?;
        if raw.is_null() {
            return Ok(None);
        }
        // SAFETY: NCCL made `raw` on our device for us.
        unsafe { Self::from_raw(&self.nccl, &self.ctx, raw) }.map(Some)
    }

    /// This rank.
    #[doc(alias = "ncclCommUserRank")]
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    #[doc(alias = "ncclCommCount")]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device ordinal (`ncclCommCuDevice`).
    #[doc(alias = "ncclCommCuDevice")]
    pub fn device(&self) -> i32 {
        self.ctx.device().ordinal()
    }

    /// The context the communicator belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The NCCL library.
    pub fn nccl(&self) -> &Arc<Nccl> {
        &self.nccl
    }

    /// The raw handle.
    pub fn as_raw(&self) -> ncclComm_t {
        self.raw
    }

    /// An error recorded by NCCL for this communicator's background work.
    #[doc(alias = "ncclCommGetAsyncError")]
    pub fn async_error(&self) -> Result<()> {
        let mut e = ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid out-pointer.
        let rc = unsafe { (self.nccl.fns().ncclCommGetAsyncError)(self.raw, &mut e) };
        self.check(rc, "ncclCommGetAsyncError")?;
        self.check(e, "ncclCommGetAsyncError")
    }

    pub(crate) fn check(&self, rc: ncclResult_t, call: &'static str) -> Result<()> {
        if rc == ncclResult_t::ncclInProgress && !self.config.blocking {
            let deadline = Instant::now() + self.config.timeout;
            let r = poll(
                &self.nccl,
                self.raw,
                call,
                deadline,
                self.config.timeout,
                &self.abort,
            );
            if r.is_err() {
                self.abort_now();
            }
            return r;
        }
        let r = check(&self.nccl, rc, call, Some(self.raw));
        match rc {
            ncclResult_t::ncclSuccess
            | ncclResult_t::ncclInvalidArgument
            | ncclResult_t::ncclInvalidUsage => {}
            // The communicator cannot be trusted after these: abort it now, so that later
            // calls say so and nothing ever waits on a peer that may be gone.
            _ => {
                self.failed.set(true);
                self.abort_now();
            }
        }
        r
    }

    /// `Err(Aborted)` once aborted; performs an abort requested through a handle.
    pub(crate) fn ensure_live(&self) -> Result<()> {
        if !self.aborted.get() && self.abort.is_requested() {
            self.abort_now();
        }
        if self.aborted.get() {
            return Err(Error::Aborted);
        }
        Ok(())
    }

    /// Aborts in place (idempotent); the handle is freed and every later call fails.
    pub(crate) fn abort_now(&self) {
        if !self.aborted.replace(true) {
            // SAFETY: a live communicator, aborted (and so freed) once.
            unsafe { (self.nccl.fns().ncclCommAbort)(self.raw) };
        }
    }

    /// Whether the communicator was aborted (by [`abort`](Self::abort), a handle, a
    /// failed wait or a deadline).
    pub fn is_aborted(&self) -> bool {
        self.aborted.get()
    }

    /// The configuration it was created with.
    pub fn config(&self) -> &CommConfig {
        &self.config
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.config.timeout
    }

    pub(crate) fn abort_flag(&self) -> &AbortHandle {
        &self.abort
    }

    /// A one-element scratch buffer (for barriers).
    pub(crate) fn scratch(&self) -> Result<&DeviceBuffer<i32>> {
        if let Some(b) = self.scratch.get() {
            return Ok(b);
        }
        let b = DeviceBuffer::<i32>::zeroed(&self.ctx, 1)?;
        Ok(self.scratch.get_or_init(|| b))
    }

    /// Finalises (flushing pending work) and destroys, reporting errors that a drop
    /// would swallow.
    #[doc(alias = "ncclCommFinalize")]
    #[doc(alias = "ncclCommDestroy")]
    pub fn close(self) -> Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        let r = this.finalize_and_destroy();
        // SAFETY: drop the fields we still own, once.
        unsafe { this.drop_fields() };
        r
    }

    /// Finalize (waiting for a non-blocking one within the deadline), then destroy; an
    /// aborted communicator has nothing left to release.
    fn finalize_and_destroy(&self) -> Result<()> {
        if self.aborted.get() {
            return Err(Error::Aborted);
        }
        let _g = self.ctx.bind()?;
        let f = self.nccl.fns();
        // SAFETY: a live communicator.
        let rc = unsafe { (f.ncclCommFinalize)(self.raw) };
        let fin = if rc == ncclResult_t::ncclInProgress {
            let deadline = Instant::now() + self.config.timeout;
            poll(
                &self.nccl,
                self.raw,
                "ncclCommFinalize",
                deadline,
                self.config.timeout,
                &self.abort,
            )
        } else {
            check(&self.nccl, rc, "ncclCommFinalize", None)
        };
        if let Err(e) = fin {
            self.abort_now();
            return Err(e);
        }
        // SAFETY: finalised; destroyed once.
        let rc = unsafe { (f.ncclCommDestroy)(self.raw) };
        self.aborted.set(true);
        check(&self.nccl, rc, "ncclCommDestroy", None)
    }

    /// Aborts: stops pending work without waiting for peers, and frees the communicator.
    #[doc(alias = "ncclCommAbort")]
    pub fn abort(self) -> Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        let r = if this.aborted.replace(true) {
            Ok(())
        } else {
            // SAFETY: a live communicator, aborted once (no Drop follows).
            let rc = unsafe { (this.nccl.fns().ncclCommAbort)(this.raw) };
            check(&this.nccl, rc, "ncclCommAbort", None)
        };
        // SAFETY: drop the fields we still own, once.
        unsafe { this.drop_fields() };
        r
    }

    /// # Safety
    /// Called once, on a value that will not be dropped normally.
    unsafe fn drop_fields(&self) {
        // SAFETY: each field is read out and dropped exactly once (the caller's contract).
        unsafe {
            drop(std::ptr::read(&self.scratch));
            drop(std::ptr::read(&self.ctx));
            drop(std::ptr::read(&self.nccl));
            drop(std::ptr::read(&self.abort));
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Device memory first (the scratch buffer), then the communicator.
        drop(self.scratch.take());
        if self.aborted.get() {
            return;
        }
        if self.failed.get() {
            // After a failure, never wait for peers that may be gone.
            self.abort_now();
            return;
        }
        let _ = self.finalize_and_destroy();
    }
}
