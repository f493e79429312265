//! How ranks meet: an init's rendezvous, in one process (join_init, finish_init) or at a hub across processes (join, new_hub_id), and a split's vote (Split, finish_split); below the calls that start them and the groups that defer them.

use std::ffi::c_int;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::clique::Clique;
use crate::handle::h2p;
use crate::net::hub;
use crate::net::link::{ConnectError, GatherError, Link};
use crate::notice::Notice;
use crate::parts::Done;
use crate::state::{Init, State, fail};
use crate::world::NWorld;
use nccl_sys::{ncclComm_t, ncclResult_t};

/// Registers a rank of an init and returns its clique once every rank has come, or an
/// error at the deadline.
///
/// In the multi-process mode a network id's ranks meet at its hub instead
/// ([`join`]); `handle` is the communicator of a deferred or non-blocking
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
        && let Some(res) = join(w, id, nranks, rank, device, handle)
    {
        return res;
    }
    let deadline = Instant::now() + w.timeout;
    let mut s = w.lock();
    if let Some(msg) = s.failed_grows.get(id).cloned() {
        // A grow whose ranks disagreed: its late ranks fail alike, not at the deadline.
        return Err(fail(&mut s, ncclResult_t::ncclInvalidArgument, msg));
    }
    {
        let init = s.inits.entry(id.to_vec()).or_insert_with(|| Init {
            nranks,
            devices: vec![None; nranks],
            clique: None,
            taken: 0,
            failed: None,
        });
        if init.nranks != nranks {
            // NCCL would hang here; every rank of the id fails at once instead, waiting
            // ones included.
            let msg = format!(
                "the ranks of one unique id disagree on the world size: rank {rank} asked for \
                 {nranks} ranks, another rank for {}",
                init.nranks
            );
            init.failed = Some(msg.clone());
            if init.devices.iter().all(Option::is_none) {
                s.inits.remove(id);
            }
            if crate::grow_id::is_grow_id(id) {
                s.failed_grows.insert(id.to_vec(), msg.clone());
            }
            w.cond.notify_all();
            return Err(fail(&mut s, ncclResult_t::ncclInvalidArgument, msg));
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
    // A blocking init (the caller's own thread, no handle) says on stderr when it waits
    // long: a peer that never comes, maybe driven from this very thread outside a group.
    let blocking = handle.is_none();
    let mut notice = Notice::new(
        w.timeout,
        blocking.then_some(|| format!("the init of rank {rank} of {nranks} on device {device}")),
    );
    loop {
        if let Some(msg) = s.inits.get(id).and_then(|i| i.failed.clone()) {
            if let Some(i) = s.inits.get_mut(id) {
                i.devices[rank] = None;
                if i.devices.iter().all(Option::is_none) {
                    s.inits.remove(id);
                }
            }
            return Err(fail(&mut s, ncclResult_t::ncclInvalidArgument, msg));
        }
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
        notice.tick(now);
        s = w
            .cond
            .wait_timeout(s, notice.until(deadline).saturating_duration_since(now))
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

/// Id prefix of a hub started by `ncclGetUniqueId`; its address follows.
const HUB_ID: &[u8; 8] = b"MOCKNET1";
/// Id prefix of an `NCCL_COMM_ID` address, where rank 0's init starts the hub.
const ADDR_ID: &[u8; 8] = b"MOCKADDR";

/// The unique id of a new hub: `MOCKNET1` and its address (NUL-padded).
pub(crate) fn new_hub_id(w: &NWorld) -> Result<[u8; 128], String> {
    let addr = hub::start(("127.0.0.1", 0), w.timeout, None)
        .map_err(|e| format!("cannot start a hub on 127.0.0.1: {e}"))?;
    let mut id = [0u8; 128];
    id[..8].copy_from_slice(HUB_ID);
    let a = addr.to_string();
    let n = a.len().min(120);
    id[8..8 + n].copy_from_slice(&a.as_bytes()[..n]);
    Ok(id)
}

/// The hub address an id names, and whether rank 0 must start the hub there
/// (`NCCL_COMM_ID`); `None` for an id of the in-process mode.
fn address(id: &[u8]) -> Option<(String, bool)> {
    let fixed = match id.get(..8)? {
        p if p == HUB_ID => false,
        p if p == ADDR_ID => true,
        _ => return None,
    };
    let rest = id.get(8..)?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let addr = std::str::from_utf8(&rest[..end]).ok()?;
    (!addr.is_empty()).then(|| (addr.to_string(), fixed))
}

/// Joins the communicator of a network id through its hub (starting it first for rank 0
/// of an `NCCL_COMM_ID` id); `None` when `id` is not a network id. `handle`: the
/// communicator of a deferred or non-blocking init, whose abort cancels the join.
pub(crate) fn join(
    w: &NWorld,
    id: &[u8],
    nranks: usize,
    rank: usize,
    device: i32,
    handle: Option<usize>,
) -> Option<Result<Arc<Clique>, ncclResult_t>> {
    let (addr, fixed) = address(id)?;
    let deadline = Instant::now() + w.timeout;
    // An address in use may be a closing listener (see `hub::start`): retried briefly.
    let retry_until = deadline.min(Instant::now() + hub::BIND_RETRY);
    if fixed
        && rank == 0
        && let Err(e) = hub::start(addr.as_str(), w.timeout, Some(retry_until))
    {
        let msg = format!("rank 0 cannot start the hub at {addr} (NCCL_COMM_ID): {e}");
        return Some(Err(fail(&mut w.lock(), ncclResult_t::ncclSystemError, msg)));
    }
    let cancelled = || handle.is_some_and(|h| w.lock().dead.contains_key(&h));
    w.lock().net_inits += 1;
    let res = connect(
        w,
        &addr,
        fixed,
        (nranks, rank, device),
        deadline,
        &cancelled,
    );
    let mut s = w.lock();
    s.net_inits -= 1;
    Some(match res {
        Ok(clique) => {
            s.cliques.push(Arc::downgrade(&clique));
            Ok(clique)
        }
        Err((rc, msg)) => Err(fail(&mut s, rc, msg)),
    })
}

/// Connects, says hello and waits for every rank; the clique, or the error and message.
fn connect(
    w: &NWorld,
    addr: &str,
    fixed: bool,
    (nranks, rank, device): (usize, usize, i32),
    deadline: Instant,
    cancelled: &dyn Fn() -> bool,
) -> Result<Arc<Clique>, (ncclResult_t, String)> {
    let (system, timeout) = (ncclResult_t::ncclSystemError, w.timeout);
    let aborted = || {
        let msg = format!("rank {rank}: init aborted");
        (ncclResult_t::ncclInvalidUsage, msg)
    };
    let unreachable = |e: String| {
        let starter = if fixed {
            "rank 0's init starts it (NCCL_COMM_ID)"
        } else {
            "the process that called ncclGetUniqueId runs it"
        };
        let msg = format!(
            "rank {rank}: no hub at {addr} within {timeout:?} ({e}); {starter}, so rank 0 and \
             maybe others are missing"
        );
        (system, msg)
    };
    loop {
        let link = match Link::connect(addr, rank, (deadline, timeout), cancelled) {
            Ok(l) => l,
            Err(ConnectError::Cancelled) => return Err(aborted()),
            Err(ConnectError::Unreachable(e)) => return Err(unreachable(e)),
        };
        let res = link.gather(nranks, device, deadline, cancelled);
        if let Err(GatherError::Unheard) = res {
            if Instant::now() >= deadline {
                return Err(unreachable("the connection closed unanswered".into()));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            continue;
        }
        return formed(res, link, addr, (nranks, rank), timeout);
    }
}

/// The clique of a finished gather, or the error and message.
fn formed(
    res: Result<Vec<i32>, GatherError>,
    link: Link,
    addr: &str,
    (nranks, rank): (usize, usize),
    timeout: std::time::Duration,
) -> Result<Arc<Clique>, (ncclResult_t, String)> {
    let system = ncclResult_t::ncclSystemError;
    let aborted = || {
        let msg = format!("rank {rank}: init aborted");
        (ncclResult_t::ncclInvalidUsage, msg)
    };
    match res {
        Ok(devices) if devices.len() == nranks => Ok(Clique::networked(devices, link)),
        Ok(devices) => {
            let msg = format!(
                "rank {rank}: the hub at {addr} formed {} ranks, not {nranks}",
                devices.len()
            );
            Err((ncclResult_t::ncclInternalError, msg))
        }
        Err(GatherError::Refused(rc, msg)) => Err((rc, format!("{msg} (hub at {addr})"))),
        Err(GatherError::Lost(e)) => Err((system, format!("rank {rank}: hub at {addr}: {e}"))),
        Err(GatherError::Cancelled) => Err(aborted()),
        Err(GatherError::Unheard) => Err((system, format!("rank {rank}: hub at {addr} unheard"))),
        Err(GatherError::NotAHub) => {
            let msg = format!(
                "rank {rank}: something at {addr} accepted the connection but did not answer \
                 as the hub of the simulated NCCL within {:?}: another program may hold that \
                 port (the rank that hosts the hub then fails to start it); choose another \
                 port",
                crate::net::link::HELLO_ANSWER
            );
            Err((system, msg))
        }
        Err(GatherError::Timeout(missing)) => {
            let missing = match missing {
                Some(m) => format!("missing ranks {m:?}"),
                None => "the hub has not answered yet".into(),
            };
            let msg = format!(
                "rank {rank}: not every rank of {nranks} joined within {timeout:?} (hub at \
                 {addr}; {missing})"
            );
            Err((system, msg))
        }
    }
}
