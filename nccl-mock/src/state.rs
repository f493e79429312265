//! The simulated NCCL's bookkeeping: communicators, pending inits, faults, call counts.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Weak};

use crate::clique::Clique;
use crate::config::MockConfig;
use crate::parts::Done;
use nccl_sys::{ncclDataType_t, ncclResult_t};

/// Live simulated NCCL objects; all zero when nothing leaked (see
/// [`MockNcclWorld`](crate::MockNcclWorld) for one that counts two communicators).
///
/// ```
/// use nccl_mock::LiveComms;
/// let leaked = LiveComms { comms: 1, ..LiveComms::default() };
/// assert!(!leaked.is_empty());
/// assert!(LiveComms::default().is_empty());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveComms {
    /// Communicators not destroyed or aborted.
    pub comms: usize,
    /// Pre-multiplied-sum ops not destroyed.
    pub reduction_ops: usize,
    /// Ranks waiting in an init.
    pub pending_inits: usize,
    /// Operations submitted and never matched by the peers.
    pub unmatched_operations: usize,
}

impl LiveComms {
    /// Nothing alive.
    pub fn is_empty(&self) -> bool {
        *self == LiveComms::default()
    }
}

/// A pre-multiplied-sum op: its scalar is read at each use (device) or was copied at
/// creation (host), as NCCL does.
pub(crate) struct PreMul {
    /// The device scalar's address, or the exposed address of a boxed `[u8; 8]` copy.
    pub(crate) scalar: usize,
    pub(crate) dtype: ncclDataType_t,
    pub(crate) device_resident: bool,
}

impl Drop for PreMul {
    /// Frees the host copy, also when the communicator goes with its ops still alive.
    fn drop(&mut self) {
        if !self.device_resident {
            let b = std::ptr::with_exposed_provenance_mut::<[u8; 8]>(self.scalar);
            // SAFETY: made by Box::into_raw in ncclRedOpCreatePreMulSum and owned by this
            // PreMul alone, which drops once.
            drop(unsafe { Box::from_raw(b) });
        }
    }
}

/// One rank's communicator handle.
pub(crate) struct Comm {
    /// The ranks it talks to; `None` while a deferred or non-blocking init is joining.
    pub(crate) clique: Option<Arc<Clique>>,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) device: i32,
    /// Collective sequence number: the ranks' n-th collectives match each other.
    pub(crate) seq: u64,
    /// Split sequence number, matched the same way.
    pub(crate) split_seq: u64,
    pub(crate) async_err: ncclResult_t,
    pub(crate) redops: HashMap<u32, PreMul>,
    pub(crate) next_op: u32,
    /// Non-blocking (config.blocking = 0): operations return ncclInProgress and complete
    /// in the background; ncclCommGetAsyncError reports them.
    pub(crate) blocking: bool,
    /// Operations of a non-blocking communicator not yet known to be complete.
    pub(crate) pending: Vec<Done>,
    /// The collectives among `pending`, with their numbers: a failed one's disagreement
    /// is found by its number.
    pub(crate) collectives: Vec<(Done, u64)>,
    /// The init registration of a non-blocking communicator still joining.
    pub(crate) init: Option<(Vec<u8>, usize)>,
    /// Splits and shrinks of this communicator completing in the background (a
    /// non-blocking parent): an abort waits for them, as NCCL's joins the parent's job.
    pub(crate) children: Vec<Done>,
    /// The configuration NCCL saw (`None`: made without one, e.g. `ncclCommInitRank`).
    pub(crate) config: Option<MockConfig>,
    /// `ncclCommGetAsyncError` calls left that say `ncclInProgress` whatever the state
    /// ([`crate::MockNcclWorld::slow_new_communicators`]).
    pub(crate) slow_polls: u64,
}

/// The rendezvous of one unique id's ranks.
pub(crate) struct Init {
    pub(crate) nranks: usize,
    pub(crate) devices: Vec<Option<i32>>,
    pub(crate) clique: Option<Arc<Clique>>,
    /// Ranks that picked the finished clique up; the entry goes when all have.
    pub(crate) taken: usize,
    /// Why the init cannot complete (ranks that disagree on the world size): every rank
    /// waiting in it fails with this message, instead of waiting for the deadline.
    pub(crate) failed: Option<String>,
}

/// One live registration or window.
pub(crate) struct Reg {
    pub(crate) comm: usize,
    /// The range NCCL resolves it for: whole pages for a local registration, as
    /// `ncclRegFind` looks them up.
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) window: bool,
    /// A window's place among its communicator's windows (one-sided puts reach the
    /// peers' windows of the same place) and its flags; `None` for a local registration.
    pub(crate) win: Option<crate::rma::WinPlace>,
    /// Registrations NCCL handed out as this one (`ncclCommRegister` of a range an
    /// existing registration covers returns it again, counted): released at the last.
    pub(crate) refs: usize,
    /// Where the newest work that used it stands on each stream: key -> (stamp, call).
    pub(crate) uses: HashMap<usize, (u64, String)>,
}

