//! [`Communicator`]: one rank's NCCL communicator, bound to one device context.

use std::cell::{Cell, OnceCell};
use std::ffi::c_int;
use std::sync::Arc;

use cuda_hal::{Context, DeviceBuffer};
use nccl_sys::{NCCL_SPLIT_NOCOLOR, Nccl, ncclComm_t, ncclResult_t};

use crate::{Error, Result, UniqueId, check};

/// One rank of an NCCL communicator.
///
/// It belongs to one device's [`Context`]: streams and buffers passed to its collectives
/// must be of the same context, which is checked before every call. A communicator must
/// not be used by two threads at once (NCCL's rule), so it is `Send` but not `Sync`.
///
/// Dropping it finalises and destroys it; after a failed operation or [`abort`](Self::abort)
/// it is aborted instead, so a drop never waits on a dead peer.
pub struct Communicator {
    nccl: Arc<Nccl>,
    raw: ncclComm_t,
    ctx: Context,
    rank: usize,
    size: usize,
    failed: Cell<bool>,
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
        if size == 0 || rank >= size {
            return Err(Error::InvalidRank {
                what: "Communicator::init_rank",
                rank,
                size,
            });
        }
        let (n, r) = (to_c_int("size", size)?, to_c_int("rank", rank)?);
        let _g = ctx.bind()?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context of the device NCCL should use is current.
        let rc = unsafe { (nccl.fns().ncclCommInitRank)(&mut raw, n, id.to_raw(), r) };
        check(nccl, rc, "ncclCommInitRank", None)?;
        // SAFETY: `raw` was just created by NCCL on `ctx`'s device and is ours.
        unsafe { Self::from_raw(nccl, ctx, raw) }
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
        let r = check(&self.nccl, rc, call, Some(self.raw));
        if r.is_err() && rc != ncclResult_t::ncclInvalidArgument {
            self.failed.set(true);
        }
        r
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
        let _g = this.ctx.bind()?;
        let f = this.nccl.fns();
        // SAFETY: a live communicator, finalised then destroyed once (no Drop follows).
        let r = unsafe {
            let a = (f.ncclCommFinalize)(this.raw);
            let b = (f.ncclCommDestroy)(this.raw);
            check(&this.nccl, a, "ncclCommFinalize", None)
                .and_then(|_| check(&this.nccl, b, "ncclCommDestroy", None))
        };
        // SAFETY: drop the fields we still own, once.
        unsafe { this.drop_fields() };
        r
    }

    /// Aborts: stops pending work without waiting for peers, and frees the communicator.
    #[doc(alias = "ncclCommAbort")]
    pub fn abort(self) -> Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: a live communicator, aborted once (no Drop follows).
        let rc = unsafe { (this.nccl.fns().ncclCommAbort)(this.raw) };
        let r = check(&this.nccl, rc, "ncclCommAbort", None);
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
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let f = self.nccl.fns();
        // Device memory first (the scratch buffer), then the communicator.
        drop(self.scratch.take());
        let _g = self.ctx.bind();
        // SAFETY: a live communicator, released once; after a failure it is aborted, so
        // the drop never waits for peers that may be gone.
        unsafe {
            if self.failed.get() {
                (f.ncclCommAbort)(self.raw);
            } else {
                (f.ncclCommFinalize)(self.raw);
                (f.ncclCommDestroy)(self.raw);
            }
        }
    }
}
