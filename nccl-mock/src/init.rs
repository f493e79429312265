//! Communicator lifecycle: unique ids, init (by rank, with a config, all at once),
//! finalize, destroy, abort and split.
//!
//! Ranks of one unique id meet in a rendezvous (`State::inits`, joined in
//! [`crate::rendezvous`]); once all have come they share one [`Clique`]. Blocking inits
//! wait for it in the call; non-blocking inits and inits inside a group join from a
//! background thread.

use std::ffi::{c_char, c_int};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::clique::Clique;
use crate::config::{MockConfig, read as read_config};
use crate::handle::h2p;
use crate::macros::mock_fns;
use crate::parts::Done;
use crate::rendezvous::{Split, finish_init, finish_split, join_init, new_hub_id};
use crate::state::{State, fail};
use crate::thread_groups::{Deferred, defer, group_mode, in_group, note_error};
use crate::world::{NWorld, slot_of};
use nccl_sys::*;

/// The device of the calling thread's current context, as NCCL's init uses.
pub(crate) fn current_device(w: &NWorld) -> i32 {
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
    let key: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    init_rank_key(w, out, (nranks, rank), key, config, current_device(w))
}

/// An init by rank whose ranks meet at `key` (one unique id's bytes, or several ids' of a
/// scalable init, or a grow id), on `device`: in a group it is deferred to the group's
/// end, non-blocking it joins in the background, else it joins now.
pub(crate) fn init_rank_key(
    w: &NWorld,
    out: *mut ncclComm_t,
    (nranks, rank): (c_int, c_int),
    key: Vec<u8>,
    config: Option<MockConfig>,
    device: i32,
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
    if clique.is_networked() && call == "ncclCommShrink" {
        let child = crate::net::shrink::Child {
            blocking: child_blocking,
            config: child_config,
        };
        return crate::net::shrink::shrink(w, s, (call, parent, clique), child, &excluded, newcomm);
    }
    if clique.is_networked() {
        let child = crate::net::shrink::Child {
            blocking: child_blocking,
            config: child_config,
        };
        return crate::net::split::split(
            w,
            s,
            (call, parent, clique),
            child,
            (color, key),
            newcomm,
        );
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

/// A new id not derived from `NCCL_COMM_ID`: in the multi-process mode a hub for its
/// ranks (NCCL's bootstrap root), whose address the id names; else a fresh in-process key.
pub(crate) fn fresh_id(w: &NWorld, s: &mut State) -> Result<[u8; 128], String> {
    if w.multi_process {
        return new_hub_id(w);
    }
    let mut bytes = [0u8; 128];
    s.id_counter += 1;
    bytes[..8].copy_from_slice(b"MOCKNCCL");
    bytes[8..16].copy_from_slice(&w.id.to_le_bytes());
    bytes[16..24].copy_from_slice(&s.id_counter.to_le_bytes());
    bytes[24..32].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    Ok(bytes)
}

mock_fns! {
    fn ncclGetUniqueId = get_unique_id(w, s, id: *mut ncclUniqueId) {
        if id.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, "uniqueId is NULL".into());
        }
        let bytes = match std::env::var("NCCL_COMM_ID") {
            // Like NCCL: with NCCL_COMM_ID every call gives the same id (the address).
            Ok(addr) if !addr.is_empty() => {
                let mut bytes = [0u8; 128];
                bytes[..8].copy_from_slice(b"MOCKADDR");
                let a = addr.as_bytes();
                let n = a.len().min(120);
                bytes[8..8 + n].copy_from_slice(&a[..n]);
                bytes
            }
            _ => match fresh_id(w, &mut s) {
                Ok(bytes) => bytes,
                Err(msg) => {
                    return fail(&mut s, ncclResult_t::ncclSystemError, format!("{CALL}: {msg}"));
                }
            },
        };
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
