//! A shrink across processes (`ncclCommShrink` in the multi-process mode), e.g. after a
//! peer's process died: the survivors form a new communicator at a new hub.
//!
//! NCCL builds the child over the parent's bootstrap among the ranks not excluded. Here
//! the lowest surviving rank (the child's rank 0) starts the child's hub and publishes
//! its id to the parent's ranks through the parent's hub (the board a grow's id travels
//! on, numbered apart from grows); every survivor then joins it with its new rank (its
//! place among the survivors, ranks keeping their order). An excluded rank takes no
//! part, so a dead one does not hold the survivors up.
//!
//! The child is complete when the call returns (also for a non-blocking parent: NCCL may
//! answer `ncclSuccess` there too), so its parent's asynchronous state, which reports the
//! dead peer, is never what a shrink waits on. Survivors that disagree on the exclusions
//! disagree on the child's size and fail at its hub as an init's ranks do. Inside a group
//! (several local ranks shrinking together) it is refused: one process drives one rank
//! here.

use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use crate::clique::Clique;
use crate::config::MockConfig;
use crate::handle::h2p;
use crate::rendezvous::{join_init, new_hub_id};
use crate::state::{State, fail};
use crate::thread_groups::{in_group, note_error};
use crate::world::NWorld;
use nccl_sys::{ncclComm_t, ncclResult_t};

/// Board numbers of shrink ids: apart from the grows' (1, 2, ...).
const SHRINK_BOARD: u64 = 1 << 62;

/// What the child of a shrink gets from its parent's call.
pub(crate) struct Child {
    pub(crate) blocking: bool,
    pub(crate) config: Option<MockConfig>,
}

/// Shrinks `parent` (whose clique is networked) to the ranks not in `excluded` (checked
/// by the caller: sorted, in range, not this rank) and writes the child to `newcomm`.
pub(crate) fn shrink(
    w: &NWorld,
    mut s: MutexGuard<'_, State>,
    (call, parent, clique): (&'static str, usize, Arc<Clique>),
    child: Child,
    excluded: &[usize],
    newcomm: *mut ncclComm_t,
) -> ncclResult_t {
    if in_group(w.id) {
        note_error(w.id, ncclResult_t::ncclInvalidUsage);
        let msg = format!(
            "{call}: a grouped shrink is not simulated across processes (one rank per process)"
        );
        return fail(&mut s, ncclResult_t::ncclInvalidUsage, msg);
    }
    let Some(c) = s.comms.get_mut(&parent) else {
        return ncclResult_t::ncclInternalError;
    };
    let (seq, rank, size, device) = (c.split_seq, c.rank, c.size, c.device);
    c.split_seq += 1;
    let survivors: Vec<usize> = (0..size).filter(|r| !excluded.contains(r)).collect();
    let Some(new_rank) = survivors.iter().position(|&r| r == rank) else {
        return ncclResult_t::ncclInternalError;
    };
    drop(s);
    let board = SHRINK_BOARD | seq;
    let key = if new_rank == 0 {
        match new_hub_id(w) {
            Ok(id) => {
                clique.publish_grow_id(board, &id);
                id.to_vec()
            }
            Err(msg) => {
                let msg = format!("{call}: {msg}");
                return fail(&mut w.lock(), ncclResult_t::ncclSystemError, msg);
            }
        }
    } else {
        match clique.grow_id(board, Instant::now() + w.timeout) {
            Some(id) => id,
            None => {
                let msg = format!(
                    "{call}: rank {rank} of {size}: the lowest surviving rank {} published no \
                     id for shrink {seq} within {:?} (it did not shrink, or this rank's \
                     connection is gone)",
                    survivors[0], w.timeout
                );
                return fail(&mut w.lock(), ncclResult_t::ncclSystemError, msg);
            }
        }
    };
    child.join(w, &key, (survivors.len(), new_rank), device, newcomm)
}

impl Child {
    /// Joins the child's hub named by `id` as `rank` of `n` on `device`, and writes the new
    /// communicator to `newcomm`: the last step of a shrink or split across processes.
    pub(crate) fn join(
        self,
        w: &NWorld,
        id: &[u8],
        (n, rank): (usize, usize),
        device: i32,
        newcomm: *mut ncclComm_t,
    ) -> ncclResult_t {
        match join_init(w, id, n, rank, device, None) {
            Ok(clique) => {
                let mut s = w.lock();
                let h = s.new_comm(w, Some(clique), rank, n, device);
                if let Some(c) = s.comms.get_mut(&h) {
                    c.blocking = self.blocking;
                    c.config = self.config;
                }
                // SAFETY: the caller's checked non-null out-pointer (NCCL's contract: valid
                // until the shrink or split completes, which is now).
                unsafe { *newcomm = h2p(h) };
                ncclResult_t::ncclSuccess
            }
            Err(rc) => rc,
        }
    }
}
