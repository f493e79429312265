//! Each thread's open groups (thread-local) and the work they defer until the outermost `ncclGroupEnd`: below every call that checks for a group or defers to one, above the work, splits and state they hold.

use std::cell::Cell;
use std::collections::HashMap;

use crate::rendezvous::Split;
use crate::state::State;
use crate::work::Work;
use crate::world::NWorld;
use nccl_sys::ncclResult_t;

/// Work deferred by a group until `ncclGroupEnd`.
pub(super) enum Deferred {
    /// A collective or send/recv, checked by the sanitizer when it is due at the end.
    Work(Work),
    Init {
        handle: usize,
        id: Vec<u8>,
        nranks: usize,
        rank: usize,
        device: i32,
    },
    Split(Split),
}

/// One thread's open group in one world.
#[derive(Default)]
struct Group {
    depth: u32,
    deferred: Vec<Deferred>,
    /// The first error of a split or shrink call inside the group (NCCL's
    /// `ncclGroupError`): the group end then runs none of the group's work and returns it.
    error: Option<ncclResult_t>,
    /// The mode of the group's first split or shrink parent: NCCL refuses to mix blocking
    /// and non-blocking communicators in one group.
    blocking: Option<bool>,
}

impl Group {
    fn is_idle(&self) -> bool {
        self.depth == 0
            && self.deferred.is_empty()
            && self.error.is_none()
            && self.blocking.is_none()
    }
}

type Groups = HashMap<u64, Group>;

thread_local! {
    /// Groups are per thread in NCCL; keyed by world id so simulated worlds stay apart.
    /// NCCL's group state is plain thread-local data without a destructor, so it is still
    /// there in every destructor of the thread's other thread-locals (a group kept in one
    /// can end there): so is this, a `const` cell without destructor pointing at a map
    /// made at the first group and freed once the thread has no group left (a thread
    /// that ends with a group open leaks it, as NCCL's does).
    static GROUPS: Cell<*mut Groups> = const { Cell::new(std::ptr::null_mut()) };
}

/// Runs `f` on the calling thread's groups. `f` must not call back into this function.
fn with_groups<R>(f: impl FnOnce(&mut Groups) -> R) -> R {
    GROUPS.with(|cell| {
        let mut p = cell.get();
        if p.is_null() {
            p = Box::into_raw(Box::<Groups>::default());
            cell.set(p);
        }
        // SAFETY: `p` is this thread's map, made by `Box::into_raw` above or on an earlier
        // call and freed only below; it is reached only through this function, which `f`
        // does not re-enter, so this is the one reference.
        let groups = unsafe { &mut *p };
        let r = f(groups);
        if groups.values().all(Group::is_idle) {
            cell.set(std::ptr::null_mut());
            // SAFETY: made by `Box::into_raw`, no reference to it is left (`groups` is
            // not used again), and the cell no longer points at it: freed once.
            drop(unsafe { Box::from_raw(p) });
        }
        r
    })
}

/// Opens one more level of the calling thread's group in world `world` (`ncclGroupStart`).
pub(super) fn open(world: u64) {
    with_groups(|g| g.entry(world).or_default().depth += 1);
}

/// Whether the calling thread has a group open in world `world`.
pub(super) fn in_group(world: u64) -> bool {
    with_groups(|g| g.get(&world).is_some_and(|g| g.depth > 0))
}

/// Records `d` to run at the calling thread's outermost `ncclGroupEnd`.
pub(super) fn defer(world: u64, d: Deferred) {
    with_groups(|g| g.entry(world).or_default().deferred.push(d));
}

/// Notes a failed call inside the calling thread's open group (nothing outside one).
pub(super) fn note_error(world: u64, rc: ncclResult_t) {
    with_groups(|g| {
        if let Some(grp) = g.get_mut(&world).filter(|g| g.depth > 0) {
            grp.error.get_or_insert(rc);
        }
    });
}

/// Whether a split or shrink of a parent in this mode may join the open group: the
/// first sets the group's mode, later ones must match it.
pub(super) fn group_mode(world: u64, blocking: bool) -> bool {
    with_groups(|g| {
        let grp = g.entry(world).or_default();
        *grp.blocking.get_or_insert(blocking) == blocking
    })
}

/// Whether the calling thread's open group has splits or shrinks waiting for its end
/// (whose new communicators are still NULL for the caller).
pub(super) fn children_pending(world: u64) -> bool {
    with_groups(|g| {
        g.get(&world).is_some_and(|g| {
            g.depth > 0 && g.deferred.iter().any(|d| matches!(d, Deferred::Split(_)))
        })
    })
}

/// Leaves one level of the calling thread's group: at the outermost end, its deferred
/// work and error. `None` when no group is open.
pub(super) fn leave(world: u64) -> Option<(Vec<Deferred>, Option<ncclResult_t>)> {
    with_groups(|g| {
        let grp = g.get_mut(&world)?;
        if grp.depth == 0 {
            return None;
        }
        grp.depth -= 1;
        if grp.depth > 0 {
            return Some((Vec::new(), None));
        }
        let done = std::mem::take(grp);
        Some((done.deferred, done.error))
    })
}

/// Drops the work of a group that failed, as NCCL does: nothing of it runs. Splits and
/// shrinks never hand their child over (it goes); inits handed out at the call fail.
pub(super) fn cancel(s: &mut State, work: Vec<Deferred>, rc: ncclResult_t) {
    for d in work {
        match d {
            Deferred::Split(job) => {
                s.comms.remove(&job.child());
                // Its place in the parent's split order is free again.
                if let Some(p) = s.comms.get_mut(&job.parent) {
                    p.split_seq = p.split_seq.min(job.seq());
                }
            }
            Deferred::Init { handle, .. } => {
                if let Some(c) = s.comms.get_mut(&handle) {
                    c.async_err = rc;
                }
            }
            Deferred::Work(_) => {}
        }
    }
}

/// An injected fault of `function` inside a group: a failed split or shrink fails the
/// group (NCCL's `ncclGroupErrCheck`), and a failed `ncclGroupEnd` still closes the
/// group, running none of its work, as NCCL's does.
pub(super) fn after_fault(w: &NWorld, s: &mut State, function: &str, rc: ncclResult_t) {
    match function {
        "ncclCommSplit" | "ncclCommShrink" => note_error(w.id, rc),
        "ncclGroupEnd" => {
            if let Some((work, _)) = leave(w.id) {
                cancel(s, work, rc);
            }
        }
        _ => {}
    }
}
