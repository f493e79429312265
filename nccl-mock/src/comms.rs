//! Communicator handles as calls meet them: a new one, and a call's argument checked (live, freed, or NULL while the thread's group has splits pending); State methods above the world and the thread's groups they consult.

use std::collections::HashMap;
use std::sync::Arc;

use crate::clique::Clique;
use crate::handle::p2h;
use crate::state::{Comm, State};
use crate::thread_groups::children_pending;
use crate::world::NWorld;
use nccl_sys::{ncclComm_t, ncclResult_t};

impl State {
    /// The handle of `comm` if it is a live communicator. A freed one is a use after free:
    /// reported to the sanitizer as `{call}: communicator 0x.. was freed by ncclCommAbort`.
    /// Either way a bad handle is `ncclInvalidArgument`, with the reason as last error.
    pub(crate) fn check_comm(
        &mut self,
        w: &NWorld,
        call: &str,
        comm: ncclComm_t,
    ) -> Result<usize, ncclResult_t> {
        let h = p2h(comm);
        if self.comms.contains_key(&h) {
            return Ok(h);
        }
        let msg = match self.dead.get(&h) {
            Some(by) => {
                let m = format!("{call}: communicator {h:#x} was freed by {by}");
                w.cuda.report(m.clone());
                m
            }
            // A NULL handle while this thread's group has splits or shrinks pending: the
            // handle was read before the group ended, when NCCL writes it.
            None if h == 0 && children_pending(w.id) => {
                let m = format!(
                    "{call}: communicator NULL: a split or shrink inside a group gives its \
                     new communicator only when the group ends (read it after ncclGroupEnd)"
                );
                w.cuda.report(m.clone());
                m
            }
            None => format!("{call}: invalid communicator {h:#x}"),
        };
        self.error(msg);
        Err(ncclResult_t::ncclInvalidArgument)
    }

    /// The live communicator `comm` ([`State::check_comm`]).
    pub(crate) fn comm_mut(
        &mut self,
        w: &NWorld,
        call: &str,
        comm: ncclComm_t,
    ) -> Result<&mut Comm, ncclResult_t> {
        let h = self.check_comm(w, call, comm)?;
        self.comms
            .get_mut(&h)
            .ok_or(ncclResult_t::ncclInternalError)
    }

    /// Registers a new communicator and returns its handle.
    pub(crate) fn new_comm(
        &mut self,
        w: &NWorld,
        clique: Option<Arc<Clique>>,
        rank: usize,
        size: usize,
        device: i32,
    ) -> usize {
        let h = self.handle(w.id);
        self.comms.insert(
            h,
            Comm {
                clique,
                rank,
                size,
                device,
                seq: 0,
                split_seq: 0,
                async_err: ncclResult_t::ncclSuccess,
                redops: HashMap::new(),
                next_op: 0,
                blocking: true,
                pending: Vec::new(),
                collectives: Vec::new(),
                init: None,
                children: Vec::new(),
                config: None,
                slow_polls: self.slow_new_comms,
            },
        );
        h
    }
}
