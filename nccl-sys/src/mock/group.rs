//! Groups: between `ncclGroupStart` and `ncclGroupEnd` a thread's calls are only
//! recorded, and run together at the outermost end, which is how one thread can drive
//! several ranks (each rank's call would otherwise wait for its peers).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::NWorld;
use super::api::{nccl_mock, slot_of};
use super::clique::{Clique, Done};
use super::collective::Work;
use super::init::{Split, finish_init, finish_split};
use super::state::fail;
use crate::ncclResult_t;

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
}

thread_local! {
    /// Groups are per thread in NCCL; keyed by world id so simulated worlds stay apart.
    static GROUPS: RefCell<HashMap<u64, Group>> = RefCell::new(HashMap::new());
}

/// Whether the calling thread has a group open in world `world`.
pub(super) fn in_group(world: u64) -> bool {
    GROUPS.with(|g| g.borrow().get(&world).is_some_and(|g| g.depth > 0))
}

/// Records `d` to run at the calling thread's outermost `ncclGroupEnd`.
pub(super) fn defer(world: u64, d: Deferred) {
    GROUPS.with(|g| g.borrow_mut().entry(world).or_default().deferred.push(d));
}

fn group_end(w: &NWorld) -> ncclResult_t {
    let work = GROUPS.with(|g| {
        let mut g = g.borrow_mut();
        let grp = g.entry(w.id).or_default();
        if grp.depth == 0 {
            return None;
        }
        grp.depth -= 1;
        Some(if grp.depth == 0 {
            std::mem::take(&mut grp.deferred)
        } else {
            Vec::new()
        })
    });
    let Some(work) = work else {
        return fail(
            &mut w.lock(),
            ncclResult_t::ncclInvalidUsage,
            "ncclGroupEnd without ncclGroupStart".into(),
        );
    };
    let deadline = Instant::now() + w.timeout;
    let mut rc = ncclResult_t::ncclSuccess;
    let mut waits: Vec<(Arc<Clique>, Done)> = Vec::new();
    let mut inits = Vec::new();
    let mut splits = Vec::new();
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
            Deferred::Split(job) => splits.push(job),
        }
    }
    // Inits and splits of one thread's group join one by one, each waiting for its
    // peers; the rendezvous completes on the last, so each gets a thread.
    if !inits.is_empty() || !splits.is_empty() {
        let Some(world) = slot_of(w) else {
            return ncclResult_t::ncclInternalError;
        };
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
            let r = t.join().unwrap_or(ncclResult_t::ncclInternalError);
            if rc == ncclResult_t::ncclSuccess {
                rc = r;
            }
        }
    }
    for (clique, done) in waits {
        let r = clique.wait(&done, deadline);
        if rc == ncclResult_t::ncclSuccess {
            rc = r;
        }
    }
    if !background.is_empty() && rc == ncclResult_t::ncclSuccess {
        return start_in_background(w, background, deadline);
    }
    rc
}

fn is_blocking(w: &NWorld, comm: usize) -> bool {
    w.lock().comms.get(&comm).is_none_or(|c| c.blocking)
}

/// Runs grouped work of non-blocking communicators on a thread of its own, a moment
/// after the group end returned; each communicator's async error reports it pending.
fn start_in_background(
    w: &NWorld,
    work: Vec<super::collective::Work>,
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
        GROUPS.with(|g| g.borrow_mut().entry(w.id).or_default().depth += 1);
        ncclResult_t::ncclSuccess
    }
    fn ncclGroupEnd = group_end_fn(w, s) {
        drop(s);
        group_end(w)
    }
}
