//! One-sided operations among the ranks of one process (`ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`, NCCL ≥ 2.29): where each rank's windows are, and the signals that
//! arrived and the waits for them.
//!
//! A put reaches the peer's window of the same place (its communicator's n-th window,
//! the symmetric layout NCCL gives): its data lands in that window through the driver's
//! checked [`MockWorld::write_device`], then the peer's signal from this rank counts one
//! more, in program order per (peer, sender) as NCCL orders them. A window its owner has
//! released takes no data (NCCL's peers keep their mapping of its memory, which nobody
//! reads any more), but the signal still counts. A wait completes once every signal it
//! asks for has arrived, and consumes them; until then it is pending, and the deadline of
//! whoever waits for it ends it (a timeout, not a hang). A rank aborted, or a put or
//! signal withdrawn by the sanitizer, fails the waits that need it with
//! `ncclRemoteError`.
//!
//! Across simulated processes the sender reads its source through its own driver and
//! ships the bytes to its hub, which forwards them to the peer's process; there the
//! link's reader hands them to [`Rma::arrive`], which writes them into the peer's window
//! through that process's driver (checked to fit the window, reported otherwise) and
//! counts the signal, in the order the sender issued them. A put for a window its
//! receiver has not registered yet (NCCL's registration is collective; here each process
//! registers on its own) waits for that registration, and so do the later puts and
//! signals of the same sender.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cuda_mock::{MockWorld, WeakMockWorld};
use nccl_sys::ncclResult_t;

use crate::parts::Done;

/// What one-sided work needs of its communicator's ranks in this process (the clique,
/// which implements it: this module stays below it).
pub(crate) trait Peers: Send + Sync {
    /// The one-sided state of these ranks.
    fn rma(&self) -> &Rma;
    /// Whether some ranks are in other processes (reached over the hub).
    fn is_networked(&self) -> bool;
    /// Sends a put (or a withdrawn one) to rank `to` in another process.
    fn put_remote(
        &self,
        to: usize,
        data: Option<(u64, u64, Vec<u8>)>,
        withdrawn: bool,
    ) -> ncclResult_t;
    /// Wakes whoever waits for these ranks' work.
    fn wake(&self);
}

/// Where a window sits among its communicator's windows, for the puts that target it.
pub(crate) struct WinPlace {
    pub(crate) clique: Arc<dyn Peers>,
    pub(crate) rank: usize,
    /// Its place: the communicator's n-th window.
    pub(crate) seq: u64,
    pub(crate) flags: i32,
}

/// A wait: what it needs (peer, count), and its completion.
struct Waiting {
    rank: usize,
    need: Vec<(usize, u64)>,
    done: Weak<Mutex<Option<ncclResult_t>>>,
}

#[derive(Default)]
struct State {
    /// (rank, place) -> (address, bytes) of live windows.
    windows: HashMap<(usize, u64), (u64, usize)>,
    /// (receiver, sender) -> signals arrived and not yet waited for.
    signals: HashMap<(usize, usize), u64>,
    /// (receiver, sender) pairs whose next signal will never come (sender aborted, or its
    /// part withdrawn).
    broken: HashSet<(usize, usize)>,
    /// Ranks aborted: no signal of theirs comes any more.
    aborted: HashSet<usize>,
    waits: Vec<Waiting>,
    /// Across processes: the highest window place each rank of this process registered.
    latest: HashMap<usize, u64>,
    /// Across processes: puts and signals that arrived before the window they target,
    /// with everything after them from the same sender, in arrival order.
    early: VecDeque<Arrival>,
    /// The driver of this process's windows (across processes, where arrivals land).
    cuda: Option<WeakMockWorld>,
    /// Across processes: the connection to the other processes is gone; no signal comes.
    cut: bool,
}

/// A put or signal from a rank of another process, as its hub forwards it.
#[derive(Debug)]
pub(crate) struct Arrival {
    pub(crate) to: usize,
    pub(crate) from: usize,
    /// A put's window place, offset and bytes; `None`: a plain signal.
    pub(crate) data: Option<(u64, u64, Vec<u8>)>,
    /// The sender's sanitizer refused it: the waits that need it fail.
    pub(crate) withdrawn: bool,
}

