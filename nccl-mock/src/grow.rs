//! Growing a communicator (`ncclCommGetUniqueId`, `ncclCommGrow`, 2.29.2) and the init
//! with several unique ids (`ncclCommInitRankScalable`, 2.23).
//!
//! As NCCL does: one existing rank, the coordinator, makes the grow id with
//! `ncclCommGetUniqueId(comm)`, which hands it to the communicator's other ranks (NCCL's
//! `bcastGrowHandle`; here the clique's board, across processes the hub) and to nobody
//! else: the caller gives it to the new ranks out of band. Existing ranks call
//! `ncclCommGrow(comm, nRanks, id or NULL, -1, ..)` and keep their rank; new ranks call
//! `ncclCommGrow(NULL, nRanks, &id, rank, ..)` with a rank from the old size on. The
//! grown communicator is a new one (the old one stays usable and is destroyed by its
//! owner); every rank meets at the grow id as an init does, so ranks that disagree on
//! `nRanks` all fail with the same error (`ncclInvalidArgument` in one process,
//! `ncclInvalidUsage` at a hub, as for inits), late ones included, instead of hanging.
//!
//! Stricter than NCCL, as a sanitizer: a second `ncclCommGetUniqueId` before the
//! coordinator's grow consumed the first is `ncclInvalidUsage` (the header's rule), and a
//! new rank below the old size is `ncclInvalidArgument` (the old size travels in the id).

use std::ffi::{c_char, c_int};
use std::time::Instant;

use crate::config::{MockConfig, read as read_config};
use crate::grow_id::{GROW_MARK, old_size};
use crate::init::{current_device, fresh_id, init_rank_key};
use crate::macros::mock_fns;
use crate::state::fail;
use crate::thread_groups::note_error;
use crate::world::NWorld;
use nccl_sys::*;

fn bytes_of(id: &ncclUniqueId) -> Vec<u8> {
    id.internal.iter().map(|&c| c as u8).collect()
}

/// An argument error: the last error, and the group's error inside a group.
fn refuse(w: &NWorld, rc: ncclResult_t, msg: String) -> ncclResult_t {
    note_error(w.id, rc);
    fail(&mut w.lock(), rc, msg)
}

/// An existing rank's grow: it takes the coordinator's id (given, or from the board for
/// its grow number) and joins the grown communicator with its own rank on its device.
fn grow_existing(
    w: &NWorld,
    comm: ncclComm_t,
    nranks: c_int,
    id: Option<Vec<u8>>,
    newcomm: *mut ncclComm_t,
    config: Option<MockConfig>,
) -> ncclResult_t {
    const CALL: &str = "ncclCommGrow";
    let mut s = w.lock();
    let h = match s.check_comm(w, CALL, comm) {
        Ok(h) => h,
        Err(rc) => {
            note_error(w.id, rc);
            return rc;
        }
    };
    let Some(c) = s.comms.get(&h) else {
        return ncclResult_t::ncclInternalError;
    };
    let (rank, size, device) = (c.rank, c.size, c.device);
    let Some(clique) = c.clique.clone() else {
        drop(s);
        let msg = format!("{CALL}: the parent communicator is not initialised yet");
        return refuse(w, ncclResult_t::ncclInvalidUsage, msg);
    };
    // Like NCCL: a NULL config inherits the parent's configuration.
    let config = config.or_else(|| c.config.clone());
    if (nranks as usize) <= size {
        drop(s);
        let msg = format!("{CALL}: total ranks {nranks} is less than current ranks {size}");
        return refuse(w, ncclResult_t::ncclInvalidArgument, msg);
    }
    let grow = s.grows.entry(h).or_default();
    grow.0 += 1;
    let seq = grow.0;
    if id.is_some() {
        // The coordinator's grow consumes its id.
        grow.1 = false;
    }
    drop(s);
    let key = match id {
        Some(id) => id,
        None => match clique.grow_id(seq, Instant::now() + w.timeout) {
            Some(id) => id,
            None => {
                let msg = format!(
                    "{CALL}: rank {rank} of {size}: no coordinator published the id of grow \
                     {seq} (ncclCommGetUniqueId on one rank of this communicator) within {:?}",
                    w.timeout
                );
                return refuse(w, ncclResult_t::ncclSystemError, msg);
            }
        },
    };
    init_rank_key(w, newcomm, (nranks, rank as c_int), key, config, device)
}

