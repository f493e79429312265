//! `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal` and `ncclWinGetUserPtr` (NCCL ≥
//! 2.29.2): the checks NCCL 2.30.7 makes at the call, and the sanitizer's:
//!
//! - `sigIdx`, `ctx` and `flags` must be 0, a wait's `opCnt` positive, as in NCCL.
//! - A put's source must lie in a live window of the communicator registered with
//!   `NCCL_WIN_COLL_SYMMETRIC`, and `peerWin` must be a live window of the communicator
//!   (a released one is reported: a use after free); NCCL does not check that the put
//!   fits the peer's window (it would write past it): the simulation reports it and
//!   refuses the call.
//! - Both windows are resolved at the call and must still be live when the put runs (in
//!   stream order, at a group's end, at each launch of a graph that captured it).
//!
//! How the operations move data and signals among the ranks, in one process and across
//! simulated processes: [`crate::rma`]. The checks at the call are the same in both
//! modes; across processes the receiver's process also checks that a put fits its
//! window when it lands.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::MutexGuard;

use cuda_mock::Touch;

use crate::collective::{check_buffer, check_stream, dispatch};
use crate::dtype;
use crate::handle::p2h;
use crate::macros::mock_fns;
use crate::rma::Rma1;
use crate::state::{State, fail};
use crate::work::{Part, Work};
use crate::world::NWorld;
use nccl_sys::*;

/// The checks shared by the three operations: a live, initialised communicator, zero
/// `sigIdx`/`ctx`/`flags`, a peer in range. Its handle, clique, rank, device and
/// blocking mode.
#[allow(clippy::type_complexity)]
fn common(
    w: &NWorld,
    s: &mut State,
    call: &'static str,
    comm: ncclComm_t,
    zeros: (c_int, c_int, c_uint),
    peer: c_int,
) -> Result<
    (
        usize,
        std::sync::Arc<crate::clique::Clique>,
        usize,
        i32,
        bool,
    ),
    ncclResult_t,
> {
    let h = s.check_comm(w, call, comm)?;
    let Some(c) = s.comms.get(&h) else {
        return Err(ncclResult_t::ncclInternalError);
    };
    let Some(clique) = c.clique.clone() else {
        return Err(fail(
            s,
            ncclResult_t::ncclInvalidUsage,
            "communicator is not initialised yet".into(),
        ));
    };
    let (rank, size, device, blocking) = (c.rank, c.size, c.device, c.blocking);
    let (sig, ctx, flags) = zeros;
    if ctx != 0 || sig != 0 || flags != 0 {
        return Err(fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!("{call}: signal index {sig}, context {ctx}, flags {flags}: each must be 0"),
        ));
    }
    if peer < 0 || peer as usize >= size {
        return Err(fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!("{call}: invalid peer {peer} for {size} ranks"),
        ));
    }
    Ok((h, clique, rank, device, blocking))
}

/// A window of communicator `h`: the live one `win` names, or the report of why not.
fn live_window(
    w: &NWorld,
    s: &mut State,
    call: &str,
    h: usize,
    win: usize,
) -> Result<(u64, usize), ncclResult_t> {
    let problem = match s.regs.get(&win) {
        Some(r) if r.window && r.comm == h => return Ok((r.ptr, r.len)),
        Some(r) => format!(
            "{call}: {win:#x} is a {} of communicator {:#x}, not a window of {h:#x}",
            r.kind(),
            r.comm
        ),
        None => match s.dead_regs.get(&win) {
            Some(by) => format!("{call}: window {win:#x} was already released by {by}"),
            None => format!("{call}: {win:#x} is not a window"),
        },
    };
    w.cuda.report(problem.clone());
    Err(fail(s, ncclResult_t::ncclInvalidArgument, problem))
}

/// Queues `op` of rank `h`'s communicator; `regs` are the windows it resolved.
#[allow(clippy::too_many_arguments)]
fn queue(
    w: &NWorld,
    s: MutexGuard<'_, State>,
    call: &'static str,
    h: usize,
    clique: std::sync::Arc<crate::clique::Clique>,
    stream: cudaStream_t,
    touches: Vec<Touch>,
    regs: Vec<usize>,
    op: Rma1,
    blocking: bool,
) -> ncclResult_t {
    drop(s);
    let work = Work {
        call,
        comm: h,
        stream,
        touches,
        regs,
        part: Part::Rma { clique, op },
    };
    dispatch(w, work, blocking)
}

