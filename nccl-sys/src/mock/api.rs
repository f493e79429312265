//! The simulated NCCL functions, one instance per world slot (const generic `W`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cuda_sys::CUresult;

use super::NWorld;
use super::clique::{Clique, Contrib, Done, Kind, Op};
use super::dtype;
use crate::*;

cuda_sys::__mock_slots!(NWorld);
static WORLD_IDS: AtomicU64 = AtomicU64::new(1);

pub(super) fn next_world_id() -> u64 {
    WORLD_IDS.fetch_add(1, Ordering::Relaxed)
}

/// Live simulated NCCL objects; all zero when nothing leaked.
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

struct PreMul {
    scalar: usize,
    dtype: ncclDataType_t,
    device_resident: bool,
}

pub(crate) struct Comm {
    clique: Option<Arc<Clique>>,
    rank: usize,
    size: usize,
    device: i32,
    seq: u64,
    split_seq: u64,
    async_err: ncclResult_t,
    redops: HashMap<u32, PreMul>,
    next_op: u32,
    /// Non-blocking (config.blocking = 0): operations return ncclInProgress and complete
    /// in the background; ncclCommGetAsyncError reports them.
    blocking: bool,
    /// Operations of a non-blocking communicator not yet known to be complete.
    pending: Vec<Done>,
    /// The init registration of a non-blocking communicator still joining.
    init: Option<(Vec<u8>, usize)>,
}

struct Init {
    nranks: usize,
    devices: Vec<Option<i32>>,
    clique: Option<Arc<Clique>>,
    taken: usize,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) faults: Vec<(String, u64, ncclResult_t)>,
    pub(crate) calls: HashMap<&'static str, u64>,
    comms: HashMap<usize, Comm>,
    inits: HashMap<Vec<u8>, Init>,
    cliques: Vec<std::sync::Weak<Clique>>,
    next: usize,
    last_error: Option<CString>,
    id_counter: u64,
}