impl Reg {
    pub(crate) fn kind(&self) -> &'static str {
        if self.window {
            "window"
        } else {
            "registration"
        }
    }
}

/// Everything a world's NCCL functions share, behind [`NWorld::lock`].
#[derive(Default)]
pub(crate) struct State {
    pub(crate) faults: Vec<(String, u64, ncclResult_t)>,
    pub(crate) calls: HashMap<&'static str, u64>,
    pub(crate) comms: HashMap<usize, Comm>,
    pub(crate) inits: HashMap<Vec<u8>, Init>,
    pub(crate) cliques: Vec<Weak<Clique>>,
    next: usize,
    pub(crate) last_error: Option<CString>,
    pub(crate) id_counter: u64,
    /// Destroyed and aborted communicators -> the call that freed them. Handles are never
    /// reused, so a later call with one is a use after free, reported as such.
    pub(crate) dead: HashMap<usize, &'static str>,
    /// Live buffer registrations and windows, by handle.
    pub(crate) regs: HashMap<usize, Reg>,
    /// Released registrations and windows -> the call that released them.
    pub(crate) dead_regs: HashMap<usize, &'static str>,
    /// Windows registered so far per communicator (their sequence numbers).
    pub(crate) win_seq: HashMap<usize, u64>,
    /// Ranks waiting for their hub in an init of the multi-process mode.
    pub(crate) net_inits: usize,
    /// `slow_polls` of each communicator made from now on.
    pub(crate) slow_new_comms: u64,
    /// `slow_polls` a non-blocking communicator's registration or window registration
    /// sets (it then answers ncclInProgress); 0: registrations complete at once.
    pub(crate) slow_registrations: u64,
    /// Grows of each communicator so far, and whether its coordinator's grow id is not
    /// consumed yet (`ncclCommGetUniqueId` then `ncclCommGrow`).
    pub(crate) grows: HashMap<usize, (u64, bool)>,
    /// Grow ids whose ranks disagreed on the size -> why: their late ranks fail alike.
    pub(crate) failed_grows: HashMap<Vec<u8>, String>,
    /// Communicators suspended by `ncclCommSuspend(NCCL_SUSPEND_MEM)` (suspend.rs).
    pub(crate) suspended: std::collections::HashSet<usize>,
    /// Per communicator, the newest op of its work on each stream (key -> stamp, call),
    /// recorded when the work runs: a suspend checks the host waited for each.
    pub(crate) comm_uses: HashMap<usize, HashMap<usize, (u64, String)>>,
}

impl State {
    /// Counts a call of `function` and returns the injected fault it hits, if any.
    pub(crate) fn enter(&mut self, function: &'static str) -> Option<ncclResult_t> {
        *self.calls.entry(function).or_insert(0) += 1;
        let i = self.faults.iter().position(|f| f.0 == function)?;
        if self.faults[i].1 > 0 {
            self.faults[i].1 -= 1;
            return None;
        }
        let rc = self.faults.remove(i).2;
        self.error(format!("{function}: injected fault"));
        Some(rc)
    }

    /// Sets the text `ncclGetLastError` returns.
    pub(crate) fn error(&mut self, msg: String) {
        self.last_error = CString::new(msg).ok();
    }

    /// A fresh handle value: the world id in the high bits keeps handles of different
    /// worlds apart, and the counter never repeats, so a freed handle is never reused.
    pub(crate) fn handle(&mut self, world: u64) -> usize {
        self.next += 1;
        ((world as usize) << 24) | (self.next << 4)
    }

    /// Removes communicator `h`, remembering `by` (the freeing call) for later misuse.
    pub(crate) fn free_comm(&mut self, h: usize, by: &'static str) -> Option<Comm> {
        let c = self.comms.remove(&h)?;
        self.dead.insert(h, by);
        Some(c)
    }

    /// Live communicators, reduction ops, pending inits and unmatched operations.
    pub(crate) fn live(&self) -> LiveComms {
        LiveComms {
            comms: self.comms.len(),
            reduction_ops: self.comms.values().map(|c| c.redops.len()).sum(),
            pending_inits: self
                .inits
                .values()
                .map(|i| i.devices.iter().flatten().count() - i.taken)
                .sum::<usize>()
                + self.net_inits,
            unmatched_operations: self
                .cliques
                .iter()
                .filter_map(Weak::upgrade)
                .map(|c| c.pending())
                .sum(),
        }
    }
}

/// Records `msg` as the last error and returns `rc`.
pub(crate) fn fail(s: &mut State, rc: ncclResult_t, msg: String) -> ncclResult_t {
    s.error(msg);
    rc
}
