//! Ranks of one communicator meeting in one process: collectives and point-to-point
//! transfers matched in call order and executed on the simulated device memory.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::dtype::{self, V};
use crate::{ncclDataType_t, ncclRedOp_t, ncclResult_t};

/// What a rank asks its peers to do together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    Gather,
    Scatter,
}

/// How elements combine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Op {
    Builtin(ncclRedOp_t),
    Avg,
    /// Pre-multiplied sum; this rank's scalar.
    PreMul(V),
}

impl Op {
    fn same_kind(&self, other: &Op) -> bool {
        match (self, other) {
            (Op::PreMul(_), Op::PreMul(_)) => true,
            (a, b) => a == b,
        }
    }
}

/// One rank's part of a collective.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Contrib {
    pub(crate) kind: Kind,
    pub(crate) send: usize,
    pub(crate) recv: usize,
    pub(crate) count: usize,
    pub(crate) dtype: ncclDataType_t,
    pub(crate) op: Op,
    pub(crate) root: i32,
}

/// Completion of one rank's part: `None` while pending.
pub(crate) type Done = Arc<Mutex<Option<ncclResult_t>>>;

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
        })
    }

    /// Marks `rank` gone: every pending and later operation that needs it (every
    /// collective, its sends and receives) fails with a remote error instead of waiting.
    /// Transfers between other ranks go on, as with NCCL.
    pub(crate) fn abort(&self, rank: usize) {
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

    /// Whether any rank was aborted (its peers' asynchronous error reports it).
    pub(crate) fn is_aborted(&self) -> bool {
        !lock(&self.state).aborted.is_empty()
    }

    /// Submits `rank`'s part of collective number `seq`; runs it if it is the last part.
    pub(crate) fn submit(&self, seq: u64, rank: usize, c: Contrib) -> Done {
        self.submit_part(seq, rank, c, false)
    }

    /// Takes `rank`'s place in collective number `seq` without taking part: the
    /// collective fails with `ncclRemoteError` for every rank once all parts are in.
    pub(crate) fn withdraw(&self, seq: u64, rank: usize, c: Contrib) -> Done {
        self.submit_part(seq, rank, c, true)
    }

    fn submit_part(&self, seq: u64, rank: usize, c: Contrib, withdrawn: bool) -> Done {
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
            let rc = if slot.withdrawn {
                ncclResult_t::ncclRemoteError
            } else {
                execute(&parts)
            };
            for (_, d) in &parts {
                *lock(d) = Some(rc);
            }
            self.cond.notify_all();
        }
        done
    }

    /// Posts a send (`src` to `dst`) or a receive; completes the match if the other side
    /// is there.
    pub(crate) fn post(
        &self,
        is_send: bool,
        src: usize,
        dst: usize,
        ptr: usize,
        count: usize,
        dtype: ncclDataType_t,
    ) -> Done {
        self.post_part(is_send, src, dst, ptr, count, dtype, false)
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
        self.post_part(is_send, src, dst, 0, count, dtype, true)
    }

    #[allow(clippy::too_many_arguments)] // post's arguments and the withdrawn flag
    fn post_part(
        &self,
        is_send: bool,
        src: usize,
        dst: usize,
        ptr: usize,
        count: usize,
        dtype: ncclDataType_t,
        withdrawn: bool,
    ) -> Done {
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
                let rc = if s.withdrawn || r.withdrawn {
                    ncclResult_t::ncclRemoteError
                } else if s.count != r.count || s.dtype != r.dtype {
                    ncclResult_t::ncclInvalidUsage
                } else {
                    let bytes = s.count * dtype::size_of(s.dtype).unwrap_or(1);
                    if bytes > 0 {
                        // SAFETY: both ranges were checked against live simulated device
                        // allocations when the calls were made and again (sanitizer) when
                        // each side's work became due; freed simulated memory stays
                        // allocated in the driver's quarantine, so it is never dangling.
                        unsafe { std::ptr::copy(s.ptr as *const u8, r.ptr as *mut u8, bytes) };
                    }
                    ncclResult_t::ncclSuccess
                };
                *lock(&me.done) = Some(rc);
                *lock(&o.done) = Some(rc);
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

    /// Waits for `done` until `deadline` (an abort of a rank it needs completes it with an
    /// error); the deadline gives an error.
    pub(crate) fn wait(&self, done: &Done, deadline: Instant) -> ncclResult_t {
        let mut st = lock(&self.state);
        loop {
            if let Some(rc) = *lock(done) {
                return rc;
            }
            let now = Instant::now();
            if now >= deadline {
                return ncclResult_t::ncclSystemError;
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
        let st = lock(&self.state);
        st.colls.len()
            + st.sends.values().map(VecDeque::len).sum::<usize>()
            + st.recvs.values().map(VecDeque::len).sum::<usize>()
    }
}

/// Reads `count` elements of `dtype` at `ptr`.
fn read(ptr: usize, count: usize, dtype: ncclDataType_t) -> Vec<u8> {
    let n = count * dtype::size_of(dtype).unwrap_or(1);
    if n == 0 {
        return Vec::new();
    }
    // SAFETY: the range was checked against a live simulated device allocation when the
    // call was made and when its work became due; freed simulated memory stays allocated
    // in the driver's quarantine, so it is never dangling.
    unsafe { std::slice::from_raw_parts(ptr as *const u8, n) }.to_vec()
}

fn write(ptr: usize, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    // SAFETY: the range was checked against a live simulated device allocation when the
    // call was made and when its work became due; freed simulated memory stays allocated
    // in the driver's quarantine, so it is never dangling.
    unsafe { std::ptr::copy(data.as_ptr(), ptr as *mut u8, data.len()) };
}

/// Reduces element-wise `inputs` (one per rank, `count` elements each) with the ranks' ops.
fn reduce(inputs: &[Vec<u8>], ops: &[Op], count: usize, t: ncclDataType_t) -> Vec<u8> {
    let n = inputs.len();
    let size = dtype::size_of(t).unwrap_or(1);
    let mut out = vec![0u8; count * size];
    for i in 0..count {
        let term = |r: usize| {
            let x = dtype::get(t, &inputs[r], i);
            match ops[r] {
                Op::PreMul(s) => dtype::scale(t, x, s),
                Op::Avg if dtype::is_float_type(t) => dtype::scale(t, x, V::F(1.0 / n as f64)),
                _ => x,
            }
        };
        let builtin = match ops[0] {
            Op::Builtin(b) => b,
            _ => ncclRedOp_t::ncclSum,
        };
        let mut acc = term(0);
        for r in 1..n {
            acc = dtype::combine(t, builtin, acc, term(r));
        }
        if ops[0] == Op::Avg && !dtype::is_float_type(t) {
            acc = dtype::divide(t, acc, n as i128);
        }
        dtype::put(t, &mut out, i, acc);
    }
    out
}

/// Runs one collective given every rank's part (in rank order).
fn execute(parts: &[(Contrib, Done)]) -> ncclResult_t {
    let first = parts[0].0;
    let n = parts.len();
    for (c, _) in parts {
        if c.kind != first.kind
            || c.count != first.count
            || c.dtype != first.dtype
            || c.root != first.root
            || !c.op.same_kind(&first.op)
        {
            return ncclResult_t::ncclInvalidUsage;
        }
    }
    let (t, count) = (first.dtype, first.count);
    let size = dtype::size_of(t).unwrap_or(1);
    let root = first.root as usize;
    let ops: Vec<Op> = parts.iter().map(|p| p.0.op).collect();
    match first.kind {
        Kind::AllReduce | Kind::Reduce => {
            let inputs: Vec<Vec<u8>> = parts.iter().map(|p| read(p.0.send, count, t)).collect();
            let out = reduce(&inputs, &ops, count, t);
            for (r, (c, _)) in parts.iter().enumerate() {
                if first.kind == Kind::AllReduce || r == root {
                    write(c.recv, &out);
                }
            }
        }
        Kind::ReduceScatter => {
            let inputs: Vec<Vec<u8>> = parts.iter().map(|p| read(p.0.send, count * n, t)).collect();
            for (r, (c, _)) in parts.iter().enumerate() {
                let chunk: Vec<Vec<u8>> = inputs
                    .iter()
                    .map(|i| i[r * count * size..(r + 1) * count * size].to_vec())
                    .collect();
                write(c.recv, &reduce(&chunk, &ops, count, t));
            }
        }
        Kind::AllGather | Kind::Gather => {
            let all: Vec<u8> = parts
                .iter()
                .flat_map(|p| read(p.0.send, count, t))
                .collect();
            for (r, (c, _)) in parts.iter().enumerate() {
                if first.kind == Kind::AllGather || r == root {
                    write(c.recv, &all);
                }
            }
        }
        Kind::Broadcast => {
            let data = read(parts[root].0.send, count, t);
            for (c, _) in parts {
                write(c.recv, &data);
            }
        }
        Kind::Scatter => {
            let data = read(parts[root].0.send, count * n, t);
            for (r, (c, _)) in parts.iter().enumerate() {
                write(c.recv, &data[r * count * size..(r + 1) * count * size]);
            }
        }
        Kind::AllToAll => {
            let inputs: Vec<Vec<u8>> = parts.iter().map(|p| read(p.0.send, count * n, t)).collect();
            for (r, (c, _)) in parts.iter().enumerate() {
                let out: Vec<u8> = inputs
                    .iter()
                    .flat_map(|i| i[r * count * size..(r + 1) * count * size].iter().copied())
                    .collect();
                write(c.recv, &out);
            }
        }
    }
    ncclResult_t::ncclSuccess
}
