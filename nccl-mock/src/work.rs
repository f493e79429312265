//! A rank's checked call, ready to run (Work, and the Part it hands its clique), with the registrations it resolves at the call and admits when it runs: below the groups that defer it and the collectives that make it.

use std::sync::Arc;

use cuda_mock::{MockWorld, Touch};

use crate::clique::Clique;
use crate::parts::{Contrib, Done};
use crate::state::{State, fail};
use crate::world::NWorld;
use nccl_sys::{cudaStream_t, ncclDataType_t, ncclResult_t};

/// What one rank contributes to its clique.
pub(crate) enum Part {
    Coll {
        clique: Arc<Clique>,
        seq: u64,
        rank: usize,
        c: Contrib,
    },
    P2p {
        clique: Arc<Clique>,
        is_send: bool,
        src: usize,
        dst: usize,
        ptr: usize,
        count: usize,
        dtype: ncclDataType_t,
    },
    /// A one-sided operation (put, signal or wait).
    Rma {
        clique: Arc<Clique>,
        op: crate::rma::Rma1,
    },
}

impl Part {
    pub(crate) fn clique(&self) -> &Arc<Clique> {
        match self {
            Part::Coll { clique, .. } | Part::P2p { clique, .. } | Part::Rma { clique, .. } => {
                clique
            }
        }
    }

    /// The part's call and rank, for a wait notice: "ncclAllReduce of rank 0 of 2".
    pub(crate) fn describe(&self, call: &str) -> String {
        match self {
            Part::Coll { clique, rank, .. } => format!("{call} of rank {rank} of {}", clique.size),
            Part::P2p { src, dst, .. } => format!("{call} from rank {src} to rank {dst}"),
            Part::Rma { op, .. } => op.describe(call),
        }
    }

    /// Its number among its communicator's collectives, for a collective.
    pub(crate) fn seq(&self) -> Option<u64> {
        match self {
            Part::Coll { seq, .. } => Some(*seq),
            Part::P2p { .. } | Part::Rma { .. } => None,
        }
    }

    /// How the ranks disagreed on this collective, if they did.
    pub(crate) fn disagreement(&self) -> Option<String> {
        match self {
            Part::Coll { clique, seq, .. } => clique.disagreement(*seq),
            Part::P2p { .. } | Part::Rma { .. } => None,
        }
    }

    /// Hands the part to the clique (the last part of a collective runs it, on `cuda`'s
    /// device memory).
    pub(crate) fn start(&self, cuda: &MockWorld) -> Done {
        match self {
            Part::Coll {
                clique,
                seq,
                rank,
                c,
            } => clique.submit(cuda, *seq, *rank, *c),
            Part::P2p {
                clique,
                is_send,
                src,
                dst,
                ptr,
                count,
                dtype,
            } => clique.post(cuda, *is_send, *src, *dst, *ptr, *count, *dtype),
            Part::Rma { clique, op } => op.start(&**clique, cuda),
        }
    }

    /// Takes the part's place without doing it, so the peers fail rather than wait.
    pub(crate) fn withdraw(&self) {
        match self {
            Part::Coll {
                clique,
                seq,
                rank,
                c,
            } => drop(clique.withdraw(*seq, *rank, *c)),
            Part::P2p {
                clique,
                is_send,
                src,
                dst,
                count,
                dtype,
                ..
            } => drop(clique.withdraw_p2p(*is_send, *src, *dst, *count, *dtype)),
            Part::Rma { clique, op } => op.withdraw(&**clique),
        }
    }
}

/// One rank's call, checked and ready to run: what it touches, where, and for whom.
pub(crate) struct Work {
    /// The C name, for reports.
    pub(crate) call: &'static str,
    pub(crate) comm: usize,
    pub(crate) stream: cudaStream_t,
    pub(crate) touches: Vec<Touch>,
    /// The registrations and windows NCCL resolved for the buffers at the call.
    pub(crate) regs: Vec<usize>,
    pub(crate) part: Part,
}

// SAFETY: the stream is a handle value of the simulated driver (no pointer is followed
// through it), and the part holds shared clique state that is `Send`; work deferred by a
// group may finish on a background thread, as a non-blocking communicator's does.
unsafe impl Send for Work {}