/// The one-sided state of one communicator's ranks in one process.
#[derive(Default)]
pub(crate) struct Rma {
    state: Mutex<State>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn finish(done: &Done, rc: ncclResult_t) {
    let mut g = lock(done);
    if g.is_none() {
        *g = Some(rc);
    }
}

impl State {
    /// Completes the waits that can complete now (in the order they came).
    fn settle(&mut self) {
        let mut i = 0;
        while i < self.waits.len() {
            let w = &self.waits[i];
            let Some(done) = w.done.upgrade() else {
                // Its waiter gave up (a deadline): it consumes nothing.
                self.waits.remove(i);
                continue;
            };
            let arrived =
                |p: usize, n: u64| self.signals.get(&(w.rank, p)).copied().unwrap_or(0) >= n;
            let ready = w.need.iter().all(|&(p, n)| arrived(p, n));
            // A sender aborted (or a part withdrawn) fails only the waits whose signals
            // from it have not all arrived: those that arrived were delivered.
            if !ready
                && (self.cut
                    || w.need.iter().any(|&(p, n)| {
                        !arrived(p, n)
                            && (self.broken.contains(&(w.rank, p)) || self.aborted.contains(&p))
                    }))
            {
                finish(&done, ncclResult_t::ncclRemoteError);
                self.waits.remove(i);
                continue;
            }
            if ready {
                let w = self.waits.remove(i);
                for (p, n) in w.need {
                    if let Some(c) = self.signals.get_mut(&(w.rank, p)) {
                        *c -= n;
                    }
                }
                finish(&done, ncclResult_t::ncclSuccess);
                continue;
            }
            i += 1;
        }
    }
}

impl State {
    /// Takes an arrival from another process: applied now, or queued behind an earlier
    /// one of its sender or until its window is registered.
    fn receive(&mut self, a: Arrival) {
        let waits_for_window = a
            .data
            .as_ref()
            .is_some_and(|(seq, ..)| *seq > self.latest.get(&a.to).copied().unwrap_or(0));
        let behind = self.early.iter().any(|e| e.to == a.to && e.from == a.from);
        if waits_for_window || behind {
            self.early.push_back(a);
        } else {
            self.apply(a);
        }
    }

    /// Lands an arrival in its window (a released window takes no data) and counts its
    /// signal; one that does not fit the window, or that the driver refuses, is reported
    /// and fails the waits for its sender instead.
    fn apply(&mut self, a: Arrival) {
        if a.withdrawn {
            self.broken.insert((a.to, a.from));
            return;
        }
        if let Some((seq, offset, bytes)) = &a.data
            && !bytes.is_empty()
            && let Some(&(ptr, len)) = self.windows.get(&(a.to, *seq))
        {
            let who = format!(
                "ncclPutSignal from rank {} into rank {}'s window",
                a.from, a.to
            );
            let cuda = self.cuda.as_ref().and_then(WeakMockWorld::upgrade);
            let fits = offset
                .checked_add(bytes.len() as u64)
                .is_some_and(|end| end <= len as u64);
            let landed = match cuda {
                Some(cuda) if !fits => {
                    cuda.report(format!(
                        "{who}: {} bytes at offset {offset} do not fit its {len} bytes",
                        bytes.len()
                    ));
                    false
                }
                Some(cuda) => cuda.write_device(&who, ptr + offset, bytes).is_ok(),
                None => false,
            };
            if !landed {
                self.broken.insert((a.to, a.from));
                return;
            }
        }
        *self.signals.entry((a.to, a.from)).or_default() += 1;
    }
}

impl Rma {
    /// `rank`'s window of place `seq` is `[ptr, ptr + len)` on `cuda`'s memory; puts
    /// from other processes that were waiting for it land now.
    pub(crate) fn window_added(
        &self,
        cuda: &MockWorld,
        rank: usize,
        seq: u64,
        ptr: u64,
        len: usize,
    ) {
        let mut st = lock(&self.state);
        st.windows.insert((rank, seq), (ptr, len));
        st.cuda = Some(cuda.downgrade());
        let latest = st.latest.entry(rank).or_insert(0);
        *latest = (*latest).max(seq);
        for a in std::mem::take(&mut st.early) {
            st.receive(a);
        }
        st.settle();
    }

    /// A put or signal from another process arrived (in its sender's order).
    pub(crate) fn arrive(&self, a: Arrival) {
        let mut st = lock(&self.state);
        st.receive(a);
        st.settle();
    }

    /// The connection to the other processes is gone: every wait fails.
    pub(crate) fn cut(&self) {
        let mut st = lock(&self.state);
        st.cut = true;
        st.settle();
    }