mock_fns! {
    fn ncclCommGetUniqueId = comm_get_unique_id(w, s, comm: ncclComm_t, id: *mut ncclUniqueId) {
        let h = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        if id.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: uniqueId is NULL"));
        }
        if std::env::var("NCCL_COMM_ID").is_ok_and(|v| !v.is_empty()) {
            let msg = format!("{CALL} should not be called when NCCL_COMM_ID is set");
            return fail(&mut s, ncclResult_t::ncclInvalidUsage, msg);
        }
        let Some(c) = s.comms.get(&h) else { return ncclResult_t::ncclInternalError };
        let size = c.size;
        let Some(clique) = c.clique.clone() else {
            let msg = format!("{CALL}: the communicator is not initialised yet");
            return fail(&mut s, ncclResult_t::ncclInvalidUsage, msg);
        };
        let (done, pending) = s.grows.get(&h).copied().unwrap_or_default();
        if pending {
            let msg = format!(
                "{CALL}: the previous grow id of this communicator is not consumed yet (its \
                 ncclCommGrow has not been called)"
            );
            return fail(&mut s, ncclResult_t::ncclInvalidUsage, msg);
        }
        let mut bytes = match fresh_id(w, &mut s) {
            Ok(b) => b,
            Err(msg) => return fail(&mut s, ncclResult_t::ncclSystemError, format!("{CALL}: {msg}")),
        };
        bytes[120..124].copy_from_slice(GROW_MARK);
        bytes[124..128].copy_from_slice(&(size as u32).to_le_bytes());
        s.grows.insert(h, (done, true));
        drop(s);
        clique.publish_grow_id(done + 1, &bytes);
        // SAFETY: checked non-null out-pointer.
        unsafe { (*id).internal = bytes.map(|b| b as c_char) };
        ncclResult_t::ncclSuccess
    }
    fn ncclCommGrow = comm_grow(w, s, comm: ncclComm_t, nranks: c_int, id: *const ncclUniqueId, rank: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) {
        if newcomm.is_null() {
            note_error(w.id, ncclResult_t::ncclInvalidArgument);
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: newcomm is NULL"));
        }
        // SAFETY: checked non-null out-pointer; NULL until the grow completes.
        unsafe { *newcomm = std::ptr::null_mut() };
        if nranks <= 0 {
            note_error(w.id, ncclResult_t::ncclInvalidArgument);
            let msg = format!("{CALL}: total ranks must be positive, got {nranks}");
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, msg);
        }
        // SAFETY: `config` is NULL or the caller's initialised config (NCCL's contract).
        let config = match unsafe { read_config(config, w.version) } {
            Ok(config) => config,
            Err(msg) => {
                note_error(w.id, ncclResult_t::ncclInvalidArgument);
                return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: {msg}"));
            }
        };
        // SAFETY: `id` is NULL or points to the caller's id (NCCL's contract).
        let given = (!id.is_null()).then(|| bytes_of(unsafe { &*id }));
        drop(s);
        if !comm.is_null() {
            if rank != -1 {
                let msg = format!("{CALL}: existing ranks must pass rank=-1, got {rank}");
                return refuse(w, ncclResult_t::ncclInvalidArgument, msg);
            }
            return grow_existing(w, comm, nranks, given, newcomm, config);
        }
        let Some(key) = given else {
            let msg = format!("{CALL}: new ranks must pass non-NULL uniqueId");
            return refuse(w, ncclResult_t::ncclInvalidArgument, msg);
        };
        if rank < 0 || rank >= nranks {
            let msg = format!("{CALL}: new rank {rank} is not in 0..{nranks}");
            return refuse(w, ncclResult_t::ncclInvalidArgument, msg);
        }
        if let Some(old) = old_size(&key).filter(|&old| (rank as usize) < old) {
            let msg = format!(
                "{CALL}: new rank {rank} is an existing rank's; new ranks start at the old size {old}"
            );
            return refuse(w, ncclResult_t::ncclInvalidArgument, msg);
        }
        init_rank_key(w, newcomm, (nranks, rank), key, config, current_device(w))
    }
    fn ncclCommInitRankScalable = comm_init_rank_scalable(w, s, newcomm: *mut ncclComm_t, nranks: c_int, rank: c_int, nid: c_int, ids: *mut ncclUniqueId, config: *mut ncclConfig_t) {
        if ids.is_null() || nid < 1 || nid > nranks.max(1) {
            let msg = format!("{CALL}: {nid} unique ids for {nranks} ranks (1 to one per rank)");
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, msg);
        }
        // SAFETY: `config` is NULL or the caller's initialised config (NCCL's contract).
        let config = match unsafe { read_config(config, w.version) } {
            Ok(config) => config,
            Err(msg) => return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: {msg}")),
        };
        // Every rank passes the same ids in the same order: they meet at all of them (in
        // the multi-process mode at the first one's hub).
        let key: Vec<u8> = (0..nid as usize)
            .flat_map(|i| {
                // SAFETY: the caller passes `nid` ids (checked non-null).
                bytes_of(unsafe { &*ids.add(i) })
            })
            .collect();
        drop(s);
        init_rank_key(w, newcomm, (nranks, rank), key, config, current_device(w))
    }
}