mock_fns! {
    fn ncclPutSignal = put_signal(w, s, localbuff: *const c_void, count: usize, dt: ncclDataType_t, peer: c_int, peer_win: ncclWindow_t, offset: usize, sig: c_int, ctx: c_int, flags: c_uint, comm: ncclComm_t, stream: cudaStream_t) {
        if w.null_ops {
            return ncclResult_t::ncclSuccess;
        }
        let Some(esize) = dtype::size_of(dt) else {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: invalid datatype {}", dt.0));
        };
        let (h, clique, rank, device, blocking) = match common(w, &mut s, CALL, comm, (sig, ctx, flags), peer) {
            Ok(x) => x,
            Err(rc) => return rc,
        };
        if peer_win.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: peerWin is NULL"));
        }
        if localbuff.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: srcBuff is NULL"));
        }
        let win = p2h(peer_win);
        let (_, win_len) = match live_window(w, &mut s, CALL, h, win) {
            Ok(x) => x,
            Err(rc) => return rc,
        };
        let bytes = count.saturating_mul(esize);
        if offset.checked_add(bytes).is_none_or(|end| end > win_len) {
            let m = format!("{CALL}: {bytes} bytes at offset {offset} do not fit the peer's window of {win_len} bytes (NCCL would write past it)");
            w.cuda.report(m.clone());
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, m);
        }
        let src = localbuff.addr() as u64;
        // The source must lie in a symmetric window of this communicator, as NCCL 2.30.7
        // checks.
        let src_win = s.regs.iter().find(|(_, r)| {
            r.comm == h && r.ptr <= src && src < r.ptr + r.len as u64
                && r.win.as_ref().is_some_and(|p| p.flags & NCCL_WIN_COLL_SYMMETRIC as i32 != 0)
        }).map(|(k, _)| *k);
        let Some(src_win) = src_win else {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: srcWinHost is not in a valid symmetric window"));
        };
        if let Err(rc) = check_buffer(w, &mut s, CALL, "localbuff", src as usize, bytes, device) {
            return rc;
        }
        if let Err(rc) = check_stream(w, &mut s, stream, device) {
            return rc;
        }
        let seq = match s.regs.get(&win).and_then(|r| r.win.as_ref()) {
            Some(p) => p.seq,
            None => return ncclResult_t::ncclInternalError,
        };
        let touches = vec![Touch { ptr: src, len: bytes, what: "reads localbuff" }];
        let op = Rma1::Put { from: rank, to: peer as usize, data: Some((src, bytes, seq, offset as u64)) };
        queue(w, s, CALL, h, clique, stream, touches, vec![src_win, win], op, blocking)
    }
    fn ncclSignal = signal(w, s, peer: c_int, sig: c_int, ctx: c_int, flags: c_uint, comm: ncclComm_t, stream: cudaStream_t) {
        if w.null_ops {
            return ncclResult_t::ncclSuccess;
        }
        let (h, clique, rank, device, blocking) = match common(w, &mut s, CALL, comm, (sig, ctx, flags), peer) {
            Ok(x) => x,
            Err(rc) => return rc,
        };
        if let Err(rc) = check_stream(w, &mut s, stream, device) {
            return rc;
        }
        let op = Rma1::Put { from: rank, to: peer as usize, data: None };
        queue(w, s, CALL, h, clique, stream, Vec::new(), Vec::new(), op, blocking)
    }
    fn ncclWaitSignal = wait_signal(w, s, n: c_int, descs: *mut ncclWaitSignalDesc_t, comm: ncclComm_t, stream: cudaStream_t) {
        if w.null_ops {
            return ncclResult_t::ncclSuccess;
        }
        if descs.is_null() || n <= 0 {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: invalid arguments"));
        }
        // SAFETY: NCCL's contract: `descs` points at `n` descriptors (checked non-null).
        let list = unsafe { std::slice::from_raw_parts(descs, n as usize) };
        let mut checked = None;
        let mut need: Vec<(usize, u64)> = Vec::new();
        for (i, d) in list.iter().enumerate() {
            if d.opCnt <= 0 {
                return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: descriptor {i} has invalid opCnt {}", d.opCnt));
            }
            let c = match common(w, &mut s, CALL, comm, (d.sigIdx, d.ctx, 0), d.peer) {
                Ok(x) => x,
                Err(rc) => return rc,
            };
            match need.iter_mut().find(|(p, _)| *p == d.peer as usize) {
                Some((_, k)) => *k += d.opCnt as u64,
                None => need.push((d.peer as usize, d.opCnt as u64)),
            }
            checked = Some(c);
        }
        let Some((h, clique, rank, device, blocking)) = checked else {
            return ncclResult_t::ncclInternalError;
        };
        if let Err(rc) = check_stream(w, &mut s, stream, device) {
            return rc;
        }
        let op = Rma1::Wait { rank, need };
        queue(w, s, CALL, h, clique, stream, Vec::new(), Vec::new(), op, blocking)
    }
    fn ncclWinGetUserPtr = win_get_user_ptr(w, s, comm: ncclComm_t, win: ncclWindow_t, out: *mut *mut c_void) {
        let h = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        if out.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: outUserPtr is NULL"));
        }
        if !w.windows {
            // No symmetric support: NULL, and no error, as NCCL answers.
            // SAFETY: checked non-null out-pointer.
            unsafe { *out = std::ptr::null_mut() };
            return ncclResult_t::ncclSuccess;
        }
        if win.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: win is NULL"));
        }
        match live_window(w, &mut s, CALL, h, p2h(win)) {
            Ok((ptr, _)) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *out = std::ptr::with_exposed_provenance_mut(ptr as usize) };
                ncclResult_t::ncclSuccess
            }
            Err(rc) => rc,
        }
    }
}
