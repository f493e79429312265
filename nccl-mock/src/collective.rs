//! Collectives and point-to-point transfers: the checks a call makes before anything is
//! queued, and how the work then runs (deferred by a group, in the background for a
//! non-blocking communicator, or in the stream's order through the simulated driver).
//!
//! Whenever a rank's part is due to run, the driver's sanitizer checks the device ranges
//! it really reads and writes ([`Touch`]) and records them as uses on the stream; a part
//! refused there is withdrawn from its clique, so its peers fail instead of hanging.

use crate::notice::Notice;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use cuda_mock::Touch;
use cuda_sys::CUresult;

use crate::dtype;
use crate::macros::mock_fns;
use crate::parts::{Contrib, Done, Kind, Op, Placement};
use crate::redop;
use crate::state::{State, fail};
use crate::thread_groups::{Deferred, defer, in_group};
use crate::work::{Part, Work, admit, overlapping};
use crate::world::{NWorld, slot_of};
use nccl_sys::*;

/// Checks that `[ptr, ptr + bytes)` is simulated device memory on `device`.
pub(crate) fn check_buffer(
    w: &NWorld,
    s: &mut State,
    call: &str,
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
        None => {
            // Memory freed already: what a sanitizer reports (the call is refused too).
            if let Some(by) = w.cuda.freed_by(ptr as u64, bytes) {
                w.cuda
                    .report(format!("{call}: {what} {ptr:#x}+{bytes}: freed by {by}"));
            }
            Err(fail(
                s,
                ncclResult_t::ncclInvalidArgument,
                format!("{what} {ptr:#x} ({bytes} bytes) is not device memory"),
            ))
        }
    }
}

