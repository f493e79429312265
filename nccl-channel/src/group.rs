//! Groups: several NCCL calls launched as one (`ncclGroupStart`/`ncclGroupEnd`).
//!
//! A call made inside a group only records its work; NCCL enqueues it at the group's end.
//! So a group is a [`DeferScope`]: the buffers, streams and communicators of its calls are
//! kept alive until then, even when their owners are dropped inside the group. NCCL's
//! group state belongs to the thread, so [`Group`] is not `Send`.

use cuda_hal::DeferScope;
use nccl_sys::Nccl;

use crate::{Result, check};

/// An open NCCL group. [`end`](Self::end) closes it and reports its error; dropping it
/// closes it too, so a failing operation inside never leaves the group open.
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
    #[doc(alias = "ncclGroupStart")]
    pub fn start(nccl: &'a Nccl) -> Result<Group<'a>> {
        // SAFETY: no preconditions.
        unsafe { nccl_call!(nccl, ncclGroupStart()) }?;
        Ok(Group {
            nccl,
            open: true,
            _scope: DeferScope::open(),
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
        if rc == nccl_sys::ncclResult_t::ncclInProgress {
            return Ok(());
        }
        check(self.nccl, rc, call, None)
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        if self.open {
            // SAFETY: ends the group this value started; the error has nowhere to go.
            let _ = unsafe { (self.nccl.fns().ncclGroupEnd)() };
        }
    }
}

/// Runs `f` inside a group. The group always ends; `f`'s error wins over the group's.
pub fn group<R>(nccl: &Nccl, f: impl FnOnce() -> Result<R>) -> Result<R> {
    let g = Group::start(nccl)?;
    let r = f();
    let e = g.end();
    let v = r?;
    e?;
    Ok(v)
}
