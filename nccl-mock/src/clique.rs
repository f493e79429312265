//! Ranks of one communicator meeting in one process: collectives and point-to-point
//! transfers matched in call order and executed on the simulated device memory.
//!
//! Device memory is only reached through the driver's [`MockWorld::read_device`] and
//! [`MockWorld::write_device`], which check each range and copy it under the driver's
//! lock: a buffer freed since its part was admitted (even one the quarantine has evicted
//! and really freed) is reported, never touched. The rank whose buffer it was fails with
//! `ncclUnhandledCudaError`, its peers with `ncclRemoteError`, as when a part is refused.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cuda_mock::MockWorld;

use crate::net::link::Link;
use crate::notice::Notice;
use crate::parts::{Buffers, Contrib, Done, bytes, disagreement, move_data, p2p_refusal, results};
use nccl_sys::{ncclDataType_t, ncclResult_t};

struct Slot {
    contribs: Vec<Option<(Contrib, Done)>>,
    /// A rank withdrew its part (its work was refused when it was due to run): the
    /// collective does not run and every part fails once all are in, so no peer hangs.
    withdrawn: bool,
}

struct P2p {
    ptr: usize,
    count: usize,
    dtype: ncclDataType_t,
    done: Done,
    /// Withdrawn, like [`Slot::withdrawn`]: the match fails instead of copying.
    withdrawn: bool,
}

#[derive(Default)]
struct State {
    colls: HashMap<u64, Slot>,
    sends: HashMap<(usize, usize), VecDeque<P2p>>,
    recvs: HashMap<(usize, usize), VecDeque<P2p>>,
    splits: HashMap<u64, SplitRound>,
    /// Ranks whose communicator was aborted.
    aborted: Vec<usize>,
    /// Grow ids the coordinator published (`ncclCommGetUniqueId`), by grow number.
    grow_ids: HashMap<u64, Vec<u8>>,
    /// The newest collective whose ranks disagreed, by number, and how.
    disagreement: Option<(u64, String)>,
}

/// A rank's (color, key) in a split, and where its result goes.
type SplitVote = (i32, i32, SplitSlot);

/// Where a rank's split result is delivered: where it lands, or the error of the round.
type SplitSlot = Arc<Mutex<Option<Result<SplitOut, ncclResult_t>>>>;

/// One split (or shrink) of the clique, matched by sequence number.
struct SplitRound {
    /// The ranks that take no part (a shrink's excluded ranks); every other rank votes.
    excluded: Vec<usize>,
    votes: Vec<Option<SplitVote>>,
    /// Ranks disagreed on who takes part: every vote fails with this.
    failed: Option<ncclResult_t>,
}

/// Where a rank lands after a split.
#[derive(Clone)]
pub(crate) struct SplitOut {
    pub(crate) clique: Option<Arc<Clique>>,
    pub(crate) rank: usize,
}