pub(crate) fn check_stream(
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

/// Runs checked work: deferred by an open group, in the background on a non-blocking
/// communicator, or in the stream's order.
pub(crate) fn dispatch(w: &NWorld, work: Work, blocking: bool) -> ncclResult_t {
    if in_group(w.id) {
        defer(w.id, Deferred::Work(work));
        return ncclResult_t::ncclSuccess;
    }
    if !blocking {
        if let Err(rc) = work.admit(w, work.call) {
            return rc;
        }
        let done = work.part.start(&w.cuda);
        let rc = nonblocking(w, work.comm, done, work.part.seq());
        if rc == ncclResult_t::ncclInvalidUsage
            && let Some(why) = work.part.disagreement()
        {
            w.lock().error(why);
        }
        return rc;
    }
    run_on_stream(w, work)
}

/// A non-blocking communicator's operation: its result if it already completed, else
/// `ncclInProgress` (ncclCommGetAsyncError reports it later).
fn nonblocking(w: &NWorld, comm: usize, done: Done, seq: Option<u64>) -> ncclResult_t {
    let now = *done.lock().unwrap_or_else(|e| e.into_inner());
    match now {
        Some(rc) => rc,
        None => {
            if let Some(c) = w.lock().comms.get_mut(&comm) {
                if let Some(seq) = seq {
                    c.collectives.push((done.clone(), seq));
                }
                c.pending.push(done);
            }
            ncclResult_t::ncclInProgress
        }
    }
}

/// Runs `work` in its stream's order through the simulated driver's sanitizer (now, or
/// at each launch of the graph a capturing stream records it into) and returns its
/// result when it ran now.
fn run_on_stream(w: &NWorld, work: Work) -> ncclResult_t {
    let Work {
        call,
        comm,
        stream,
        touches,
        regs,
        part,
    } = work;
    let part = Arc::new(part);
    let result = Arc::new(Mutex::new(ncclResult_t::ncclSuccess));
    let ran = Arc::new(AtomicBool::new(false));
    // Weak: a graph holding the op must not keep the worlds alive.
    let world: Weak<NWorld> = slot_of(w).as_ref().map_or_else(Weak::new, Arc::downgrade);
    let cuda = w.cuda.downgrade();
    let timeout = w.timeout;
    let (r2, ran2, part2) = (result.clone(), ran.clone(), part.clone());
    let op = Arc::new(move || {
        ran2.store(true, Ordering::Relaxed);
        // A captured op replayed after its communicator went is a use after free.
        if let Some(w) = world.upgrade() {
            let dead = w.lock().dead.get(&comm).copied();
            if let Some(by) = dead {
                w.cuda.report(format!(
                    "{call}: communicator {comm:#x} was freed by {by} before the work ran"
                ));
                *r2.lock().unwrap_or_else(|e| e.into_inner()) = ncclResult_t::ncclInvalidArgument;
                part2.withdraw();
                return CUresult::CUDA_ERROR_ILLEGAL_ADDRESS;
            }
            // A suspended communicator's memory is released: reported and refused.
            let suspended = w.lock().refuse_suspended(&w, call, comm).is_err();
            if suspended {
                *r2.lock().unwrap_or_else(|e| e.into_inner()) = ncclResult_t::ncclInvalidUsage;
                part2.withdraw();
                return CUresult::CUDA_ERROR_ILLEGAL_ADDRESS;
            }
            // Registrations it resolved at enqueue must still be there; the use is
            // recorded where the driver runs the op (the launch stream at a replay), for
            // the registrations and for a suspend of the communicator.
            crate::work::note_comm_use(&w, comm, call, w.cuda.running_op());
            if !admit(&w, call, &regs, w.cuda.running_op()) {
                *r2.lock().unwrap_or_else(|e| e.into_inner()) = ncclResult_t::ncclInvalidArgument;
                part2.withdraw();
                return CUresult::CUDA_ERROR_ILLEGAL_ADDRESS;
            }
        }
        // The driver runs this op, so it is alive.
        let Some(cuda) = cuda.upgrade() else {
            part2.withdraw();
            *r2.lock().unwrap_or_else(|e| e.into_inner()) = ncclResult_t::ncclInternalError;
            return CUresult::CUDA_ERROR_DEINITIALIZED;
        };
        let done = part2.start(&cuda);
        // Runs on the caller's thread (or a graph launch's), which blocks here: said on
        // stderr when it lasts.
        let notice = Notice::new(timeout, Some(|| part2.describe(call)));
        let rc = part2
            .clique()
            .wait_noticed(&done, Instant::now() + timeout, notice);
        *r2.lock().unwrap_or_else(|e| e.into_inner()) = rc;
        if rc == ncclResult_t::ncclUnhandledCudaError {
            // Its own buffer was illegal when the data moved (the driver reported it):
            // the op fails like any other illegal one, a graph launch too.
            return CUresult::CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        CUresult::CUDA_SUCCESS
    });
    let rc = w.cuda.enqueue_op(stream, call, touches, op);
    if rc != CUresult::CUDA_SUCCESS {
        if !ran.load(Ordering::Relaxed) {
            // Refused before it ran (the sanitizer, a bad stream): it never will, so the
            // peers must not wait for it.
            part.withdraw();
        }
        let msg = if ran.load(Ordering::Relaxed) {
            format!("{call}: the work failed in the simulated driver ({rc:?})")
        } else {
            format!("{call}: the simulated driver refused the work ({rc:?})")
        };
        w.lock().error(msg);
        return ncclResult_t::ncclUnhandledCudaError;
    }
    let rc = *result.lock().unwrap_or_else(|e| e.into_inner());
    if rc != ncclResult_t::ncclSuccess {
        let msg = part
            .disagreement()
            .filter(|_| rc == ncclResult_t::ncclInvalidUsage)
            .unwrap_or_else(|| format!("operation failed: {}", rc.name().unwrap_or("?")));
        w.lock().error(msg);
    }
    rc
}

/// Everything a collective call checks before it is queued.
struct Call {
    name: &'static str,
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

fn collective(w: &NWorld, mut s: MutexGuard<'_, State>, call: Call) -> ncclResult_t {
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
    let h = match s.check_comm(w, call.name, call.comm) {
        Ok(h) => h,
        Err(rc) => return rc,
    };
    if let Err(rc) = s.refuse_suspended(w, call.name, h) {
        return rc;
    }
    let Some(comm) = s.comms.get(&h) else {
        return ncclResult_t::ncclInternalError;
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
        match redop::resolve(&w.cuda, call.name, comm, call.op, call.dtype, esize) {
            Ok(op) => op,
            Err(msg) => return fail(&mut s, ncclResult_t::ncclInvalidArgument, msg),
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
    // Rooted collectives read the send buffer or write the receive buffer on the root only.
    let send_used = !matches!(call.kind, Kind::Broadcast | Kind::Scatter) || rank == root;
    let recv_used = !matches!(call.kind, Kind::Reduce | Kind::Gather) || rank == root;
    if send_used
        && let Err(rc) = check_buffer(
            w,
            &mut s,
            call.name,
            "sendbuff",
            call.send,
            send_n * esize,
            device,
        )
    {
        return rc;
    }
    if recv_used
        && let Err(rc) = check_buffer(
            w,
            &mut s,
            call.name,
            "recvbuff",
            call.recv,
            recv_n * esize,
            device,
        )
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
    let ranges = [
        (call.send as u64, if send_used { send_n * esize } else { 0 }),
        (call.recv as u64, if recv_used { recv_n * esize } else { 0 }),
    ];
    let regs = overlapping(&s, h, &ranges);
    let placed = ranges.map(|(ptr, len)| placement(&s, h, ptr, len));
    drop(s);
    let mut touches = Vec::with_capacity(2);
    if send_used {
        touches.push(Touch {
            ptr: call.send as u64,
            len: send_n * esize,
            what: "reads sendbuff",
        });
    }
    if recv_used {
        touches.push(Touch {
            ptr: call.recv as u64,
            len: recv_n * esize,
            what: "writes recvbuff",
        });
    }
    let c = Contrib {
        call: call.name,
        kind: call.kind,
        send: call.send,
        recv: call.recv,
        count: call.count,
        dtype: call.dtype,
        op,
        root: call.root,
        placed,
    };
    let work = Work {
        call: call.name,
        comm: h,
        stream: call.stream,
        touches,
        regs,
        part: Part::Coll {
            clique,
            seq,
            rank,
            c,
        },
    };
    dispatch(w, work, blocking)
}

/// Where `len` bytes at `ptr` lie among communicator `h`'s symmetric windows, found as
/// NCCL finds a buffer's window (`ncclDevrFindWindow`): the window with the greatest
/// start at or below `ptr` that holds `ptr`; a buffer that starts in no window is in none
/// (NCCL runs it on its plain path), one that starts in a window and runs past its end
/// straddles it.
fn placement(s: &State, h: usize, ptr: u64, len: usize) -> Placement {
    if len == 0 {
        return Placement::Unused;
    }
    let found = s
        .regs
        .values()
        .filter_map(|r| {
            let place = r.win.as_ref()?;
            let symmetric = place.flags & NCCL_WIN_COLL_SYMMETRIC as i32 != 0;
            let holds = r.ptr <= ptr && ptr - r.ptr < r.len as u64;
            (r.comm == h && symmetric && holds).then_some((r.ptr, r.len, place.seq))
        })
        .max_by_key(|(start, ..)| *start);
    match found {
        None => Placement::Outside,
        Some((start, bytes, window)) if ptr - start + len as u64 <= bytes as u64 => {
            Placement::Inside {
                window,
                offset: ptr - start,
            }
        }
        Some((_, _, window)) => Placement::Straddles { window },
    }
}

#[allow(clippy::too_many_arguments)] // the C call's arguments, one for one
fn p2p(
    w: &NWorld,
    mut s: MutexGuard<'_, State>,
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
    let name = if is_send { "ncclSend" } else { "ncclRecv" };
    let Some(esize) = dtype::size_of(dt) else {
        return fail(
            &mut s,
            ncclResult_t::ncclInvalidArgument,
            format!("invalid datatype {}", dt.0),
        );
    };
    let h = match s.check_comm(w, name, comm) {
        Ok(h) => h,
        Err(rc) => return rc,
    };
    if let Err(rc) = s.refuse_suspended(w, name, h) {
        return rc;
    }
    let Some(c) = s.comms.get(&h) else {
        return ncclResult_t::ncclInternalError;
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
    let what = if is_send { "sendbuff" } else { "recvbuff" };
    let call = if is_send { "ncclSend" } else { "ncclRecv" };
    if let Err(rc) = check_buffer(w, &mut s, call, what, ptr, count * esize, device) {
        return rc;
    }
    if let Err(rc) = check_stream(w, &mut s, stream, device) {
        return rc;
    }
    let regs = overlapping(&s, h, &[(ptr as u64, count * esize)]);
    drop(s);
    let (src, dst) = if is_send {
        (rank, peer as usize)
    } else {
        (peer as usize, rank)
    };
    let touch = Touch {
        ptr: ptr as u64,
        len: count * esize,
        what: if is_send {
            "reads sendbuff"
        } else {
            "writes recvbuff"
        },
    };
    let work = Work {
        call: name,
        comm: h,
        stream,
        touches: vec![touch],
        regs,
        part: Part::P2p {
            clique,
            is_send,
            src,
            dst,
            ptr,
            count,
            dtype: dt,
        },
    };
    dispatch(w, work, blocking)
}

mock_fns! {
    fn ncclReduce = reduce(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { name: CALL, kind: Kind::Reduce, send: send.addr(), recv: recv.addr(), count, dtype: dt, op, root, comm, stream })
    }
    fn ncclBcast = bcast(w, s, buf: *mut c_void, count: usize, dt: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { name: CALL, kind: Kind::Broadcast, send: buf.addr(), recv: buf.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root, comm, stream })
    }
    fn ncclBroadcast = broadcast(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { name: CALL, kind: Kind::Broadcast, send: send.addr(), recv: recv.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root, comm, stream })
    }
    fn ncclAllReduce = all_reduce(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { name: CALL, kind: Kind::AllReduce, send: send.addr(), recv: recv.addr(), count, dtype: dt, op, root: 0, comm, stream })
    }
    fn ncclReduceScatter = reduce_scatter(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { name: CALL, kind: Kind::ReduceScatter, send: send.addr(), recv: recv.addr(), count, dtype: dt, op, root: 0, comm, stream })
    }
    fn ncclAllGather = all_gather(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { name: CALL, kind: Kind::AllGather, send: send.addr(), recv: recv.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root: 0, comm, stream })
    }
    fn ncclAlltoAll = all_to_all(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { name: CALL, kind: Kind::AllToAll, send: send.addr(), recv: recv.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root: 0, comm, stream })
    }
    fn ncclGather = gather(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { name: CALL, kind: Kind::Gather, send: send.addr(), recv: recv.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root, comm, stream })
    }
    fn ncclScatter = scatter(w, s, send: *const c_void, recv: *mut c_void, count: usize, dt: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        collective(w, s, Call { name: CALL, kind: Kind::Scatter, send: send.addr(), recv: recv.addr(), count, dtype: dt, op: ncclRedOp_t::ncclSum, root, comm, stream })
    }
    fn ncclSend = send(w, s, buf: *const c_void, count: usize, dt: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        p2p(w, s, true, buf.addr(), count, dt, peer, comm, stream)
    }
    fn ncclRecv = recv(w, s, buf: *mut c_void, count: usize, dt: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) {
        p2p(w, s, false, buf.addr(), count, dt, peer, comm, stream)
    }
}
