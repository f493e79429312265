//! How ranks meet: an init's rendezvous (join_init, finish_init) and a split's vote (Split, finish_split), completed in the call, in the background or at a group's end; below the calls that start them and the groups that defer them.

use std::ffi::c_int;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::clique::Clique;
use crate::handle::h2p;
use crate::parts::Done;
use crate::state::{Init, State, fail};
use crate::world::NWorld;
use nccl_sys::{ncclComm_t, ncclResult_t};

/// Registers a rank of an init and returns its clique once every rank has come, or an
/// error at the deadline.
///
/// In the multi-process mode a network id's ranks meet at its hub instead
/// ([`crate::net::join`]); `handle` is the communicator of a deferred or non-blocking
/// init, whose abort cancels that wait.
pub(super) fn join_init(
    w: &NWorld,
    id: &[u8],
    nranks: usize,
    rank: usize,
    device: i32,
    handle: Option<usize>,
) -> Result<Arc<Clique>, ncclResult_t> {
    if w.multi_process
        && let Some(res) = crate::net::join(w, id, nranks, rank, device, handle)
    {
        return res;
    }
    let deadline = Instant::now() + w.timeout;
    let mut s = w.lock();
    {
        let init = s.inits.entry(id.to_vec()).or_insert_with(|| Init {
            nranks,
            devices: vec![None; nranks],
            clique: None,
            taken: 0,
        });
        if init.nranks != nranks {
            let msg = format!(
                "rank {rank} asked for {nranks} ranks, another rank for {}",
                init.nranks
            );
            return Err(fail(&mut s, ncclResult_t::ncclInvalidUsage, msg));
        }
        if init.devices[rank].is_some() {
            return Err(fail(
                &mut s,
                ncclResult_t::ncclInvalidUsage,
                format!("rank {rank} joined twice"),
            ));
        }
        init.devices[rank] = Some(device);
        if init.devices.iter().all(Option::is_some) {
            let clique = Clique::new(init.devices.iter().map(|d| d.unwrap_or(0)).collect());
            init.clique = Some(clique.clone());
            s.cliques.push(Arc::downgrade(&clique));
            w.cond.notify_all();
        }
    }
    loop {
        let cancelled = s
            .inits
            .get(id)
            .is_none_or(|i| i.clique.is_none() && i.devices.get(rank).is_some_and(Option::is_none));
        if cancelled {
            let msg = format!("rank {rank}: init aborted");
            return Err(fail(&mut s, ncclResult_t::ncclInvalidUsage, msg));
        }
        let ready = s.inits.get(id).and_then(|i| i.clique.clone());
        if let Some(c) = ready {
            let remove = match s.inits.get_mut(id) {
                Some(i) => {
                    i.taken += 1;
                    i.taken == i.nranks
                }
                None => false,
            };
            if remove {
                s.inits.remove(id);
            }
            return Ok(c);
        }
        let now = Instant::now();
        if now >= deadline {
            if let Some(i) = s.inits.get_mut(id) {
                i.devices[rank] = None;
                if i.devices.iter().all(Option::is_none) {
                    s.inits.remove(id);
                }
            }
            let msg = format!(
                "rank {rank}: not every rank of {nranks} joined within {:?}",
                w.timeout
            );
            return Err(fail(&mut s, ncclResult_t::ncclSystemError, msg));
        }
        s = w
            .cond
            .wait_timeout(s, deadline - now)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}

/// Completes a deferred or non-blocking init of comm `h`.
pub(super) fn finish_init(
    w: &NWorld,
    h: usize,
    key: &[u8],
    n: usize,
    r: usize,
    device: i32,
) -> ncclResult_t {
    let res = join_init(w, key, n, r, device, Some(h));
    let mut s = w.lock();
    match (res, s.comms.get_mut(&h)) {
        (Ok(clique), Some(c)) => {
            c.clique = Some(clique);
            c.async_err = ncclResult_t::ncclSuccess;
            c.init = None;
            ncclResult_t::ncclSuccess
        }
        (Err(rc), Some(c)) => {
            c.async_err = rc;
            rc
        }
        (_, None) => ncclResult_t::ncclInvalidArgument,
    }
}

/// One rank's part of a split or shrink still to be carried out (now, in the background,
/// or at the end of a group).
pub(super) struct Split {
    /// `ncclCommSplit` or `ncclCommShrink`, for messages.
    pub(super) call: &'static str,
    pub(super) clique: Arc<Clique>,
    pub(super) seq: u64,
    pub(super) rank: usize,
    pub(super) color: c_int,
    pub(super) key: c_int,
    /// A shrink's excluded ranks (sorted, no duplicates); empty for a split.
    pub(super) excluded: Vec<usize>,
    /// The child's handle, 0 for NCCL_SPLIT_NOCOLOR.
    pub(super) child: usize,
    /// The parent's handle and mode: NCCL completes the split as the parent's (group)
    /// job, in the background when the parent is non-blocking.
    pub(super) parent: usize,
    pub(super) parent_blocking: bool,
    /// The exposed address of the caller's `newcomm`, written when the split completes.
    pub(super) out: usize,
    /// Set when the split completed in the background (the parent's pending work).
    pub(super) done: Option<Done>,
    /// For a non-blocking split outside a group: the parent's async state, which NCCL
    /// publishes before it stores the child.
    pub(super) early: Option<Done>,
}

impl Split {
    /// The child's handle (0 for none), which was never handed out while the split waits.
    pub(super) fn child(&self) -> usize {
        self.child
    }

    /// Its number in the parent's order of splits.
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }
}

