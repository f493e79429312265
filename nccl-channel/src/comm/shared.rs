//! The NCCL handle and its life ([`CommShared`]): shared by the communicator and by the
//! work that may still use the handle (an open group, a captured graph), torn down
//! exactly once, and never passed to NCCL after.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::ThreadId;

use cuda_hal::{Context, Dependency, KeepAlive, Stream};
use nccl_sys::{Nccl, ncclComm_t, ncclResult_t};

use crate::config::CommConfig;
use crate::registered::registry::{CommState, Registry};
use crate::reliability::{AbortHandle, poll};
use crate::sync::lock;
use crate::{Error, Result, check};

/// The NCCL handle and its life: live until aborted or destroyed, exactly once, after
/// which the handle is never passed to NCCL again.
pub(crate) struct CommShared {
    pub(super) nccl: Arc<Nccl>,
    pub(super) raw: ncclComm_t,
    pub(super) ctx: Context,
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) config: CommConfig,
    pub(super) abort: AbortHandle,
    /// Set once the handle is freed (aborted or destroyed).
    pub(super) dead: AtomicBool,
    /// Shared by graph launches, exclusive for the teardown.
    pub(super) gate: RwLock<()>,
    /// Holds by open groups (work NCCL has not enqueued yet), and the thread whose group
    /// they are: until they are released, no other thread may use or tear down the handle.
    pub(super) grouped: AtomicUsize,
    pub(super) group_thread: Mutex<Option<ThreadId>>,
    /// Buffer registrations and windows, and releases waiting for the owner's thread.
    /// Dropped after the teardown: NCCL releases them with the communicator, and only
    /// then may their memory go.
    pub(crate) registry: Registry,
    /// Suspended or not, and what may still run on it (suspend/).
    pub(crate) suspend: crate::suspend::state::SuspendState,
    /// The crate's own exchanges between the ranks made on its private channel so far
    /// (exchange/ numbers each).
    pub(super) exchanges: std::sync::atomic::AtomicU64,
    /// The checked mode is on (call_check/).
    pub(super) checks_calls: bool,
    /// The private channel's handle (comm/private.rs): torn down with this one, first, and
    /// kept as long as this one is (an open group or a graph may hold it past the
    /// communicator's drop).
    pub(super) private: std::sync::OnceLock<Arc<CommShared>>,
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
pub(super) enum Teardown {
    /// `ncclCommAbort`: never waits for peers.
    Abort,
    /// `ncclCommFinalize` (bounded by the deadline when non-blocking) then `ncclCommDestroy`.
    Close,
}

impl CommShared {
    /// Whether the handle was freed (aborted or destroyed).
    pub(super) fn is_dead(&self) -> bool {
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
    pub(super) fn grouped_elsewhere(&self) -> bool {
        self.in_group()
            && lock(&self.group_thread).is_some_and(|t| t != std::thread::current().id())
    }

    /// The handle while it is live.
    pub(super) fn live_raw(&self) -> Option<ncclComm_t> {
        (!self.is_dead()).then_some(self.raw)
    }

    /// Frees the handle, once; waits for graph launches in progress, and later launches
    /// see it dead.
    pub(super) fn teardown(&self, how: Teardown) -> Result<()> {
        let private = self.private.get().map(|p| p.teardown(how));
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
        match private {
            // Already gone with a failed exchange: this one's result tells.
            None | Some(Ok(()) | Err(Error::Aborted)) => r,
            Some(Err(e)) => r.and(Err(e)),
        }
    }

    /// Finalize (waiting for a non-blocking one within the deadline), then destroy; abort
    /// when the finalize fails.
    pub(super) fn finalize_and_destroy(&self) -> Result<()> {
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

    pub(super) fn poll_self(&self, what: &'static str) -> Result<()> {
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
    pub(super) fn describe(&self, what: &str) -> String {
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
pub(super) fn held(shared: &Arc<CommShared>) -> KeepAlive {
    KeepAlive::new(Arc::new(Held {
        shared: shared.clone(),
        _count: shared.suspend.holds.clone(),
    }))
}
