//! Groups: several NCCL calls launched as one (`ncclGroupStart`/`ncclGroupEnd`).

use nccl_sys::Nccl;

use crate::{Result, check};

/// An open NCCL group. [`end`](Self::end) closes it and reports its error; dropping it
/// closes it too, so a failing operation inside never leaves the group open.
#[must_use = "a group launches its operations when it ends"]
pub struct Group<'a> {
    nccl: &'a Nccl,
    open: bool,
}

impl<'a> Group<'a> {
    /// `ncclGroupStart`.
    #[doc(alias = "ncclGroupStart")]
    pub fn start(nccl: &'a Nccl) -> Result<Group<'a>> {
        // SAFETY: no preconditions.
        let rc = unsafe { (nccl.fns().ncclGroupStart)() };
        check(nccl, rc, "ncclGroupStart", None)?;
        Ok(Group { nccl, open: true })
    }

    /// `ncclGroupEnd`: launches the group's operations. With non-blocking
    /// communicators NCCL may answer "in progress": that is success here, and
    /// [`Communicator::wait`](crate::Communicator::wait) waits for the work.
    #[doc(alias = "ncclGroupEnd")]
    pub fn end(mut self) -> Result<()> {
        self.open = false;
        // SAFETY: ends the group this value started.
        let rc = unsafe { (self.nccl.fns().ncclGroupEnd)() };
        if rc == nccl_sys::ncclResult_t::ncclInProgress {
            return Ok(());
        }
        check(self.nccl, rc, "ncclGroupEnd", None)
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