/// Votes in the parent's split and completes the child with its clique and rank, or
/// leaves the failure as its asynchronous error. Like NCCL, the child is handed over
/// (written to the caller's `newcomm`) only now, a failed one too: its owner aborts it.
pub(super) fn finish_split(w: &NWorld, job: Split) -> ncclResult_t {
    let res = job.clique.split(
        job.seq,
        job.rank,
        (job.color, job.key),
        &job.excluded,
        Instant::now() + w.timeout,
    );
    let mut s = w.lock();
    let rc = match res {
        Ok(out) => {
            if let Some(cl) = &out.clique {
                s.cliques.push(Arc::downgrade(cl));
            }
            if let Some(c) = s.comms.get_mut(&job.child) {
                c.size = out.clique.as_ref().map_or(0, |cl| cl.size);
                c.clique = out.clique;
                c.rank = out.rank;
                c.async_err = ncclResult_t::ncclSuccess;
            }
            ncclResult_t::ncclSuccess
        }
        Err(rc) => {
            if let Some(c) = s.comms.get_mut(&job.child) {
                c.async_err = rc;
            }
            let why = match rc {
                ncclResult_t::ncclRemoteError => "a peer aborted".to_string(),
                ncclResult_t::ncclInvalidUsage => "the ranks disagree on who takes part".into(),
                _ => format!("not every rank took part within {:?}", w.timeout),
            };
            let msg = format!(
                "{} of rank {} of {}: {why}",
                job.call, job.rank, job.clique.size
            );
            fail(&mut s, rc, msg)
        }
    };
    if let Some(early) = &job.early {
        // Seen on NCCL 2.28: the parent of a non-blocking split outside a group reads
        // "success" before the background job stores the child, so callers must wait for
        // the store itself. (Aborting the parent still waits for the whole job: `done`.)
        *early.lock().unwrap_or_else(|e| e.into_inner()) = Some(rc);
        drop(s);
        std::thread::sleep(std::time::Duration::from_millis(20));
        s = w.lock();
    }
    if job.out != 0 && job.child != 0 && s.comms.contains_key(&job.child) {
        let slot = std::ptr::with_exposed_provenance_mut::<ncclComm_t>(job.out);
        // SAFETY: NCCL's contract for `newcomm`: the caller keeps it valid, aligned and
        // untouched until the split completes (the group ended, or the parent's async
        // error left ncclInProgress), and it was checked non-null at the call. The store
        // is atomic, as NCCL's is, and happens before the completion is published.
        unsafe { AtomicPtr::from_ptr(slot) }.store(h2p(job.child), Ordering::Release);
    }
    if let Some(d) = &job.done {
        *d.lock().unwrap_or_else(|e| e.into_inner()) = Some(rc);
    }
    rc
}

/// Registers a split of `parent` completing in the background: the parent's async error
/// says ncclInProgress until it is done, and an abort of the parent waits for it.
pub(super) fn track_in_parent(s: &mut State, parent: usize) -> Done {
    let done: Done = Arc::new(Mutex::new(None));
    if let Some(c) = s.comms.get_mut(&parent) {
        c.pending.push(done.clone());
        c.children.push(done.clone());
    }
    done
}