impl State {
    fn enter(&mut self, function: &'static str) -> Option<ncclResult_t> {
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

    fn error(&mut self, msg: String) {
        self.last_error = CString::new(msg).ok();
    }

    fn handle(&mut self, world: u64) -> usize {
        self.next += 1;
        ((world as usize) << 24) | (self.next << 4)
    }
}

pub(super) fn live(w: &NWorld) -> LiveComms {
    let s = w.lock();
    LiveComms {
        comms: s.comms.len(),
        reduction_ops: s.comms.values().map(|c| c.redops.len()).sum(),
        pending_inits: s
            .inits
            .values()
            .map(|i| i.devices.iter().flatten().count() - i.taken)
            .sum(),
        unmatched_operations: s
            .cliques
            .iter()
            .filter_map(|c| c.upgrade())
            .map(|c| c.pending())
            .sum(),
    }
}

/// Work deferred by a group until `ncclGroupEnd`.
enum Deferred {
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
    Init {
        handle: usize,
        id: Vec<u8>,
        nranks: usize,
        rank: usize,
        device: i32,
    },
}

#[derive(Default)]
struct Group {
    depth: u32,
    deferred: Vec<Deferred>,
}

thread_local! {
    static GROUPS: RefCell<HashMap<u64, Group>> = RefCell::new(HashMap::new());
}

fn in_group(world: u64) -> bool {
    GROUPS.with(|g| g.borrow().get(&world).is_some_and(|g| g.depth > 0))
}

fn defer(world: u64, d: Deferred) {
    GROUPS.with(|g| g.borrow_mut().entry(world).or_default().deferred.push(d));
}

pub(super) fn resolver(slot: usize, version: i32) -> impl FnMut(&CStr, i32) -> *const c_void {
    move |name: &CStr, _| {
        if NcclFns::OPTIONAL
            .iter()
            .any(|(n, v)| n.as_bytes() == name.to_bytes() && *v > version)
        {
            return std::ptr::null();
        }
        match LOOKUPS.get(slot) {
            Some(f) => f(name.to_bytes()),
            None => std::ptr::null(),
        }
    }
}

static LOOKUPS: [fn(&[u8]) -> *const c_void; cuda_sys::mock::MAX_WORLDS] =
    cuda_sys::__mock_lookups!(lookup);

fn h2p<T>(h: usize) -> *mut T {
    std::ptr::without_provenance_mut(h)
}

fn p2h<T>(p: *mut T) -> usize {
    p.addr()
}

fn fail(s: &mut State, rc: ncclResult_t, msg: String) -> ncclResult_t {
    s.error(msg);
    rc
}

/// Registers a rank of an init and returns its clique once every rank has come, or an
/// error at the deadline.
fn join_init(
    w: &NWorld,
    id: &[u8],
    nranks: usize,
    rank: usize,
    device: i32,
) -> Result<Arc<Clique>, ncclResult_t> {
    let deadline = Instant::now() + w.timeout;
    let mut s = w.lock();
    {
        let init = s.inits.entry(id.to_vec()).or_insert_with(|| Init {
            nranks,
            devices: vec![None; nranks],
            clique: None,
            taken: 0,
        });
        if init.nranks != nranks {
            let msg = format!(
                "rank {rank} asked for {nranks} ranks, another rank for {}",
                init.nranks
            );
            return Err(fail(&mut s, ncclResult_t::ncclInvalidUsage, msg));
        }
        if init.devices[rank].is_some() {
            return Err(fail(
                &mut s,
                ncclResult_t::ncclInvalidUsage,
                format!("rank {rank} joined twice"),
            ));
        }
        init.devices[rank] = Some(device);
        if init.devices.iter().all(Option::is_some) {
            let clique = Clique::new(init.devices.iter().map(|d| d.unwrap_or(0)).collect());
            init.clique = Some(clique.clone());
            s.cliques.push(Arc::downgrade(&clique));
            w.cond.notify_all();
        }
    }
    loop {
        let cancelled = s
            .inits
            .get(id)
            .is_none_or(|i| i.clique.is_none() && i.devices.get(rank).is_some_and(Option::is_none));
        if cancelled {
            let msg = format!("rank {rank}: init aborted");
            return Err(fail(&mut s, ncclResult_t::ncclInvalidUsage, msg));
        }
        let ready = s.inits.get(id).and_then(|i| i.clique.clone());
        if let Some(c) = ready {
            let remove = match s.inits.get_mut(id) {
                Some(i) => {
                    i.taken += 1;
                    i.taken == i.nranks
                }
                None => false,
            };
            if remove {
                s.inits.remove(id);
            }
            return Ok(c);
        }
        let now = Instant::now();
        if now >= deadline {
            if let Some(i) = s.inits.get_mut(id) {
                i.devices[rank] = None;
                if i.devices.iter().all(Option::is_none) {
                    s.inits.remove(id);
                }
            }
            let msg = format!(
                "rank {rank}: not every rank of {nranks} joined within {:?}",
                w.timeout
            );
            return Err(fail(&mut s, ncclResult_t::ncclSystemError, msg));
        }
        s = w
            .cond
            .wait_timeout(s, deadline - now)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}

fn new_comm(
    s: &mut State,
    w: &NWorld,
    clique: Option<Arc<Clique>>,
    rank: usize,
    size: usize,
    device: i32,
) -> usize {
    let h = s.handle(w.id);
    s.comms.insert(
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
            init: None,
        },
    );
    h
}

fn current_device(w: &NWorld) -> i32 {
    w.cuda.current_device().unwrap_or(0)
}

fn init_rank(
    w: &NWorld,
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    blocking: bool,
) -> ncclResult_t {
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
    let device = current_device(w);
    let key: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    if in_group(w.id) {
        let h = {
            let mut s = w.lock();
            let h = new_comm(&mut s, w, None, r, n, device);
            if let Some(c) = s.comms.get_mut(&h) {
                c.async_err = ncclResult_t::ncclInProgress;
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
            let h = new_comm(&mut s, w, None, r, n, device);
            if let Some(c) = s.comms.get_mut(&h) {
                c.async_err = ncclResult_t::ncclInProgress;
                c.blocking = false;
                c.init = Some((key.clone(), r));
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
    match join_init(w, &key, n, r, device) {
        Ok(clique) => {
            let mut s = w.lock();
            let h = new_comm(&mut s, w, Some(clique), r, n, device);
            // SAFETY: checked non-null out-pointer.
            unsafe { *out = h2p(h) };
            ncclResult_t::ncclSuccess
        }
        Err(rc) => rc,
    }
}

/// Completes a deferred or non-blocking init of comm `h`.
fn finish_init(w: &NWorld, h: usize, key: &[u8], n: usize, r: usize, device: i32) -> ncclResult_t {
    let res = join_init(w, key, n, r, device);
    let mut s = w.lock();
    match (res, s.comms.get_mut(&h)) {
        (Ok(clique), Some(c)) => {
            c.clique = Some(clique);
            c.async_err = ncclResult_t::ncclSuccess;
            c.init = None;
            ncclResult_t::ncclSuccess
        }
        (Err(rc), Some(c)) => {
            c.async_err = rc;
            rc
        }
        (_, None) => ncclResult_t::ncclInvalidArgument,
    }
}

/// The world as an `Arc`, for work that outlives the call (non-blocking init).
fn slot_of(w: &NWorld) -> Option<Arc<NWorld>> {
    (0..cuda_sys::mock::MAX_WORLDS)
        .filter_map(slot_world)
        .find(|x| x.id == w.id)
}

/// Checks that `[ptr, ptr + bytes)` is simulated device memory on `device`.
fn check_buffer(
    w: &NWorld,
    s: &mut State,
    what: &str,
    ptr: usize,
    bytes: usize,
    device: i32,
) -> Result<(), ncclResult_t> {
    if bytes == 0 {
        return Ok(());
    }
    match w.cuda.device_range(ptr as u64, bytes) {
        Some(d) if d == device => Ok(()),
        Some(d) => Err(fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!("{what} lives on device {d}, the communicator on device {device}"),
        )),
        None => Err(fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!("{what} {ptr:#x} ({bytes} bytes) is not device memory"),
        )),
    }
}

/// Everything a collective call checks before it is queued.
struct Call {
    kind: Kind,
    send: usize,
    recv: usize,
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
}

fn collective(w: &NWorld, mut s: std::sync::MutexGuard<'_, State>, call: Call) -> ncclResult_t {
    if w.null_ops {
        return ncclResult_t::ncclSuccess;
    }
    let Some(esize) = dtype::size_of(call.dtype) else {
        return fail(
            &mut s,
            ncclResult_t::ncclInvalidArgument,
            format!("invalid datatype {}", call.dtype.0),
        );
    };
    if dtype::introduced(call.dtype).is_some_and(|v| v > w.version) {
        return fail(
            &mut s,
            ncclResult_t::ncclInvalidArgument,
            format!("datatype {} needs a newer NCCL", call.dtype.0),
        );
    }
    let h = p2h(call.comm);
    let Some(comm) = s.comms.get(&h) else {
        return fail(
            &mut s,
            ncclResult_t::ncclInvalidArgument,
            "invalid communicator".into(),
        );
    };
    let Some(clique) = comm.clique.clone() else {
        return fail(
            &mut s,
            ncclResult_t::ncclInvalidUsage,
            "communicator is not initialised yet".into(),
        );
    };
    let (rank, size, device, blocking) = (comm.rank, comm.size, comm.device, comm.blocking);
    let needs_root = matches!(
        call.kind,
        Kind::Broadcast | Kind::Reduce | Kind::Gather | Kind::Scatter
    );
    if needs_root && (call.root < 0 || call.root as usize >= size) {
        return fail(
            &mut s,
            ncclResult_t::ncclInvalidArgument,
            format!("invalid root {} for {size} ranks", call.root),
        );
    }
    let op = if matches!(
        call.kind,
        Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter
    ) {
        match call.op.0 {
            0..=3 => Op::Builtin(call.op),
            4 => Op::Avg,
            id => match comm.redops.get(&id) {
                Some(p) => {
                    if p.dtype != call.dtype {
                        return fail(
                            &mut s,
                            ncclResult_t::ncclInvalidArgument,
                            "op created for another datatype".into(),
                        );
                    }
                    let mut b = [0u8; 8];
                    // SAFETY: the scalar pointer was given at op creation: host memory of one
                    // element, or simulated device memory (checked there).
                    unsafe {
                        std::ptr::copy_nonoverlapping(p.scalar as *const u8, b.as_mut_ptr(), esize)
                    };
                    Op::PreMul(dtype::get(call.dtype, &b, 0))
                }
                None => {
                    return fail(
                        &mut s,
                        ncclResult_t::ncclInvalidArgument,
                        format!("invalid reduction op {id}"),
                    );
                }
            },
        }
    } else {
        Op::Builtin(ncclRedOp_t::ncclSum)
    };
    let (send_n, recv_n) = match call.kind {
        Kind::AllReduce | Kind::Broadcast | Kind::Reduce => (call.count, call.count),
        Kind::AllGather | Kind::Gather => (call.count, call.count * size),
        Kind::ReduceScatter | Kind::Scatter => (call.count * size, call.count),
        Kind::AllToAll => (call.count * size, call.count * size),
    };
    let root = call.root.max(0) as usize;
    let send_used = !matches!(call.kind, Kind::Broadcast | Kind::Scatter) || rank == root;
    let recv_used = !matches!(call.kind, Kind::Reduce | Kind::Gather) || rank == root;
    if send_used
        && let Err(rc) = check_buffer(w, &mut s, "sendbuff", call.send, send_n * esize, device)
    {
        return rc;
    }
    if recv_used
        && let Err(rc) = check_buffer(w, &mut s, "recvbuff", call.recv, recv_n * esize, device)
    {
        return rc;
    }
    if let Err(rc) = check_stream(w, &mut s, call.stream, device) {
        return rc;
    }
    let Some(comm) = s.comms.get_mut(&h) else {
        return ncclResult_t::ncclInternalError;
    };
    let seq = comm.seq;
    comm.seq += 1;
    let c = Contrib {
        kind: call.kind,
        send: call.send,
        recv: call.recv,
        count: call.count,
        dtype: call.dtype,
        op,
        root: call.root,
    };
    drop(s);
    if in_group(w.id) {
        defer(
            w.id,
            Deferred::Coll {
                clique,
                seq,
                rank,
                c,
            },
        );
        return ncclResult_t::ncclSuccess;
    }
    if !blocking {
        let done = clique.submit(seq, rank, c);
        return nonblocking(w, call.comm, done);
    }
    let timeout = w.timeout;
    run_on_stream(w, call.stream, move || {
        let done = clique.submit(seq, rank, c);
        clique.wait(&done, Instant::now() + timeout)
    })
}

/// A non-blocking communicator's operation: its result if it already completed, else
/// `ncclInProgress` (ncclCommGetAsyncError reports it later).
fn nonblocking(w: &NWorld, comm: ncclComm_t, done: Done) -> ncclResult_t {
    let now = *done.lock().unwrap_or_else(|e| e.into_inner());
    match now {
        Some(rc) => rc,
        None => {
            if let Some(c) = w.lock().comms.get_mut(&p2h(comm)) {
                c.pending.push(done);
            }
            ncclResult_t::ncclInProgress
        }
    }
}

fn check_stream(
    w: &NWorld,
    s: &mut State,
    stream: cudaStream_t,
    device: i32,
) -> Result<(), ncclResult_t> {
    match w.cuda.stream_device(stream) {
        Some(d) if d == device => Ok(()),
        Some(d) => Err(fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!("stream of device {d}, communicator of device {device}"),
        )),
        None => Err(fail(
            s,
            ncclResult_t::ncclUnhandledCudaError,
            "invalid stream (or no current context)".into(),
        )),
    }
}

/// Runs `f` in `stream`'s order through the simulated driver and returns its result.
fn run_on_stream(
    w: &NWorld,
    stream: cudaStream_t,
    f: impl Fn() -> ncclResult_t + Send + Sync + 'static,
) -> ncclResult_t {
    let result = Arc::new(Mutex::new(ncclResult_t::ncclSuccess));
    let r2 = result.clone();
    let rc = w.cuda.enqueue(
        stream,
        Arc::new(move || {
            let rc = f();
            *r2.lock().unwrap_or_else(|e| e.into_inner()) = rc;
            CUresult::CUDA_SUCCESS
        }),
    );
    if rc != CUresult::CUDA_SUCCESS {
        return ncclResult_t::ncclUnhandledCudaError;
    }
    let rc = *result.lock().unwrap_or_else(|e| e.into_inner());
    if rc != ncclResult_t::ncclSuccess {
        let msg = format!("operation failed: {}", rc.name().unwrap_or("?"));
        w.lock().error(msg);
    }
    rc
}

#[allow(clippy::too_many_arguments)] // the C call's arguments, one for one
fn p2p(
    w: &NWorld,
    mut s: std::sync::MutexGuard<'_, State>,
    is_send: bool,
    ptr: usize,
    count: usize,
    dt: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    if w.null_ops {
        return ncclResult_t::ncclSuccess;
    }
    let Some(esize) = dtype::size_of(dt) else {
        return fail(
            &mut s,
            ncclResult_t::ncclInvalidArgument,
            format!("invalid datatype {}", dt.0),
        );
    };
    let Some(c) = s.comms.get(&p2h(comm)) else {
        return fail(
            &mut s,
            ncclResult_t::ncclInvalidArgument,
            "invalid communicator".into(),
        );
    };
    let Some(clique) = c.clique.clone() else {
        return fail(
            &mut s,
            ncclResult_t::ncclInvalidUsage,
            "communicator is not initialised yet".into(),
        );
    };
    let (rank, size, device, blocking) = (c.rank, c.size, c.device, c.blocking);
    if peer < 0 || peer as usize >= size {
        return fail(
            &mut s,
            ncclResult_t::ncclInvalidArgument,
            format!("invalid peer {peer} for {size} ranks"),
        );
    }
    if let Err(rc) = check_buffer(
        w,
        &mut s,
        if is_send { "sendbuff" } else { "recvbuff" },
        ptr,
        count * esize,
        device,
    ) {
        return rc;
    }
    if let Err(rc) = check_stream(w, &mut s, stream, device) {
        return rc;
    }
    drop(s);
    let (src, dst) = if is_send {
        (rank, peer as usize)
    } else {
        (peer as usize, rank)
    };
    if in_group(w.id) {
        defer(
            w.id,
            Deferred::P2p {
                clique,
                is_send,
                src,
                dst,
                ptr,
                count,
                dtype: dt,
            },
        );
        return ncclResult_t::ncclSuccess;
    }
    if !blocking {
        let done = clique.post(is_send, src, dst, ptr, count, dt);
        return nonblocking(w, comm, done);
    }
    let timeout = w.timeout;
    run_on_stream(w, stream, move || {
        let done = clique.post(is_send, src, dst, ptr, count, dt);
        clique.wait(&done, Instant::now() + timeout)
    })
}

fn group_end(w: &NWorld) -> ncclResult_t {
    let work = GROUPS.with(|g| {
        let mut g = g.borrow_mut();
        let grp = g.entry(w.id).or_default();
        if grp.depth == 0 {
            return None;
        }
        grp.depth -= 1;
        Some(if grp.depth == 0 {
            std::mem::take(&mut grp.deferred)
        } else {
            Vec::new()
        })
    });
    let Some(work) = work else {
        return fail(
            &mut w.lock(),
            ncclResult_t::ncclInvalidUsage,
            "ncclGroupEnd without ncclGroupStart".into(),
        );
    };
    let deadline = Instant::now() + w.timeout;
    let mut waits: Vec<(Arc<Clique>, Done)> = Vec::new();
    let mut inits = Vec::new();
    for d in work {
        match d {
            Deferred::Coll {
                clique,
                seq,
                rank,
                c,
            } => {
                let done = clique.submit(seq, rank, c);
                waits.push((clique, done));
            }
            Deferred::P2p {
                clique,
                is_send,
                src,
                dst,
                ptr,
                count,
                dtype,
            } => {
                let done = clique.post(is_send, src, dst, ptr, count, dtype);
                waits.push((clique, done));
            }
            Deferred::Init {
                handle,
                id,
                nranks,
                rank,
                device,
            } => inits.push((handle, id, nranks, rank, device)),
        }
    }
    let mut rc = ncclResult_t::ncclSuccess;
    // Inits of one thread's group join one by one; the rendezvous completes on the last.
    if !inits.is_empty() {
        let Some(world) = slot_of(w) else {
            return ncclResult_t::ncclInternalError;
        };
        let threads: Vec<_> = inits
            .into_iter()
            .map(|(h, id, n, r, d)| {
                let world = world.clone();
                std::thread::spawn(move || finish_init(&world, h, &id, n, r, d))
            })
            .collect();
        for t in threads {
            let r = t.join().unwrap_or(ncclResult_t::ncclInternalError);
            if rc == ncclResult_t::ncclSuccess {
                rc = r;
            }
        }
    }
    for (clique, done) in waits {
        let r = clique.wait(&done, deadline);
        if rc == ncclResult_t::ncclSuccess {
            rc = r;
        }
    }
    rc
}

macro_rules! nccl_mock {
    ($(
        fn $cname:ident = $rname:ident ($w:ident, $s:ident $(, $a:ident : $t:ty)*) $body:block
    )*) => {
        $(
            #[allow(non_snake_case)]
            unsafe extern "C" fn $rname<const W: usize>($($a: $t),*) -> ncclResult_t {
                let Some(world) = slot_world(W) else {
                    return ncclResult_t::ncclInternalError;
                };
                let $w: &NWorld = &world;
                #[allow(unused_mut)]
                let mut $s = $w.lock();
                if let Some(e) = $s.enter(stringify!($cname)) {
                    return e;
                }
                $body
            }
        )*

        fn lookup<const W: usize>(name: &[u8]) -> *const c_void {
            $(
                if name == stringify!($cname).as_bytes() {
                    let f: crate::fns::signatures::$cname = $rname::<W>;
                    return f as *const c_void;
                }
            )*
            if name == b"ncclGetErrorString" {
                let f: crate::fns::signatures::ncclGetErrorString = get_error_string;
                return f as *const c_void;
            }
            if name == b"ncclGetLastError" {
                let f: crate::fns::signatures::ncclGetLastError = get_last_error::<W>;
                return f as *const c_void;
            }
            std::ptr::null()
        }
    };
}

unsafe extern "C" fn get_error_string(rc: ncclResult_t) -> *const c_char {
    match rc {
        ncclResult_t::ncclSuccess => c"no error".as_ptr(),
        ncclResult_t::ncclUnhandledCudaError => c"unhandled cuda error (simulated)".as_ptr(),
        ncclResult_t::ncclSystemError => c"unhandled system error (simulated)".as_ptr(),
        ncclResult_t::ncclInternalError => c"internal error (simulated)".as_ptr(),
        ncclResult_t::ncclInvalidArgument => c"invalid argument (simulated)".as_ptr(),
        ncclResult_t::ncclInvalidUsage => c"invalid usage (simulated)".as_ptr(),
        ncclResult_t::ncclRemoteError => {
            c"remote process exited or there was a network error (simulated)".as_ptr()
        }
        ncclResult_t::ncclInProgress => c"NCCL operation in progress".as_ptr(),
        ncclResult_t::ncclTimeout => c"timeout (simulated)".as_ptr(),
        _ => c"unknown result code".as_ptr(),
    }
}

unsafe extern "C" fn get_last_error<const W: usize>(_comm: ncclComm_t) -> *const c_char {
    let Some(w) = slot_world(W) else {
        return c"".as_ptr();
    };
    let s = w.lock();
    // The string lives in the world until the next error, as NCCL's does until the next call.
    s.last_error.as_ref().map_or(c"".as_ptr(), |e| e.as_ptr())
}

nccl_mock! {
    fn ncclGetVersion = get_version(w, s, v: *mut c_int) {
        let _ = &s;
        if v.is_null() {
            return ncclResult_t::ncclInvalidArgument;
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *v = w.version };
        ncclResult_t::ncclSuccess
    }
    fn ncclGetUniqueId = get_unique_id(w, s, id: *mut ncclUniqueId) {
        if id.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, "uniqueId is NULL".into());
        }
        let mut bytes = [0u8; 128];
        match std::env::var("NCCL_COMM_ID") {
            // Like NCCL: with NCCL_COMM_ID every call gives the same id (the address).
            Ok(addr) if !addr.is_empty() => {
                bytes[..8].copy_from_slice(b"MOCKADDR");
                let a = addr.as_bytes();
                let n = a.len().min(120);
                bytes[8..8 + n].copy_from_slice(&a[..n]);
            }
            _ => {
                s.id_counter += 1;
                bytes[..8].copy_from_slice(b"MOCKNCCL");
                bytes[8..16].copy_from_slice(&w.id.to_le_bytes());
                bytes[16..24].copy_from_slice(&s.id_counter.to_le_bytes());
                bytes[24..32].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
            }
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { (*id).internal = bytes.map(|b| b as c_char) };
        ncclResult_t::ncclSuccess
    }
    fn ncclCommInitRank = comm_init_rank(w, s, comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int) {
        drop(s);
        init_rank(w, comm, nranks, id, rank, true)
    }
    fn ncclCommInitRankConfig = comm_init_rank_config(w, s, comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t) {
        let blocking = if config.is_null() {
            true
        } else {
            // SAFETY: non-null; the caller passes an initialised config (we read only the
            // header and `blocking`, present since 2.14).
            let c = unsafe { &*config };
            if c.magic != NCCL_API_MAGIC {
                return fail(&mut s, ncclResult_t::ncclInvalidArgument, "config not initialised with NCCL_CONFIG_INITIALIZER".into());
            }
            c.blocking != 0
        };
        drop(s);
        init_rank(w, comm, nranks, id, rank, blocking)
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
            let h = new_comm(&mut s, w, Some(clique.clone()), r, n, *d);
            // SAFETY: the caller passes room for `ndev` handles.
            unsafe { *comms.add(r) = h2p(h) };
        }
        ncclResult_t::ncclSuccess
    }
    fn ncclCommFinalize = comm_finalize(w, s, comm: ncclComm_t) {
        let _ = w;
        match s.comms.get(&p2h(comm)) {
            Some(c) if !c.blocking && c.pending.iter().any(|d| d.lock().unwrap_or_else(|x| x.into_inner()).is_none()) => {
                ncclResult_t::ncclInProgress
            }
            Some(_) => ncclResult_t::ncclSuccess,
            None => ncclResult_t::ncclInvalidArgument,
        }
    }
    fn ncclCommDestroy = comm_destroy(w, s, comm: ncclComm_t) {
        let _ = w;
        if s.comms.remove(&p2h(comm)).is_some() { ncclResult_t::ncclSuccess } else { ncclResult_t::ncclInvalidArgument }
    }
    fn ncclCommAbort = comm_abort(w, s, comm: ncclComm_t) {
        match s.comms.remove(&p2h(comm)) {
            Some(c) => {
                if let Some(cl) = c.clique {
                    cl.abort();
                }
                if let Some((key, rank)) = c.init {
                    // A rank still joining leaves the rendezvous.
                    if let Some(i) = s.inits.get_mut(&key) {
                        if let Some(d) = i.devices.get_mut(rank) {
                            *d = None;
                        }
                        if i.devices.iter().all(Option::is_none) {
                            s.inits.remove(&key);
                        }
                    }
                    w.cond.notify_all();
                }
                ncclResult_t::ncclSuccess
            }
            None => ncclResult_t::ncclInvalidArgument,
        }
    }
    fn ncclCommSplit = comm_split(w, s, comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) {
        let _ = config;
        if newcomm.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, "newcomm is NULL".into());
        }
        let Some(c) = s.comms.get_mut(&p2h(comm)) else {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, "invalid communicator".into());
        };
        let Some(clique) = c.clique.clone() else { return ncclResult_t::ncclInvalidUsage };
        if color < 0 && color != NCCL_SPLIT_NOCOLOR {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("invalid color {color}"));
        }
        let (seq, rank, device) = (c.split_seq, c.rank, c.device);
        c.split_seq += 1;
        drop(s);
        match clique.split(seq, rank, color, key, Instant::now() + w.timeout) {
            Ok(out) => {
                let mut s = w.lock();
                let h = match out.clique {
                    Some(cl) => {
                        let size = cl.size;
                        s.cliques.push(Arc::downgrade(&cl));
                        new_comm(&mut s, w, Some(cl), out.rank, size, device)
                    }
                    None => 0,
                };
                // SAFETY: checked non-null out-pointer.
                unsafe { *newcomm = h2p(h) };
                ncclResult_t::ncclSuccess
            }
            Err(rc) => rc,
        }
    }
    fn ncclCommGetAsyncError = comm_get_async_error(w, s, comm: ncclComm_t, err: *mut ncclResult_t) {
        let _ = w;
        if err.is_null() {
            return ncclResult_t::ncclInvalidArgument;
        }
        let Some(c) = s.comms.get_mut(&p2h(comm)) else { return ncclResult_t::ncclInvalidArgument };
        let mut e = match &c.clique {
            Some(cl) if cl.is_aborted() => ncclResult_t::ncclRemoteError,
            _ => c.async_err,
        };
        if e == ncclResult_t::ncclSuccess {
            // Completed operations leave the list; the first failure is reported.
            let mut failed = None;
            c.pending.retain(|d| match *d.lock().unwrap_or_else(|x| x.into_inner()) {
                Some(ncclResult_t::ncclSuccess) => false,
                Some(rc) => {
                    failed.get_or_insert(rc);
                    false
                }
                None => true,
            });
            e = match failed {
                Some(rc) => rc,
                None if !c.pending.is_empty() => ncclResult_t::ncclInProgress,
                None => ncclResult_t::ncclSuccess,
            };
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *err = e };
        ncclResult_t::ncclSuccess
    }
    fn ncclCommCount = comm_count(w, s, comm: ncclComm_t, out: *mut c_int) {
        let _ = w;
        match (s.comms.get(&p2h(comm)), out.is_null()) {
            (Some(c), false) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *out = c.size as c_int };
                ncclResult_t::ncclSuccess
            }
            _ => ncclResult_t::ncclInvalidArgument,
        }
    }
    fn ncclCommCuDevice = comm_cu_device(w, s, comm: ncclComm_t, out: *mut c_int) {
        let _ = w;
        match (s.comms.get(&p2h(comm)), out.is_null()) {
            (Some(c), false) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *out = c.device };
                ncclResult_t::ncclSuccess
            }
            _ => ncclResult_t::ncclInvalidArgument,
        }
    }
    fn ncclCommUserRank = comm_user_rank(w, s, comm: ncclComm_t, out: *mut c_int) {
        let _ = w;
        match (s.comms.get(&p2h(comm)), out.is_null()) {
            (Some(c), false) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *out = c.rank as c_int };
                ncclResult_t::ncclSuccess
            }
            _ => ncclResult_t::ncclInvalidArgument,
        }
    }
    fn ncclRedOpCreatePreMulSum = red_op_create(w, s, op: *mut ncclRedOp_t, scalar: *mut c_void, dt: ncclDataType_t, residence: ncclScalarResidence_t, comm: ncclComm_t) {
        if op.is_null() || scalar.is_null() || dtype::size_of(dt).is_none() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, "invalid op, scalar or datatype".into());
        }
        let device_resident = residence == ncclScalarResidence_t::ncclScalarDevice;
        let esize = dtype::size_of(dt).unwrap_or(1);
        if device_resident && w.cuda.device_range(scalar.addr() as u64, esize).is_none() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, "device scalar is not device memory".into());
        }
        let Some(c) = s.comms.get_mut(&p2h(comm)) else { return ncclResult_t::ncclInvalidArgument };
        let id = ncclRedOp_t::ncclNumOps.0 + c.next_op;
        c.next_op += 1;
        // A host scalar is read now (NCCL copies it); keep a private copy.
        let stored = if device_resident {
            scalar.addr()
        } else {
            let mut b = Box::new([0u8; 8]);
            // SAFETY: the caller's scalar holds one element of `dt`.
            unsafe { std::ptr::copy_nonoverlapping(scalar as *const u8, b.as_mut_ptr(), esize) };
            Box::into_raw(b).expose_provenance()
        };
        c.redops.insert(id, PreMul { scalar: stored, dtype: dt, device_resident });
        // SAFETY: checked non-null out-pointer.
        unsafe { *op = ncclRedOp_t(id) };
        ncclResult_t::ncclSuccess
    }
    fn ncclRedOpDestroy = red_op_destroy(w, s, op: ncclRedOp_t, comm: ncclComm_t) {
        let _ = w;
        let Some(c) = s.comms.get_mut(&p2h(comm)) else { return ncclResult_t::ncclInvalidArgument };
        match c.redops.remove(&op.0) {
            Some(p) => {
                if !p.device_resident {
                    // SAFETY: made by Box::into_raw in ncclRedOpCreatePreMulSum, freed once.
                    drop(unsafe { Box::from_raw(std::ptr::with_exposed_provenance_mut::<[u8; 8]>(p.scalar)) });
                }
                ncclResult_t::ncclSuccess
            }
            None => ncclResult_t::ncclInvalidArgument,
        }
    }
    fn ncclReduce = reduce(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { kind: Kind::Reduce, send: send.addr(), recv: recv.addr(), count, dtype: dt, op, root, comm, stream })
    }
    fn ncclBcast = bcast(w, s, buf: *mut c_void, count: usize, dt: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { kind: Kind::Broadcast, send: buf.addr(), recv: buf.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root, comm, stream })
    }
    fn ncclBroadcast = broadcast(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { kind: Kind::Broadcast, send: send.addr(), recv: recv.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root, comm, stream })
    }
    fn ncclAllReduce = all_reduce(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { kind: Kind::AllReduce, send: send.addr(), recv: recv.addr(), count, dtype: dt, op, root: 0, comm, stream })
    }
    fn ncclReduceScatter = reduce_scatter(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { kind: Kind::ReduceScatter, send: send.addr(), recv: recv.addr(), count, dtype: dt, op, root: 0, comm, stream })
    }
    fn ncclAllGather = all_gather(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { kind: Kind::AllGather, send: send.addr(), recv: recv.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root: 0, comm, stream })
    }
    fn ncclAlltoAll = all_to_all(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { kind: Kind::AllToAll, send: send.addr(), recv: recv.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root: 0, comm, stream })
    }
    fn ncclGather = gather(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { kind: Kind::Gather, send: send.addr(), recv: recv.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root, comm, stream })
    }
    fn ncclScatter = scatter(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { kind: Kind::Scatter, send: send.addr(), recv: recv.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root, comm, stream })
    }
    fn ncclSend = send(w, s, buf: *const c_void, count: usize, dt: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        p2p(w, s, true, buf.addr(), count, dt, peer, comm, stream)
    }
    fn ncclRecv = recv(w, s, buf: *mut c_void, count: usize, dt: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        p2p(w, s, false, buf.addr(), count, dt, peer, comm, stream)
    }
    fn ncclGroupStart = group_start(w, s) {
        drop(s);
        GROUPS.with(|g| g.borrow_mut().entry(w.id).or_default().depth += 1);
        ncclResult_t::ncclSuccess
    }
    fn ncclGroupEnd = group_end_fn(w, s) {
        drop(s);
        group_end(w)
    }
}