    /// `rank` released its window of place `seq`: later puts into it land nowhere.
    pub(crate) fn window_gone(&self, rank: usize, seq: u64) {
        lock(&self.state).windows.remove(&(rank, seq));
    }

    /// `rank` is gone: the waits for its signals fail.
    pub(crate) fn abort(&self, rank: usize) {
        let mut st = lock(&self.state);
        st.aborted.insert(rank);
        st.settle();
    }

    /// Waits pending (for leak checks).
    pub(crate) fn pending(&self) -> usize {
        let st = lock(&self.state);
        st.waits
            .iter()
            .filter(|w| w.done.strong_count() > 0)
            .count()
    }
}

/// One rank's one-sided operation.
pub(crate) enum Rma1 {
    /// `bytes` from `src` on rank `from` into rank `to`'s window of place `seq`, at
    /// `offset`; then a signal. No data: a plain signal.
    Put {
        from: usize,
        to: usize,
        data: Option<(u64, usize, u64, u64)>,
    },
    /// Rank `rank` waits for `need` (peer, count).
    Wait {
        rank: usize,
        need: Vec<(usize, u64)>,
    },
}

impl Rma1 {
    /// The operation's call and rank, for a wait notice.
    pub(crate) fn describe(&self, call: &str) -> String {
        match self {
            Rma1::Put { from, to, .. } => format!("{call} from rank {from} to rank {to}"),
            Rma1::Wait { rank, need } => format!("{call} of rank {rank} for {need:?}"),
        }
    }

    /// Runs it now on `cuda`'s device memory (a wait: registers it, completed once its
    /// signals are in). Across processes a put reads its source here and ships it.
    pub(crate) fn start(&self, clique: &dyn Peers, cuda: &MockWorld) -> Done {
        let done: Done = Arc::new(Mutex::new(None));
        let rma = clique.rma();
        match self {
            Rma1::Put { from, to, data } if clique.is_networked() => {
                let mut payload = None;
                if let Some((src, bytes, seq, offset)) = *data {
                    let read = match bytes {
                        0 => Ok(Vec::new()),
                        _ => cuda.read_device(&format!("ncclPutSignal on rank {from}"), src, bytes),
                    };
                    let Ok(d) = read else {
                        self.withdraw(clique);
                        finish(&done, ncclResult_t::ncclUnhandledCudaError);
                        return done;
                    };
                    payload = Some((seq, offset, d));
                }
                finish(&done, clique.put_remote(*to, payload, false));
            }
            Rma1::Put { from, to, data } => {
                if let Some((src, bytes, seq, offset)) = *data
                    && bytes > 0
                {
                    let call = format!("ncclPutSignal on rank {from}");
                    let Ok(d) = cuda.read_device(&call, src, bytes) else {
                        self.withdraw(clique);
                        finish(&done, ncclResult_t::ncclUnhandledCudaError);
                        return done;
                    };
                    let target = lock(&rma.state).windows.get(&(*to, seq)).copied();
                    if let Some((ptr, _)) = target
                        && cuda
                            .write_device(
                                &format!("{call} into rank {to}'s window"),
                                ptr + offset,
                                &d,
                            )
                            .is_err()
                    {
                        self.withdraw(clique);
                        finish(&done, ncclResult_t::ncclRemoteError);
                        return done;
                    }
                }
                let mut st = lock(&rma.state);
                *st.signals.entry((*to, *from)).or_default() += 1;
                st.settle();
                drop(st);
                finish(&done, ncclResult_t::ncclSuccess);
            }
            Rma1::Wait { rank, need } => {
                let mut st = lock(&rma.state);
                st.waits.push(Waiting {
                    rank: *rank,
                    need: need.clone(),
                    done: Arc::downgrade(&done),
                });
                st.settle();
            }
        }
        clique.wake();
        done
    }

    /// Takes its place without doing it: the waits that need it fail.
    pub(crate) fn withdraw(&self, clique: &dyn Peers) {
        if let Rma1::Put { to, .. } = self
            && clique.is_networked()
        {
            // The receiver's waits for it fail in its process.
            clique.put_remote(*to, None, true);
            return;
        }
        let mut st = lock(&clique.rma().state);
        match self {
            Rma1::Put { from, to, .. } => {
                st.broken.insert((*to, *from));
            }
            Rma1::Wait { .. } => {}
        }
        st.settle();
        drop(st);
        clique.wake();
    }
}
