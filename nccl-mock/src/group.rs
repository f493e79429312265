//! Groups: between `ncclGroupStart` and `ncclGroupEnd` a thread's calls are only
//! recorded, and run together at the outermost end, which is how one thread can drive
//! several ranks (each rank's call would otherwise wait for its peers).

use std::sync::Arc;
use std::time::Instant;

use crate::clique::Clique;
use crate::macros::mock_fns;
use crate::parts::Done;
use crate::rendezvous::{finish_init, finish_split, track_in_parent};
use crate::state::fail;
use crate::thread_groups::{Deferred, cancel, leave, open};
use crate::work::Work;
use crate::world::{NWorld, slot_of};
use nccl_sys::ncclResult_t;

fn group_end(w: &NWorld) -> ncclResult_t {
    let Some((work, error)) = leave(w.id) else {
        return fail(
            &mut w.lock(),
            ncclResult_t::ncclInvalidUsage,
            "ncclGroupEnd without ncclGroupStart".into(),
        );
    };
    finish(w, work, error)
}

/// The outermost end of a group whose deferred `work` and first `error` were taken: runs
/// the work (none of it after an error, which is returned).
pub(super) fn finish(w: &NWorld, work: Vec<Deferred>, error: Option<ncclResult_t>) -> ncclResult_t {
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

pub(super) fn is_blocking(w: &NWorld, comm: usize) -> bool {
    w.lock().comms.get(&comm).is_none_or(|c| c.blocking)
}

/// Runs grouped work of non-blocking communicators on a thread of its own, a moment
/// after the group end returned; each communicator's async error reports it pending.
fn start_in_background(w: &NWorld, work: Vec<Work>, deadline: Instant) -> ncclResult_t {
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

/// `ncclGroupEnd` (also `ncclGroupSimulateEnd` with a NULL `simInfo`).
pub(super) fn group_end_plain(w: &NWorld) -> ncclResult_t {
    group_end(w)
}

mock_fns! {
    fn ncclGroupStart = group_start(w, s) {
        drop(s);
        open(w.id);
        ncclResult_t::ncclSuccess
    }
    fn ncclGroupEnd = group_end_fn(w, s) {
        drop(s);
        group_end(w)
    }
}
