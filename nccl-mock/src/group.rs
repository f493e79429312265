//! Groups: between `ncclGroupStart` and `ncclGroupEnd` a thread's calls are only
//! recorded, and run together at the outermost end, which is how one thread can drive
//! several ranks (each rank's call would otherwise wait for its peers).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::clique::Clique;
use crate::collective::Work;
use crate::init::{Split, finish_init, finish_split, track_in_parent};
use crate::macros::nccl_mock;
use crate::parts::Done;
use crate::state::{State, fail};
use crate::world::NWorld;
use crate::world::slot_of;
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
fn leave(world: u64) -> Option<(Vec<Deferred>, Option<ncclResult_t>)> {
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
fn cancel(s: &mut State, work: Vec<Deferred>, rc: ncclResult_t) {
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

fn group_end(w: &NWorld) -> ncclResult_t {
    let Some((work, error)) = leave(w.id) else {
        return fail(
            &mut w.lock(),
            ncclResult_t::ncclInvalidUsage,
            "ncclGroupEnd without ncclGroupStart".into(),
        );
    };
    if let Some(rc) = error {
        // The failed call's message stays the last error.
        cancel(&mut w.lock(), work, rc);
        return rc;
    }
    let deadline = Instant::now() + w.timeout;
    let mut rc = ncclResult_t::ncclSuccess;
    let mut waits: Vec<(Arc<Clique>, Done)> = Vec::new();
    let mut inits = Vec::new();
    let mut splits = Vec::new();
    let mut background_splits = Vec::new();
    let mut background = Vec::new();
    for d in work {
        match d {
            // As NCCL does for non-blocking communicators, their grouped work is enqueued
            // in the background: the group end answers ncclInProgress, and the
            // communicators' async error says so until it is done. The sanitizer checks
            // its ranges when it runs, so memory released too early is caught.
            Deferred::Work(work) if !is_blocking(w, work.comm()) => background.push(work),
            // A part refused by the sanitizer is withdrawn: its peers fail, none hangs.
            Deferred::Work(work) => match work.start_grouped(w) {
                Ok(wait) => waits.push(wait),
                Err(e) => {
                    if rc == ncclResult_t::ncclSuccess {
                        rc = e;
                    }
                }
            },
            Deferred::Init {
                handle,
                id,
                nranks,
                rank,
                device,
            } => inits.push((handle, id, nranks, rank, device)),
            // Splits of non-blocking parents complete in the background too; each
            // parent's async error says ncclInProgress until its split is done.
            Deferred::Split(job) if !job.parent_blocking => background_splits.push(job),
            Deferred::Split(job) => splits.push(job),
        }
    }
    // Inits and splits of one thread's group join one by one, each waiting for its
    // peers; the rendezvous completes on the last, so each gets a thread.
    if !inits.is_empty() || !splits.is_empty() || !background_splits.is_empty() {
        let Some(world) = slot_of(w) else {
            return ncclResult_t::ncclInternalError;
        };
        {
            let mut s = w.lock();
            for job in &mut background_splits {
                job.done = Some(track_in_parent(&mut s, job.parent));
            }
        }
        for job in std::mem::take(&mut background_splits) {
            let world = world.clone();
            std::thread::spawn(move || finish_split(&world, job));
            rc_in_progress(&mut rc);
        }
        let mut threads: Vec<std::thread::JoinHandle<ncclResult_t>> = Vec::new();
        for (h, id, n, r, d) in inits {
            let world = world.clone();
            threads.push(std::thread::spawn(move || {
                finish_init(&world, h, &id, n, r, d)
            }));
        }
        for job in splits {
            let world = world.clone();
            threads.push(std::thread::spawn(move || finish_split(&world, job)));
        }
        for t in threads {
            merge(&mut rc, t.join().unwrap_or(ncclResult_t::ncclInternalError));
        }
    }
    for (clique, done) in waits {
        merge(&mut rc, clique.wait(&done, deadline));
    }
    if !background.is_empty()
        && (rc == ncclResult_t::ncclSuccess || rc == ncclResult_t::ncclInProgress)
    {
        return start_in_background(w, background, deadline);
    }
    rc
}

/// A group with work left in the background answers ncclInProgress (unless it failed).
fn rc_in_progress(rc: &mut ncclResult_t) {
    if *rc == ncclResult_t::ncclSuccess {
        *rc = ncclResult_t::ncclInProgress;
    }
}

/// Keeps the group's first failure.
fn merge(rc: &mut ncclResult_t, r: ncclResult_t) {
    let open = *rc == ncclResult_t::ncclSuccess || *rc == ncclResult_t::ncclInProgress;
    if open && r != ncclResult_t::ncclSuccess {
        *rc = r;
    }
}

fn is_blocking(w: &NWorld, comm: usize) -> bool {
    w.lock().comms.get(&comm).is_none_or(|c| c.blocking)
}

/// Runs grouped work of non-blocking communicators on a thread of its own, a moment
/// after the group end returned; each communicator's async error reports it pending.
fn start_in_background(
    w: &NWorld,
    work: Vec<crate::collective::Work>,
    deadline: Instant,
) -> ncclResult_t {
    let Some(world) = slot_of(w) else {
        return ncclResult_t::ncclInternalError;
    };
    let done: Done = Arc::new(std::sync::Mutex::new(None));
    {
        let mut s = w.lock();
        let mut comms: Vec<usize> = work.iter().map(|x| x.comm()).collect();
        comms.dedup();
        for c in comms {
            if let Some(c) = s.comms.get_mut(&c) {
                c.pending.push(done.clone());
            }
        }
    }
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut rc = ncclResult_t::ncclSuccess;
        let mut waits = Vec::new();
        for x in work {
            // An abort since the group's end stops the communicator's background work,
            // as NCCL's abort flag stops its jobs: it never runs.
            let aborted = world.lock().dead.get(&x.comm()) == Some(&"ncclCommAbort");
            if aborted {
                x.cancel();
                if rc == ncclResult_t::ncclSuccess {
                    rc = ncclResult_t::ncclRemoteError;
                }
                continue;
            }
            match x.start_grouped(&world) {
                Ok(wait) => waits.push(wait),
                Err(e) if rc == ncclResult_t::ncclSuccess => rc = e,
                Err(_) => {}
            }
        }
        for (clique, d) in waits {
            let r = clique.wait(&d, deadline);
            if rc == ncclResult_t::ncclSuccess {
                rc = r;
            }
        }
        *done.lock().unwrap_or_else(|e| e.into_inner()) = Some(rc);
    });
    ncclResult_t::ncclInProgress
}

nccl_mock! {
    fn ncclGroupStart = group_start(w, s) {
        drop(s);
        with_groups(|g| g.entry(w.id).or_default().depth += 1);
        ncclResult_t::ncclSuccess
    }
    fn ncclGroupEnd = group_end_fn(w, s) {
        drop(s);
        group_end(w)
    }
}