impl Work {
    /// The communicator handle the work belongs to.
    pub(super) fn comm(&self) -> usize {
        self.comm
    }

    /// The sanitizer's checks for work that runs now outside the stream machinery (a
    /// group's end, a non-blocking communicator): the communicator must still be alive
    /// and the ranges valid; the ranges are recorded as uses on the stream. A refused
    /// part is withdrawn and `Err` holds `ncclUnhandledCudaError`.
    pub(crate) fn admit(&self, w: &NWorld, call: &str) -> Result<(), ncclResult_t> {
        let (dead, suspended) = {
            let mut s = w.lock();
            let suspended = s.refuse_suspended(w, call, self.comm).is_err();
            (s.dead.get(&self.comm).copied(), suspended)
        };
        let refused = suspended
            || match dead {
                Some(by) => {
                    let comm = self.comm;
                    w.cuda
                        .report(format!("{call}: communicator {comm:#x} was freed by {by}"));
                    true
                }
                None => {
                    let illegal = w.cuda.access(self.stream, call, &self.touches).is_err();
                    // Where it stands on its stream once stamped (after the access).
                    let pos = w.cuda.stream_position(self.stream);
                    note_comm_use(w, self.comm, call, pos);
                    illegal || !admit(w, call, &self.regs, pos)
                }
            };
        if refused {
            self.part.withdraw();
            let msg = format!("{call}: refused by the sanitizer (see the mock's violations)");
            return Err(fail(
                &mut w.lock(),
                ncclResult_t::ncclUnhandledCudaError,
                msg,
            ));
        }
        Ok(())
    }

    /// Drops the call of a communicator aborted before its background work ran: NCCL's
    /// abort stops its jobs (they watch the abort flag), so none of it runs; its peers
    /// fail rather than wait.
    pub(super) fn cancel(self) {
        self.part.withdraw();
    }

    /// Runs a grouped call at `ncclGroupEnd` (reports name both): its part's clique and
    /// completion, once admitted.
    pub(super) fn start_grouped(self, w: &NWorld) -> Result<(Arc<Clique>, Done), ncclResult_t> {
        self.admit(w, &format!("ncclGroupEnd: {}", self.call))?;
        let done = self.part.start(&w.cuda);
        Ok((self.part.clique().clone(), done))
    }
}

/// The live registrations and windows of `comm` that overlap any of `ranges`.
pub(super) fn overlapping(s: &State, comm: usize, ranges: &[(u64, usize)]) -> Vec<usize> {
    if s.regs.is_empty() {
        return Vec::new();
    }
    let mut v: Vec<usize> = s
        .regs
        .iter()
        .filter(|(_, r)| {
            r.comm == comm
                && ranges
                    .iter()
                    .any(|&(p, n)| n > 0 && p < r.ptr + r.len as u64 && r.ptr < p + n as u64)
        })
        .map(|(h, _)| *h)
        .collect();
    v.sort_unstable();
    v
}

/// Work of communicator `comm` runs now at `pos` (stream key, stamp): a later suspend
/// checks that the host waited for it.
pub(crate) fn note_comm_use(w: &NWorld, comm: usize, call: &str, pos: Option<(usize, u64)>) {
    if let Some((key, stamp)) = pos {
        w.lock()
            .comm_uses
            .entry(comm)
            .or_default()
            .insert(key, (stamp, call.to_string()));
    }
}

/// Work that resolved `regs` at enqueue runs now: each must still be live (reported
/// otherwise, and `false`). With `pos` (where the work stands on its stream: key and
/// stamp), each records the use, for the checks of a later deregistration.
pub(super) fn admit(w: &NWorld, call: &str, regs: &[usize], pos: Option<(usize, u64)>) -> bool {
    if regs.is_empty() {
        return true;
    }
    let mut s = w.lock();
    let mut ok = true;
    for h in regs {
        match s.regs.get_mut(h) {
            Some(r) => {
                if let Some((key, stamp)) = pos {
                    r.uses.insert(key, (stamp, call.to_string()));
                }
            }
            None => {
                let by = s
                    .dead_regs
                    .get(h)
                    .copied()
                    .unwrap_or("its communicator's end");
                w.cuda.report(format!(
                    "{call}: buffer registration {h:#x} was released by {by} before the work ran"
                ));
                ok = false;
            }
        }
    }
    ok
}
