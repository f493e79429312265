//! A split across processes (`ncclCommSplit` in the multi-process mode): the ranks of
//! each color form a new communicator at a new hub.
//!
//! NCCL all-gathers every rank's color and key over the parent's bootstrap. Here each
//! rank publishes its color and key on the parent's hub board (the board a grow's id
//! travels on, numbered apart from grows and shrinks) and reads every other rank's; the
//! ranks of one color are then ordered by key, then by parent rank. The first of them (the
//! child's rank 0) starts the child's hub and publishes its id on the board; the others
//! join it with their new ranks. A `NCCL_SPLIT_NOCOLOR` rank publishes, so that the others
//! can count without it, and gets no child.
//!
//! The child is complete when the call returns (also for a non-blocking parent: NCCL may
//! answer `ncclSuccess` there too). A rank that never splits holds the others up until the
//! simulated timeout, after which they fail with a system error, as an init's ranks do.
//! Inside a group (several local ranks splitting together) it is refused: one process
//! drives one rank here.

use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use crate::clique::Clique;
use crate::net::shrink::Child;
use crate::rendezvous::new_hub_id;
use crate::state::{State, fail};
use crate::thread_groups::{in_group, note_error};
use crate::world::NWorld;
use nccl_sys::{NCCL_SPLIT_NOCOLOR, ncclComm_t, ncclResult_t};

/// Board numbers of a rank's color and key in split `seq`: `COLORS | seq << 24 | rank`.
const COLORS: u64 = 1 << 61;
/// Board numbers of a split's child ids: `IDS | seq << 32 | color`.
const IDS: u64 = 1 << 60;

/// The ranks of `color` in the child, in their new order: by key, then by parent rank.
fn members(all: &[(i32, i32)], color: i32) -> Vec<usize> {
    let mut m: Vec<usize> = (0..all.len()).filter(|&r| all[r].0 == color).collect();
    m.sort_by_key(|&r| (all[r].1, r));
    m
}

/// A rank's color and key as the board carries them.
fn encode(color: i32, key: i32) -> Vec<u8> {
    let mut v = color.to_le_bytes().to_vec();
    v.extend_from_slice(&key.to_le_bytes());
    v
}

fn decode(bytes: &[u8]) -> Option<(i32, i32)> {
    let color = i32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
    let key = i32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    Some((color, key))
}

/// Splits `parent` (whose clique is networked) by `color` and `key` and writes the child
/// (or NULL for `NCCL_SPLIT_NOCOLOR`) to `newcomm`.
pub(crate) fn split(
    w: &NWorld,
    mut s: MutexGuard<'_, State>,
    (call, parent, clique): (&'static str, usize, Arc<Clique>),
    child: Child,
    (color, key): (i32, i32),
    newcomm: *mut ncclComm_t,
) -> ncclResult_t {
    if in_group(w.id) {
        note_error(w.id, ncclResult_t::ncclInvalidUsage);
        let msg = format!(
            "{call}: a grouped split is not simulated across processes (one rank per process)"
        );
        return fail(&mut s, ncclResult_t::ncclInvalidUsage, msg);
    }
    let Some(c) = s.comms.get_mut(&parent) else {
        return ncclResult_t::ncclInternalError;
    };
    let (seq, rank, size, device) = (c.split_seq, c.rank, c.size, c.device);
    c.split_seq += 1;
    drop(s);
    if size >= 1 << 24 || seq >= 1 << 28 {
        let msg = format!("{call}: split {seq} of {size} ranks is past what the board numbers");
        return fail(&mut w.lock(), ncclResult_t::ncclInternalError, msg);
    }
    clique.publish_grow_id(COLORS | seq << 24 | rank as u64, &encode(color, key));
    let deadline = Instant::now() + w.timeout;
    let mut all = Vec::with_capacity(size);
    for r in 0..size {
        match clique
            .grow_id(COLORS | seq << 24 | r as u64, deadline)
            .as_deref()
            .and_then(decode)
        {
            Some(ck) => all.push(ck),
            None => {
                let msg = format!(
                    "{call}: rank {rank} of {size}: rank {r} did not take part in split {seq} \
                     within {:?} (it did not split, or this rank's connection is gone)",
                    w.timeout
                );
                return fail(&mut w.lock(), ncclResult_t::ncclSystemError, msg);
            }
        }
    }
    if color == NCCL_SPLIT_NOCOLOR {
        // SAFETY: the caller's checked non-null out-pointer.
        unsafe { *newcomm = std::ptr::null_mut() };
        return ncclResult_t::ncclSuccess;
    }
    let ranks = members(&all, color);
    let (Some(new_rank), Some(&first)) = (ranks.iter().position(|&r| r == rank), ranks.first())
    else {
        return ncclResult_t::ncclInternalError;
    };
    let board = IDS | seq << 32 | u64::from(color as u32);
    let id = if new_rank == 0 {
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
        match clique.grow_id(board, deadline) {
            Some(id) => id,
            None => {
                let msg = format!(
                    "{call}: rank {rank} of {size}: rank {first}, the first of color {color}, \
                     published no id for split {seq} within {:?}",
                    w.timeout
                );
                return fail(&mut w.lock(), ncclResult_t::ncclSystemError, msg);
            }
        }
    };
    child.join(w, &id, (ranks.len(), new_rank), device, newcomm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_of_a_color_are_ordered_by_key_then_rank() {
        let all = [(1, 0), (0, 5), (1, -1), (0, 5), (NCCL_SPLIT_NOCOLOR, 0)];
        assert_eq!(members(&all, 1), [2, 0]);
        assert_eq!(members(&all, 0), [1, 3]);
        assert_eq!(members(&all, 7), Vec::<usize>::new());
        assert_eq!(decode(&encode(-1, 7)), Some((-1, 7)));
        assert_eq!(decode(&[0; 7]), None);
    }
}