/// The shared state of one communicator's ranks.
pub(crate) struct Clique {
    pub(crate) size: usize,
    pub(crate) devices: Vec<i32>,
    state: Mutex<State>,
    cond: Condvar,
    /// Multi-process mode: this one rank's connection to the hub, which matches the
    /// parts of every rank instead of `state` (see [`Link`]).
    net: Option<Link>,
    /// One-sided operations' windows and signals of this process's ranks (across
    /// processes shared with the link, whose reader lands the puts that arrive).
    pub(crate) rma: Arc<crate::rma::Rma>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Clique {
    pub(crate) fn new(devices: Vec<i32>) -> Arc<Clique> {
        Arc::new(Clique {
            size: devices.len(),
            devices,
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            net: None,
            rma: Arc::default(),
        })
    }

    /// One rank of a communicator whose ranks live in several processes: its parts go
    /// through `link` to the hub, which runs them with the same [`move_data`].
    pub(crate) fn networked(devices: Vec<i32>, link: Link) -> Arc<Clique> {
        Arc::new(Clique {
            size: devices.len(),
            devices,
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            rma: link.rma(),
            net: Some(link),
        })
    }

    /// Whether its ranks live in several processes (multi-process mode).
    pub(crate) fn is_networked(&self) -> bool {
        self.net.is_some()
    }

    /// Marks `rank` gone: every pending and later operation that needs it (every
    /// collective, its sends and receives) fails with a remote error instead of waiting.
    /// Transfers between other ranks go on, as with NCCL.
    pub(crate) fn abort(&self, rank: usize) {
        self.rma.abort(rank);
        if let Some(link) = &self.net {
            return link.abort();
        }
        let mut st = lock(&self.state);
        st.aborted.push(rank);
        let fail = |d: &Done| {
            let mut g = lock(d);
            if g.is_none() {
                *g = Some(ncclResult_t::ncclRemoteError);
            }
        };
        for (_, slot) in st.colls.drain() {
            slot.contribs.iter().flatten().for_each(|(_, d)| fail(d));
        }
        let st = &mut *st;
        for q in [&mut st.sends, &mut st.recvs] {
            q.retain(|&(src, dst), q| {
                let involved = src == rank || dst == rank;
                if involved {
                    q.iter().for_each(|p| fail(&p.done));
                }
                !involved
            });
        }
        self.cond.notify_all();
    }

    /// Wakes the waits on this clique's parts (a one-sided operation completed some).
    pub(crate) fn wake(&self) {
        if let Some(link) = &self.net {
            link.wake();
        }
        let _st = lock(&self.state);
        self.cond.notify_all();
    }

    /// Ships a put (`data`: its window place, offset and bytes) or a plain signal of this
    /// process's rank to rank `to` through the hub; `withdrawn`: refused here, so that
    /// the receiver's waits for it fail. Across processes only.
    pub(crate) fn put_remote(
        &self,
        to: usize,
        data: Option<(u64, u64, Vec<u8>)>,
        withdrawn: bool,
    ) -> ncclResult_t {
        match &self.net {
            Some(link) => link.put(to, data, withdrawn),
            None => ncclResult_t::ncclInternalError,
        }
    }

    /// Whether any rank was aborted (its peers' asynchronous error reports it).
    pub(crate) fn is_aborted(&self) -> bool {
        if let Some(link) = &self.net {
            return link.is_broken();
        }
        !lock(&self.state).aborted.is_empty()
    }

    /// Submits `rank`'s part of collective number `seq`; runs it on `cuda`'s device
    /// memory if it is the last part.
    pub(crate) fn submit(&self, cuda: &MockWorld, seq: u64, rank: usize, c: Contrib) -> Done {
        self.submit_part(seq, rank, c, Some(cuda))
    }

    /// Takes `rank`'s place in collective number `seq` without taking part: the
    /// collective fails with `ncclRemoteError` for every rank once all parts are in.
    pub(crate) fn withdraw(&self, seq: u64, rank: usize, c: Contrib) -> Done {
        self.submit_part(seq, rank, c, None)
    }

    /// `run`: the driver whose memory the collective moves, `None` to withdraw the part.
    fn submit_part(&self, seq: u64, rank: usize, c: Contrib, run: Option<&MockWorld>) -> Done {
        if let Some(link) = &self.net {
            return link.submit(seq, rank, self.size, c, run);
        }
        let withdrawn = run.is_none();
        let done: Done = Arc::new(Mutex::new(None));
        let mut st = lock(&self.state);
        if !st.aborted.is_empty() {
            *lock(&done) = Some(ncclResult_t::ncclRemoteError);
            return done;
        }
        let size = self.size;
        let slot = st.colls.entry(seq).or_insert_with(|| Slot {
            contribs: vec![None; size],
            withdrawn: false,
        });
        if let Some(place) = slot.contribs.get_mut(rank) {
            *place = Some((c, done.clone()));
        }
        slot.withdrawn |= withdrawn;
        if slot.contribs.iter().all(Option::is_some)
            && let Some(slot) = st.colls.remove(&seq)
        {
            let parts: Vec<(Contrib, Done)> = slot.contribs.into_iter().flatten().collect();
            // Not withdrawn: every part, this last one too, came with the driver.
            let rcs = match run {
                Some(cuda) if !slot.withdrawn => match execute(cuda, &parts) {
                    Ok(rcs) => rcs,
                    Err(why) => {
                        st.disagreement = Some((seq, why));
                        vec![ncclResult_t::ncclInvalidUsage; parts.len()]
                    }
                },
                _ => vec![ncclResult_t::ncclRemoteError; parts.len()],
            };
            for ((_, d), rc) in parts.iter().zip(rcs) {
                *lock(d) = Some(rc);
            }
            self.cond.notify_all();
        }
        done
    }

    /// Posts a send (`src` to `dst`) or a receive; completes the match if the other side
    /// is there, copying on `cuda`'s device memory.
    #[allow(clippy::too_many_arguments)] // the call's arguments and the driver
    pub(crate) fn post(
        &self,
        cuda: &MockWorld,
        is_send: bool,
        src: usize,
        dst: usize,
        ptr: usize,
        count: usize,
        dtype: ncclDataType_t,
    ) -> Done {
        self.post_part(is_send, src, dst, ptr, count, dtype, Some(cuda))
    }

    /// Takes the place of a send or receive without doing it: the match fails with
    /// `ncclRemoteError` on both sides instead of copying.
    pub(crate) fn withdraw_p2p(
        &self,
        is_send: bool,
        src: usize,
        dst: usize,
        count: usize,
        dtype: ncclDataType_t,
    ) -> Done {
        self.post_part(is_send, src, dst, 0, count, dtype, None)
    }

    /// `run`: the driver whose memory the transfer copies, `None` to withdraw the part.
    #[allow(clippy::too_many_arguments)] // post's arguments
    fn post_part(
        &self,
        is_send: bool,
        src: usize,
        dst: usize,
        ptr: usize,
        count: usize,
        dtype: ncclDataType_t,
        run: Option<&MockWorld>,
    ) -> Done {
        if let Some(link) = &self.net {
            let (peer, me) = if is_send { (dst, src) } else { (src, dst) };
            return link.post(is_send, me, peer, ptr, count, dtype, run);
        }
        let withdrawn = run.is_none();
        let done: Done = Arc::new(Mutex::new(None));
        let mut st = lock(&self.state);
        if st.aborted.iter().any(|&r| r == src || r == dst) {
            *lock(&done) = Some(ncclResult_t::ncclRemoteError);
            return done;
        }
        let me = P2p {
            ptr,
            count,
            dtype,
            done: done.clone(),
            withdrawn,
        };
        let other = if is_send {
            st.recvs.get_mut(&(src, dst)).and_then(VecDeque::pop_front)
        } else {
            st.sends.get_mut(&(src, dst)).and_then(VecDeque::pop_front)
        };
        match other {
            Some(o) => {
                let (s, r) = if is_send { (&me, &o) } else { (&o, &me) };
                let refusal = p2p_refusal(
                    (s.count, s.dtype, s.withdrawn),
                    (r.count, r.dtype, r.withdrawn),
                );
                let (send_rc, recv_rc) = match (refusal, run) {
                    (Some(rc), _) => (rc, rc),
                    // Neither side withdrawn: this one came with the driver.
                    (None, Some(cuda)) => transfer(cuda, (src, s), (dst, r)),
                    (None, None) => (ncclResult_t::ncclRemoteError, ncclResult_t::ncclRemoteError),
                };
                *lock(&s.done) = Some(send_rc);
                *lock(&r.done) = Some(recv_rc);
                self.cond.notify_all();
            }
            None => {
                let q = if is_send {
                    &mut st.sends
                } else {
                    &mut st.recvs
                };
                q.entry((src, dst)).or_default().push_back(me);
            }
        }
        done
    }

    /// Joins split number `seq` with `(color, key)`; returns where this rank lands. The
    /// ranks in `excluded` take no part (a shrink): the split forms once every other rank
    /// has voted, and an abort of an excluded rank does not fail it. Ranks that disagree
    /// on `excluded` fail with `ncclInvalidUsage`.
    pub(crate) fn split(
        &self,
        seq: u64,
        rank: usize,
        (color, key): (i32, i32),
        excluded: &[usize],
        deadline: Instant,
    ) -> Result<SplitOut, ncclResult_t> {
        if self.net.is_some() {
            // Refused at the call (see `init::start_child`); never reached.
            return Err(ncclResult_t::ncclInvalidUsage);
        }
        let out: SplitSlot = Arc::new(Mutex::new(None));
        {
            let mut st = lock(&self.state);
            let size = self.size;
            let round = st.splits.entry(seq).or_insert_with(|| SplitRound {
                excluded: excluded.to_vec(),
                votes: vec![None; size],
                failed: None,
            });
            if round.failed.is_none() && round.excluded != excluded {
                round.failed = Some(ncclResult_t::ncclInvalidUsage);
            }
            if let Some(rc) = round.failed {
                for (_, _, o) in round.votes.iter().flatten() {
                    *lock(o) = Some(Err(rc));
                }
                self.cond.notify_all();
                return Err(rc);
            }
            if let Some(p) = round.votes.get_mut(rank) {
                *p = Some((color, key, out.clone()));
            }
            let complete = round
                .votes
                .iter()
                .enumerate()
                .all(|(r, v)| v.is_some() || round.excluded.contains(&r));
            if complete {
                let parts: Vec<(usize, i32, i32, SplitSlot)> = st
                    .splits
                    .remove(&seq)
                    .map(|r| r.votes)
                    .unwrap_or_default()
                    .into_iter()
                    .enumerate()
                    .filter_map(|(r, p)| p.map(|(c, k, o)| (r, c, k, o)))
                    .collect();
                let mut colors: Vec<i32> = parts.iter().map(|p| p.1).filter(|&c| c >= 0).collect();
                colors.sort_unstable();
                colors.dedup();
                for color in colors {
                    let mut members: Vec<&(usize, i32, i32, _)> =
                        parts.iter().filter(|p| p.1 == color).collect();
                    members.sort_by_key(|p| (p.2, p.0));
                    let clique = Clique::new(members.iter().map(|p| self.devices[p.0]).collect());
                    for (new_rank, m) in members.iter().enumerate() {
                        *lock(&m.3) = Some(Ok(SplitOut {
                            clique: Some(clique.clone()),
                            rank: new_rank,
                        }));
                    }
                }
                for p in parts.iter().filter(|p| p.1 < 0) {
                    *lock(&p.3) = Some(Ok(SplitOut {
                        clique: None,
                        rank: 0,
                    }));
                }
                self.cond.notify_all();
            }
        }
        let mut st = lock(&self.state);
        loop {
            if let Some(o) = lock(&out).clone() {
                return o;
            }
            if st.aborted.iter().any(|r| !excluded.contains(r)) {
                return Err(ncclResult_t::ncclRemoteError);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ncclResult_t::ncclSystemError);
            }
            st = self
                .cond
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// How the ranks disagreed on collective number `seq` (the newest such collective
    /// only; `None` for any other), for the error its ranks report.
    pub(crate) fn disagreement(&self, seq: u64) -> Option<String> {
        self.disagreements()
            .filter(|(s, _)| *s == seq)
            .map(|(_, why)| why)
    }

    fn disagreements(&self) -> Option<(u64, String)> {
        match &self.net {
            Some(link) => link.disagreement(),
            None => lock(&self.state).disagreement.clone(),
        }
    }

    /// Waits for `done` until `deadline` (an abort of a rank it needs completes it with an
    /// error); the deadline gives an error.
    pub(crate) fn wait(&self, done: &Done, deadline: Instant) -> ncclResult_t {
        self.wait_noticed(
            done,
            deadline,
            Notice::new(Duration::ZERO, None::<fn() -> String>),
        )
    }

    /// As [`wait`](Self::wait), saying on stderr (`notice`) when the wait lasts (in one
    /// process; a networked rank's wait is the link's).
    pub(crate) fn wait_noticed(
        &self,
        done: &Done,
        deadline: Instant,
        mut notice: Notice<impl FnOnce() -> String>,
    ) -> ncclResult_t {
        if let Some(link) = &self.net {
            return link.wait(done, deadline);
        }
        let mut st = lock(&self.state);
        loop {
            if let Some(rc) = *lock(done) {
                return rc;
            }
            let now = Instant::now();
            if now >= deadline {
                return ncclResult_t::ncclSystemError;
            }
            notice.tick(now);
            st = self
                .cond
                .wait_timeout(st, notice.until(deadline).saturating_duration_since(now))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// The coordinator's grow id for grow number `seq`, for every rank of the communicator
    /// (NCCL's `bcastGrowHandle` over the parent's bootstrap; across processes through
    /// the hub).
    pub(crate) fn publish_grow_id(&self, seq: u64, id: &[u8]) {
        if let Some(link) = &self.net {
            return link.publish_grow_id(seq, id);
        }
        lock(&self.state).grow_ids.insert(seq, id.to_vec());
        self.cond.notify_all();
    }

    /// Waits until `deadline` for the grow id of grow number `seq`; `None` then, or when
    /// this rank's connection to its hub is gone.
    pub(crate) fn grow_id(&self, seq: u64, deadline: Instant) -> Option<Vec<u8>> {
        if let Some(link) = &self.net {
            return link.grow_id(seq, deadline);
        }
        let mut st = lock(&self.state);
        loop {
            if let Some(id) = st.grow_ids.get(&seq) {
                return Some(id.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            st = self
                .cond
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Parts submitted and not yet matched (for leak checks).
    pub(crate) fn pending(&self) -> usize {
        if let Some(link) = &self.net {
            return link.pending() + self.rma.pending();
        }
        let st = lock(&self.state);
        self.rma.pending()
            + st.colls.len()
            + st.sends.values().map(VecDeque::len).sum::<usize>()
            + st.recvs.values().map(VecDeque::len).sum::<usize>()
    }
}

/// Copies a matched send (rank `src`) to its receive (rank `dst`) through the driver;
/// the results of the send and of the receive. An illegal side fails with
/// `ncclUnhandledCudaError` (the driver recorded why), its peer with `ncclRemoteError`.
fn transfer(
    cuda: &MockWorld,
    (src, s): (usize, &P2p),
    (dst, r): (usize, &P2p),
) -> (ncclResult_t, ncclResult_t) {
    let (failed, remote) = (
        ncclResult_t::ncclUnhandledCudaError,
        ncclResult_t::ncclRemoteError,
    );
    let bytes = bytes(s.count, s.dtype);
    if bytes == 0 {
        return (ncclResult_t::ncclSuccess, ncclResult_t::ncclSuccess);
    }
    let Ok(data) = cuda.read_device(&format!("ncclSend on rank {src}"), s.ptr as u64, bytes) else {
        return (failed, remote);
    };
    match cuda.write_device(&format!("ncclRecv on rank {dst}"), r.ptr as u64, &data) {
        Ok(()) => (ncclResult_t::ncclSuccess, ncclResult_t::ncclSuccess),
        Err(_) => (remote, failed),
    }
}

/// One collective's device memory, reached through the driver (checked and copied under
/// its lock); remembers the ranks whose buffers were illegal.
struct Memory<'a> {
    cuda: &'a MockWorld,
    parts: &'a [Contrib],
    failed: Vec<bool>,
}

impl<'a> Memory<'a> {
    fn new(cuda: &'a MockWorld, parts: &'a [Contrib]) -> Self {
        Memory {
            cuda,
            parts,
            failed: vec![false; parts.len()],
        }
    }

    /// How rank `rank`'s accesses are named in reports, e.g. `ncclAllReduce on rank 1`.
    fn who(&self, rank: usize) -> String {
        format!("{} on rank {rank}", self.parts[rank].call)
    }
}

impl Buffers for Memory<'_> {
    fn input(&mut self, rank: usize, len: usize) -> Option<Vec<u8>> {
        let ptr = self.parts[rank].send as u64;
        match self.cuda.read_device(&self.who(rank), ptr, len) {
            Ok(v) => Some(v),
            Err(_) => {
                self.failed[rank] = true;
                None
            }
        }
    }

    fn output(&mut self, rank: usize, data: &[u8]) {
        let ptr = self.parts[rank].recv as u64;
        if self.cuda.write_device(&self.who(rank), ptr, data).is_err() {
            self.failed[rank] = true;
        }
    }
}

/// Runs one collective given every rank's part (in rank order) on `cuda`'s device memory;
/// each rank's result, or how the ranks disagree ([`disagreement`]).
fn execute(cuda: &MockWorld, parts: &[(Contrib, Done)]) -> Result<Vec<ncclResult_t>, String> {
    let contribs: Vec<Contrib> = parts.iter().map(|p| p.0).collect();
    if let Some(why) = disagreement(&contribs) {
        return Err(why);
    }
    // NCCL's symmetric kernels would reach the wrong memory of a peer: a sanitizer
    // finding (the data still moves as the buffers say).
    if let Some(why) = crate::parts::asymmetry(&contribs) {
        cuda.report(why);
    }
    let mut mem = Memory::new(cuda, &contribs);
    move_data(&mut mem, &contribs);
    Ok(results(&mem.failed))
}

impl crate::rma::Peers for Clique {
    fn rma(&self) -> &crate::rma::Rma {
        &self.rma
    }
    fn is_networked(&self) -> bool {
        Clique::is_networked(self)
    }
    fn put_remote(
        &self,
        to: usize,
        data: Option<(u64, u64, Vec<u8>)>,
        withdrawn: bool,
    ) -> ncclResult_t {
        Clique::put_remote(self, to, data, withdrawn)
    }
    fn wake(&self) {
        Clique::wake(self);
    }
}
