//! The owner's side of registered memory: adopting a registration NCCL made, and
//! releasing registrations through NCCL, on the communicator's own thread (the only one
//! that may call NCCL with it). The communicator comes in as a [`CommOwner`].

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cuda_hal::{Context, KeepAlive, StreamLog};
use nccl_sys::{Nccl, ncclComm_t, ncclResult_t};

use super::registry::{CommState, Kind, Pending, RegShared, Registry, pages};
use crate::sync::lock;
use crate::{Error, Result};

/// What registered memory needs of its communicator on the owner's thread, where it
/// registers and releases. Implemented by the communicator, which is not `Sync`: holding
/// `&self` means being on that thread.
pub(crate) trait CommOwner {
    /// The shared state that registrations hold ([`RegShared`] keeps it alive).
    fn state(&self) -> Arc<dyn CommState>;

    /// The communicator's registry.
    fn registry(&self) -> &Registry;

    /// The NCCL library.
    fn nccl(&self) -> &Nccl;

    /// The context the communicator belongs to.
    fn context(&self) -> &Context;

    /// The handle if it is live (no abort performed).
    fn live_handle(&self) -> Option<ncclComm_t>;

    /// Whether the communicator was aborted or destroyed.
    fn is_aborted(&self) -> bool;

    /// Whether an open group of another thread holds the handle: no call may use it here.
    fn grouped_elsewhere(&self) -> bool;

    /// Checks the status of an NCCL call made with the handle, as every call does (a
    /// failure NCCL cannot recover from aborts the communicator).
    fn check(&self, rc: ncclResult_t, call: &'static str) -> Result<()>;
}

/// Takes over a registration NCCL made (`handle`, of `kind`) of `bytes` at `start`, whose
/// memory `memory` keeps allocated, and enters it in the registry.
pub(crate) fn adopt<C: CommOwner + ?Sized>(
    comm: &C,
    kind: Kind,
    handle: usize,
    start: u64,
    bytes: usize,
    memory: KeepAlive,
    symmetric: bool,
) -> Arc<RegShared> {
    let place = if kind == Kind::Window && handle != 0 {
        comm.registry().next_window()
    } else {
        0
    };
    let shared = Arc::new(RegShared {
        comm: comm.state(),
        start,
        bytes,
        symmetric,
        place,
        pending: Mutex::new(Some(Pending {
            kind,
            handle,
            memory: vec![memory],
            uses: StreamLog::new(),
        })),
    });
    let nccl_shared = (kind == Kind::Local && handle != 0).then_some(handle);
    let same = comm.registry().add(&shared, nccl_shared);
    // NCCL keeps the first registration's memory registered until the last one it
    // handed out is released: so must its memory stay.
    let held: Vec<KeepAlive> = same
        .iter()
        .flat_map(|r| match &*lock(&r.pending) {
            Some(p) => p.memory.clone(),
            None => Vec::new(),
        })
        .collect();
    if let Some(p) = &mut *lock(&shared.pending) {
        p.memory.extend(held);
    }
    drop(same);
    shared
}

/// Releases a registration now when nothing but its handle holds it: after the work
/// that used it, through NCCL (unless the communicator is gone, which released it).
pub(crate) fn release_registration<C: CommOwner + ?Sized>(
    comm: &C,
    shared: Arc<RegShared>,
) -> Result<()> {
    if Arc::strong_count(&shared) > 1 {
        // A graph or an open group holds it: released when they let go. Until then
        // NCCL still resolves it for any collective on its memory, so it stays in the
        // registry (its drop removes it) and later work is noted on it too.
        return Ok(());
    }
    // Nobody else holds it: its drop, at the end, takes it out of the registry (no
    // collective of this communicator can run meanwhile: this is its thread).
    let Some(p) = lock(&shared.pending).take() else {
        return Ok(());
    };
    release_pending(comm, p).map_err(|(e, back)| {
        if let Some(p) = back {
            // Not released yet: the communicator tries again later (or goes first).
            let range = comm.registry().range_of(&*shared);
            let range = range.unwrap_or_else(|| pages(shared.start, shared.bytes));
            comm.registry().defer(p, range);
        }
        e
    })
}

/// Releases the registrations whose last holder let go on another thread (their release
/// calls NCCL, which only the owner's thread may do). Not inside an open group.
#[cold]
pub(crate) fn release_deferred<C: CommOwner + ?Sized>(comm: &C) {
    if cuda_hal::DeferScope::is_open() {
        return;
    }
    for q in comm.registry().take_deferred() {
        let Some(p) = q.take() else { continue };
        if let Err((_, Some(p))) = release_pending(comm, p) {
            q.put_back(p);
            comm.registry().requeue(q);
        }
    }
}

/// Releases one registration on the owner's thread. On failure: the error, and the
/// registration back when trying again later makes sense (`None`: NCCL refused the
/// release, so it keeps the memory, which is leaked, unless the communicator was
/// aborted for it, which released the registration).
#[allow(clippy::result_large_err)] // cold path; the pending release must come back
fn release_pending<C: CommOwner + ?Sized>(
    comm: &C,
    p: Pending,
) -> std::result::Result<(), (Error, Option<Pending>)> {
    if comm.is_aborted() {
        // NCCL released it with the communicator; the memory may go.
        return Ok(());
    }
    if comm.grouped_elsewhere() {
        // Another thread's open group holds the handle (NCCL allows one thread at a
        // time): released by the owner's first call after that group.
        let e = Error::GroupedElsewhere {
            what: "Communicator",
        };
        return Err((e, Some(p)));
    }
    if let Err(e) = p.uses.synchronize() {
        return Err((e.into(), Some(p)));
    }
    let Some(raw) = comm.live_handle() else {
        return Ok(());
    };
    if p.handle == 0 {
        // A window NCCL declined: nothing to release.
        return Ok(());
    }
    let _g = match comm.context().bind() {
        Ok(g) => g,
        Err(e) => return Err((e.into(), Some(p))),
    };
    let handle: *mut c_void = std::ptr::with_exposed_provenance_mut(p.handle);
    let (rc, call) = match p.kind {
        Kind::Local => match comm.nccl().fns().ncclCommDeregister {
            // SAFETY: a handle from ncclCommRegister on this live communicator,
            // released once (taken out of its `pending`), after the work that used it.
            Some(f) => (unsafe { f(raw, handle) }, "ncclCommDeregister"),
            None => return Ok(()),
        },
        Kind::Window => match comm.nccl().fns().ncclCommWindowDeregister {
            // SAFETY: a window of this live communicator, released once, after the
            // work that used it.
            Some(f) => (unsafe { f(raw, handle.cast()) }, "ncclCommWindowDeregister"),
            None => return Ok(()),
        },
    };
    comm.check(rc, call).map_err(|e| {
        if !comm.is_aborted() {
            // NCCL may still hold the memory: never free it.
            std::mem::forget(p);
        }
        // Otherwise the abort that followed released it with the communicator: the
        // memory may go (after its own work, as always).
        (e, None)
    })
}
