//! Communicator lifecycle: unique ids, init (by rank, with a config, all at once),
//! finalize, destroy, abort and split.
//!
//! Ranks of one unique id meet in a rendezvous (`State::inits`); once all have come they
//! share one [`Clique`]. Blocking inits wait for it in the call; non-blocking inits and
//! inits inside a group join from a background thread.

use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::clique::Clique;
use crate::config::{MockConfig, read as read_config};
use crate::group::{Deferred, defer, group_mode, in_group, note_error};
use crate::handle::h2p;
use crate::macros::nccl_mock;
use crate::parts::Done;
use crate::state::{Init, State, fail};
use crate::world::NWorld;
use crate::world::slot_of;
use nccl_sys::*;

/// Registers a rank of an init and returns its clique once every rank has come, or an
/// error at the deadline.
///
/// In the multi-process mode a network id's ranks meet at its hub instead
/// ([`crate::net::join`]); `handle` is the communicator of a deferred or non-blocking
/// init, whose abort cancels that wait.
fn join_init(
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

/// The device of the calling thread's current context, as NCCL's init uses.
fn current_device(w: &NWorld) -> i32 {
    w.cuda.current_device().unwrap_or(0)
}

fn init_rank(
    w: &NWorld,
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    config: Option<MockConfig>,
) -> ncclResult_t {
    let blocking = config
        .as_ref()
        .and_then(MockConfig::blocking)
        .unwrap_or(true);
    if out.is_null() {
        return fail(
            &mut w.lock(),
            ncclResult_t::ncclInvalidArgument,
            "comm is NULL".into(),
        );
    }
    if nranks < 1 || rank < 0 || rank >= nranks {
        let msg = format!("invalid rank {rank} or nranks {nranks}");
        return fail(&mut w.lock(), ncclResult_t::ncclInvalidArgument, msg);
    }
    let (n, r) = (nranks as usize, rank as usize);
    let device = current_device(w);
    let key: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    if in_group(w.id) {
        let h = {
            let mut s = w.lock();
            let h = s.new_comm(w, None, r, n, device);
            if let Some(c) = s.comms.get_mut(&h) {
                c.async_err = ncclResult_t::ncclInProgress;
                c.config = config;
            }
            h
        };
        defer(
            w.id,
            Deferred::Init {
                handle: h,
                id: key,
                nranks: n,
                rank: r,
                device,
            },
        );
        // SAFETY: checked non-null out-pointer.
        unsafe { *out = h2p(h) };
        return ncclResult_t::ncclSuccess;
    }
    if !blocking {
        let h = {
            let mut s = w.lock();
            let h = s.new_comm(w, None, r, n, device);
            if let Some(c) = s.comms.get_mut(&h) {
                c.async_err = ncclResult_t::ncclInProgress;
                c.blocking = false;
                c.init = Some((key.clone(), r));
                c.config = config;
            }
            h
        };
        // SAFETY: checked non-null out-pointer.
        unsafe { *out = h2p(h) };
        let Some(world) = slot_of(w) else {
            return ncclResult_t::ncclInternalError;
        };
        std::thread::spawn(move || finish_init(&world, h, &key, n, r, device));
        return ncclResult_t::ncclInProgress;
    }
    match join_init(w, &key, n, r, device, None) {
        Ok(clique) => {
            let mut s = w.lock();
            let h = s.new_comm(w, Some(clique), r, n, device);
            if let Some(c) = s.comms.get_mut(&h) {
                c.config = config;
            }
            // SAFETY: checked non-null out-pointer.
            unsafe { *out = h2p(h) };
            ncclResult_t::ncclSuccess
        }
        Err(rc) => rc,
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
    call: &'static str,
    clique: Arc<Clique>,
    seq: u64,
    rank: usize,
    color: c_int,
    key: c_int,
    /// A shrink's excluded ranks (sorted, no duplicates); empty for a split.
    excluded: Vec<usize>,
    /// The child's handle, 0 for NCCL_SPLIT_NOCOLOR.
    child: usize,
    /// The parent's handle and mode: NCCL completes the split as the parent's (group)
    /// job, in the background when the parent is non-blocking.
    pub(super) parent: usize,
    pub(super) parent_blocking: bool,
    /// The exposed address of the caller's `newcomm`, written when the split completes.
    out: usize,
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

/// A call's argument error: the last error, and the group's error inside a group (NCCL's
/// `ncclGroupErrCheck`: the group end then runs none of the group's work).
fn fail_call(w: &NWorld, s: &mut State, rc: ncclResult_t, msg: String) -> ncclResult_t {
    note_error(w.id, rc);
    fail(s, rc, msg)
}

/// Creates the child of a split or shrink of `parent` and starts it: deferred to the end
/// of an open group, in the background for a non-blocking parent, else completed now.
/// `*newcomm` was set to NULL; it gets the child when the split completes.
#[allow(clippy::too_many_arguments)] // the split's arguments, checked by the caller
fn start_child(
    w: &NWorld,
    mut s: MutexGuard<'_, State>,
    call: &'static str,
    parent: usize,
    config: Option<MockConfig>,
    (color, key): (c_int, c_int),
    excluded: Vec<usize>,
    newcomm: *mut ncclComm_t,
) -> ncclResult_t {
    let Some(c) = s.comms.get(&parent) else {
        return ncclResult_t::ncclInternalError;
    };
    let parent_blocking = c.blocking;
    // Like NCCL: without an explicit mode the child follows its parent, and a NULL config
    // inherits the parent's configuration.
    let child_blocking = config
        .as_ref()
        .and_then(MockConfig::blocking)
        .unwrap_or(parent_blocking);
    let child_config = config.or_else(|| c.config.clone());
    let Some(clique) = c.clique.clone() else {
        let msg = format!("{call}: the parent communicator is not initialised yet");
        return fail_call(w, &mut s, ncclResult_t::ncclInvalidUsage, msg);
    };
    if clique.is_networked() {
        let msg = format!(
            "{call}: splits and shrinks are not simulated across processes \
             (MockNccl::multi_process)"
        );
        return fail_call(w, &mut s, ncclResult_t::ncclInvalidUsage, msg);
    }
    let grouped = in_group(w.id);
    if grouped && !group_mode(w.id, parent_blocking) {
        let msg = format!("{call}: blocking and non-blocking communicators in one group");
        return fail_call(w, &mut s, ncclResult_t::ncclInvalidArgument, msg);
    }
    let Some(c) = s.comms.get_mut(&parent) else {
        return ncclResult_t::ncclInternalError;
    };
    let (seq, rank, device) = (c.split_seq, c.rank, c.device);
    c.split_seq += 1;
    // The child exists from the start (so a leak check counts it), but the caller gets
    // its handle only when the split completes; NOCOLOR ranks get none.
    let child = if color == NCCL_SPLIT_NOCOLOR {
        0
    } else {
        let h = s.new_comm(w, None, 0, 0, device);
        if let Some(c) = s.comms.get_mut(&h) {
            c.async_err = ncclResult_t::ncclInProgress;
            c.blocking = child_blocking;
            c.config = child_config;
        }
        h
    };
    let mut job = Split {
        call,
        clique,
        seq,
        rank,
        color,
        key,
        excluded,
        child,
        parent,
        parent_blocking,
        out: newcomm.expose_provenance(),
        done: None,
        early: None,
    };
    if grouped {
        // NCCL's pattern for several splits from one thread: all complete at the end.
        drop(s);
        defer(w.id, Deferred::Split(job));
        return ncclResult_t::ncclSuccess;
    }
    if !parent_blocking {
        let Some(world) = slot_of(w) else {
            return ncclResult_t::ncclInternalError;
        };
        let (early, done) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
        if let Some(c) = s.comms.get_mut(&parent) {
            c.pending.push(Arc::clone(&early));
            c.children.push(Arc::clone(&done));
        }
        (job.early, job.done) = (Some(early), Some(done));
        drop(s);
        std::thread::spawn(move || finish_split(&world, job));
        return ncclResult_t::ncclInProgress;
    }
    drop(s);
    finish_split(w, job)
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

/// Waits (at most `w.timeout`) until the background splits of an aborted parent have
/// completed, as NCCL's abort joins the parent's group job: nothing is handed over later.
fn join_children(w: &NWorld, children: &[Done]) {
    let deadline = Instant::now() + w.timeout;
    while Instant::now() < deadline
        && children
            .iter()
            .any(|d| d.lock().unwrap_or_else(|e| e.into_inner()).is_none())
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

nccl_mock! {
    fn ncclGetUniqueId = get_unique_id(w, s, id: *mut ncclUniqueId) {
        if id.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, "uniqueId is NULL".into());
        }
        let mut bytes = [0u8; 128];
        match std::env::var("NCCL_COMM_ID") {
            // Like NCCL: with NCCL_COMM_ID every call gives the same id (the address).
            Ok(addr) if !addr.is_empty() => {
                bytes[..8].copy_from_slice(b"MOCKADDR");
                let a = addr.as_bytes();
                let n = a.len().min(120);
                bytes[8..8 + n].copy_from_slice(&a[..n]);
            }
            // Multi-process mode: a hub for the ranks of this id (NCCL's bootstrap
            // root); the id names its address.
            _ if w.multi_process => match crate::net::new_hub_id(w) {
                Ok(id) => bytes = id,
                Err(msg) => {
                    return fail(&mut s, ncclResult_t::ncclSystemError, format!("{CALL}: {msg}"));
                }
            },
            _ => {
                s.id_counter += 1;
                bytes[..8].copy_from_slice(b"MOCKNCCL");
                bytes[8..16].copy_from_slice(&w.id.to_le_bytes());
                bytes[16..24].copy_from_slice(&s.id_counter.to_le_bytes());
                bytes[24..32].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
            }
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { (*id).internal = bytes.map(|b| b as c_char) };
        ncclResult_t::ncclSuccess
    }
    fn ncclCommInitRank = comm_init_rank(w, s, comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int) {
        drop(s);
        init_rank(w, comm, nranks, id, rank, None)
    }
    fn ncclCommInitRankConfig = comm_init_rank_config(w, s, comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t) {
        // SAFETY: `config` is NULL or the caller's initialised config (NCCL's contract).
        let config = match unsafe { read_config(config, w.version) } {
            Ok(config) => config,
            Err(msg) => return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: {msg}")),
        };
        drop(s);
        init_rank(w, comm, nranks, id, rank, config)
    }
    fn ncclCommInitAll = comm_init_all(w, s, comms: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) {
        if comms.is_null() || ndev < 1 {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("invalid ndev {ndev}"));
        }
        let n = ndev as usize;
        let devices: Vec<i32> = (0..n)
            .map(|i| if devlist.is_null() { i as i32 } else {
                // SAFETY: the caller passes `ndev` device ids.
                unsafe { *devlist.add(i) }
            })
            .collect();
        if devices.iter().any(|&d| d < 0 || d as usize >= w.cuda.devices().len()) {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("invalid device list {devices:?}"));
        }
        let clique = Clique::new(devices.clone());
        s.cliques.push(Arc::downgrade(&clique));
        for (r, d) in devices.iter().enumerate() {
            let h = s.new_comm(w, Some(clique.clone()), r, n, *d);
            // SAFETY: the caller passes room for `ndev` handles.
            unsafe { *comms.add(r) = h2p(h) };
        }
        ncclResult_t::ncclSuccess
    }
    fn ncclCommFinalize = comm_finalize(w, s, comm: ncclComm_t) {
        let c = match s.comm_mut(w, CALL, comm) {
            Ok(c) => c,
            Err(rc) => return rc,
        };
        let busy = c.pending.iter().any(|d| d.lock().unwrap_or_else(|x| x.into_inner()).is_none());
        if !c.blocking && busy { ncclResult_t::ncclInProgress } else { ncclResult_t::ncclSuccess }
    }
    fn ncclCommDestroy = comm_destroy(w, s, comm: ncclComm_t) {
        match s.check_comm(w, CALL, comm) {
            Ok(h) => {
                s.free_comm(h, CALL);
                crate::registry::release_comm(w, &mut s, h, CALL);
                ncclResult_t::ncclSuccess
            }
            Err(rc) => rc,
        }
    }
    fn ncclCommAbort = comm_abort(w, s, comm: ncclComm_t) {
        let h = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        let Some(c) = s.free_comm(h, CALL) else { return ncclResult_t::ncclInternalError };
        crate::registry::release_comm(w, &mut s, h, CALL);
        if let Some(cl) = &c.clique {
            cl.abort(c.rank);
        }
        if !c.children.is_empty() {
            drop(s);
            join_children(w, &c.children);
            s = w.lock();
        }
        if let Some((key, rank)) = &c.init {
            // A rank still joining leaves the rendezvous.
            if let Some(i) = s.inits.get_mut(key) {
                if let Some(d) = i.devices.get_mut(*rank) {
                    *d = None;
                }
                if i.devices.iter().all(Option::is_none) {
                    s.inits.remove(key);
                }
            }
            w.cond.notify_all();
        }
        ncclResult_t::ncclSuccess
    }
    fn ncclCommSplit = comm_split(w, s, comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) {
        if newcomm.is_null() {
            return fail_call(w, &mut s, ncclResult_t::ncclInvalidArgument, "newcomm is NULL".into());
        }
        let parent = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => {
                note_error(w.id, rc);
                return rc;
            }
        };
        // SAFETY: `config` is NULL or the caller's initialised config (NCCL's contract).
        let config = match unsafe { read_config(config, w.version) } {
            Ok(config) => config,
            Err(msg) => return fail_call(w, &mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: {msg}")),
        };
        if color < 0 && color != NCCL_SPLIT_NOCOLOR {
            return fail_call(w, &mut s, ncclResult_t::ncclInvalidArgument, format!("invalid color {color}"));
        }
        // Like NCCL: NULL until the split completes.
        // SAFETY: checked non-null out-pointer.
        unsafe { *newcomm = std::ptr::null_mut() };
        start_child(w, s, CALL, parent, config, (color, key), Vec::new(), newcomm)
    }
    fn ncclCommShrink = comm_shrink(w, s, comm: ncclComm_t, exclude: *mut c_int, count: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, flags: c_int) {
        if newcomm.is_null() {
            return fail_call(w, &mut s, ncclResult_t::ncclInvalidArgument, "newcomm is NULL".into());
        }
        let parent = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => {
                note_error(w.id, rc);
                return rc;
            }
        };
        if exclude.is_null() || count <= 0 {
            let msg = format!("excludeRanksList must name at least one rank (count {count})");
            return fail_call(w, &mut s, ncclResult_t::ncclInvalidArgument, msg);
        }
        if flags != NCCL_SHRINK_DEFAULT as c_int && flags != NCCL_SHRINK_ABORT as c_int {
            return fail_call(w, &mut s, ncclResult_t::ncclInvalidArgument, format!("invalid shrinkFlags {flags}"));
        }
        // SAFETY: `config` is NULL or the caller's initialised config (NCCL's contract).
        let config = match unsafe { read_config(config, w.version) } {
            Ok(config) => config,
            Err(msg) => return fail_call(w, &mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: {msg}")),
        };
        let Some(c) = s.comms.get(&parent) else { return ncclResult_t::ncclInternalError };
        let (rank, size) = (c.rank, c.size);
        let mut list = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            // SAFETY: the caller passes `count` ranks (checked non-null).
            let r = unsafe { *exclude.add(i) };
            match usize::try_from(r) {
                Ok(r) if r < size && r != rank => list.push(r),
                _ => {
                    let msg = format!("rank {rank} of {size}: cannot exclude rank {r}");
                    return fail_call(w, &mut s, ncclResult_t::ncclInvalidArgument, msg);
                }
            }
        }
        list.sort_unstable();
        if let Some(d) = list.windows(2).find(|p| p[0] == p[1]) {
            // NCCL sizes the child by the list's length, so a repeated rank gives the
            // survivors a wrong size (NCCL 2.28 then fails on some ranks): refused here.
            let msg = format!("rank {rank} of {size}: rank {} is excluded twice", d[0]);
            return fail_call(w, &mut s, ncclResult_t::ncclInvalidArgument, msg);
        }
        // Like NCCL: NULL until the shrink completes.
        // SAFETY: checked non-null out-pointer.
        unsafe { *newcomm = std::ptr::null_mut() };
        start_child(w, s, CALL, parent, config, (0, rank as c_int), list, newcomm)
    }
}
