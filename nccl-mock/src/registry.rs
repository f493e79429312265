//! NCCL's own memory (`ncclMemAlloc`), buffer registrations (`ncclCommRegister`) and
//! windows (`ncclCommWindowRegister`), with the sanitizer's checks:
//!
//! - NCCL memory is simulated device memory that only `ncclMemFree` releases (the
//!   driver reports `cuMemFree` of it), from the host without waiting for the device:
//!   uses the host has not waited for are reported, as are frees of registered memory.
//! - A registration covers whole host pages, and registering a range an existing
//!   registration of the communicator covers hands that one out again (counted, released
//!   at the last deregistration), as NCCL does.
//! - A registration or window pins its memory in the driver (freeing it first is
//!   reported) and belongs to one communicator: deregistering it through another, twice,
//!   or while work that used it may still run (the host has not waited for it) is
//!   reported. Work enqueued while a buffer was registered uses the registration when
//!   it runs (NCCL resolved it at enqueue): if it was deregistered by then, that is
//!   reported and the work fails like an illegal access. With local registration off
//!   ([`MockNccl::local_registration`](crate::MockNccl::local_registration), NCCL's
//!   `NCCL_LOCAL_REGISTER=0`) the call succeeds with a NULL handle.
//! - Window registration is collective: the ranks' n-th windows must have one size, and
//!   the memory must come from `ncclMemAlloc` at a 4096-byte aligned offset, as NCCL
//!   requires. The handle is written at the call (NCCL writes it at the group's end
//!   inside a group; callers must not read it earlier either way). With windows off
//!   ([`MockNccl::windows`](crate::MockNccl::windows), NCCL's `NCCL_WIN_ENABLE=0`) the
//!   call succeeds with a NULL window.
//!
//! Destroying or aborting a communicator releases its registrations and windows, as
//! NCCL does.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};

use crate::handle::{h2p, p2h};
use crate::macros::mock_fns;
use crate::state::{Reg, State, fail};
use crate::thread_groups::in_group;
use crate::world::NWorld;
use nccl_sys::*;

/// The answer of a registration that succeeded on communicator `h`: after
/// `MockNcclWorld::slow_registrations`, on a non-blocking communicator, its async error
/// says "in progress" for that many polls, and the call answers `ncclInProgress` (inside
/// a group, success: NCCL answers for the group at its end); else success.
fn slow(w: &NWorld, s: &mut State, h: usize) -> ncclResult_t {
    let polls = s.slow_registrations;
    match s.comms.get_mut(&h) {
        Some(c) if polls > 0 && !c.blocking => {
            c.slow_polls = polls;
            if in_group(w.id) {
                ncclResult_t::ncclSuccess
            } else {
                ncclResult_t::ncclInProgress
            }
        }
        _ => ncclResult_t::ncclSuccess,
    }
}

/// The allocator name NCCL memory carries in the driver.
const NCCL_MEM: &str = "ncclMemAlloc";

/// The host page size NCCL rounds local registrations to (`sysconf(_SC_PAGESIZE)` on the
/// hosts the mock stands for).
const PAGE: u64 = 4096;

/// Communicator `comm` was destroyed or aborted by `by`: NCCL releases its registrations
/// and windows with it.
pub(super) fn release_comm(w: &NWorld, s: &mut State, comm: usize, by: &'static str) {
    let gone: Vec<usize> = s
        .regs
        .iter()
        .filter(|(_, r)| r.comm == comm)
        .map(|(h, _)| *h)
        .collect();
    for h in gone {
        if let Some(p) = s.regs.remove(&h).and_then(|r| r.win) {
            p.clique.rma().window_gone(p.rank, p.seq);
        }
        s.dead_regs.insert(h, by);
        w.cuda.unpin(h as u64);
    }
}

/// Checks and removes registration `h` of `comm` for `call` (`window`: which kind).
fn deregister(
    w: &NWorld,
    s: &mut State,
    call: &'static str,
    comm: usize,
    h: usize,
    window: bool,
) -> ncclResult_t {
    let what = if window { "window" } else { "registration" };
    let problem = match s.regs.get(&h) {
        None => Some(match s.dead_regs.get(&h) {
            Some(by) => format!("{call}: {what} {h:#x} was already released by {by}"),
            None => format!("{call}: {h:#x} is not a {what}"),
        }),
        Some(r) if r.comm != comm => Some(format!(
            "{call}: {what} {h:#x} belongs to communicator {:#x}, not {comm:#x}",
            r.comm
        )),
        Some(r) if r.window != window => {
            Some(format!("{call}: {h:#x} is a {}, not a {what}", r.kind()))
        }
        Some(_) => None,
    };
    if let Some(m) = problem {
        w.cuda.report(m.clone());
        return fail(s, ncclResult_t::ncclInvalidArgument, m);
    }
    if let Some(r) = s.regs.get_mut(&h)
        && r.refs > 1
    {
        // NCCL only drops a reference; the registration stays, with its range.
        r.refs -= 1;
        return ncclResult_t::ncclSuccess;
    }
    let Some(r) = s.regs.remove(&h) else {
        return ncclResult_t::ncclInternalError;
    };
    if let Some(p) = &r.win {
        p.clique.rma().window_gone(p.rank, p.seq);
    }
    let mut uses: Vec<_> = r.uses.iter().collect();
    uses.sort_by_key(|(k, _)| **k);
    for (key, (stamp, used_by)) in uses {
        if !w.cuda.host_waited_for(*key, *stamp) {
            w.cuda.report(format!(
                "{call} of {what} {h:#x} ({:#x}+{}): work enqueued on stream {key:#x} ({used_by}) may still use it: the host did not wait for it",
                r.ptr, r.len
            ));
        }
    }
    s.dead_regs.insert(h, call);
    w.cuda.unpin(h as u64);
    ncclResult_t::ncclSuccess
}

/// Checks that `[ptr, ptr + size)` is device memory of `comm`'s device; its allocation.
fn check_memory(
    w: &NWorld,
    s: &mut State,
    what: &str,
    ptr: u64,
    size: usize,
    device: i32,
) -> Result<cuda_mock::AllocationInfo, ncclResult_t> {
    if size == 0 {
        return Err(fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!("{what}: size 0"),
        ));
    }
    match w.cuda.allocation_of(ptr, size) {
        Some(a) if a.device == device => Ok(a),
        Some(a) => Err(fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!(
                "{what}: memory of device {}, communicator of device {device}",
                a.device
            ),
        )),
        None => Err(fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!("{what}: {ptr:#x} ({size} bytes) is not in one device allocation"),
        )),
    }
}

mock_fns! {
    fn ncclMemAlloc = mem_alloc(w, s, ptr: *mut *mut c_void, size: usize) {
        if ptr.is_null() || size == 0 {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: null pointer or size 0"));
        }
        // NCCL allocates whole granules (cuMem): never a page shared with other memory.
        match w.cuda.alloc_foreign(size.next_multiple_of(PAGE as usize), NCCL_MEM) {
            Ok(p) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *ptr = std::ptr::with_exposed_provenance_mut(p as usize) };
                ncclResult_t::ncclSuccess
            }
            Err(e) => fail(&mut s, ncclResult_t::ncclUnhandledCudaError, format!("{CALL}: {e:?}")),
        }
    }
    fn ncclMemFree = mem_free(w, s, ptr: *mut c_void) {
        if ptr.is_null() {
            return ncclResult_t::ncclSuccess;
        }
        match w.cuda.free_foreign(ptr.addr() as u64, "ncclMemFree", NCCL_MEM) {
            Ok(()) => ncclResult_t::ncclSuccess,
            Err(_) => fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: {:#x} is not NCCL memory", ptr.addr())),
        }
    }
    fn ncclCommRegister = comm_register(w, s, comm: ncclComm_t, buff: *mut c_void, size: usize, handle: *mut *mut c_void) {
        let h = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        if handle.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: null handle"));
        }
        if !w.local_registration {
            // NCCL_LOCAL_REGISTER=0: no registration, and no error.
            // SAFETY: checked non-null out-pointer.
            unsafe { *handle = std::ptr::null_mut() };
            return ncclResult_t::ncclSuccess;
        }
        let device = s.comms.get(&h).map(|c| c.device).unwrap_or(-1);
        if let Err(rc) = check_memory(w, &mut s, CALL, buff.addr() as u64, size, device) {
            return rc;
        }
        // Whole pages, as NCCL registers them; an existing registration that covers them
        // is handed out again (reference-counted).
        let begin = buff.addr() as u64 & !(PAGE - 1);
        let end = (buff.addr() as u64 + size as u64).next_multiple_of(PAGE);
        let shared = s
            .regs
            .iter_mut()
            .filter(|(_, x)| x.comm == h && !x.window && x.ptr <= begin && end <= x.ptr + x.len as u64)
            .min_by_key(|(k, _)| **k)
            .map(|(k, x)| {
                x.refs += 1;
                *k
            });
        let r = match shared {
            Some(r) => r,
            None => {
                let r = s.handle(w.id);
                s.regs.insert(r, Reg { comm: h, ptr: begin, len: (end - begin) as usize, window: false, win: None, refs: 1, uses: HashMap::new() });
                w.cuda.pin(buff.addr() as u64, r as u64, format!("NCCL registration {r:#x} of communicator {h:#x} (ncclCommRegister)"));
                r
            }
        };
        // SAFETY: checked non-null out-pointer.
        unsafe { *handle = h2p(r) };
        slow(w, &mut s, h)
    }
    fn ncclCommDeregister = comm_deregister(w, s, comm: ncclComm_t, handle: *mut c_void) {
        let h = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        if handle.is_null() {
            return ncclResult_t::ncclSuccess;
        }
        deregister(w, &mut s, CALL, h, p2h(handle), false)
    }
    fn ncclCommWindowRegister = window_register(w, s, comm: ncclComm_t, buff: *mut c_void, size: usize, win: *mut ncclWindow_t, flags: c_int) {
        let h = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        if win.is_null() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("{CALL}: null window pointer"));
        }
        if !w.windows {
            // NCCL_WIN_ENABLE=0: no window, and no error.
            // SAFETY: checked non-null out-pointer.
            unsafe { *win = std::ptr::null_mut() };
            return ncclResult_t::ncclSuccess;
        }
        let device = match s.comms.get(&h) {
            Some(c) => c.device,
            None => return ncclResult_t::ncclInternalError,
        };
        let a = match check_memory(w, &mut s, CALL, buff.addr() as u64, size, device) {
            Ok(a) => a,
            Err(rc) => return rc,
        };
        if a.foreign != Some(NCCL_MEM) {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!(
                "{CALL}: {:#x} is not memory from ncclMemAlloc (windows need cuMem memory)", buff.addr()
            ));
        }
        let offset = buff.addr() as u64 - a.start;
        if !offset.is_multiple_of(u64::from(NCCL_WIN_REQUIRED_ALIGNMENT)) {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!(
                "{CALL}: offset {offset} into its allocation is not a multiple of {NCCL_WIN_REQUIRED_ALIGNMENT}"
            ));
        }
        // Collective: the ranks' n-th windows of one communicator are one place. Their sizes
        // may differ, as NCCL allows (it maps the largest); a put that does not fit the
        // peer's is reported when it runs.
        let seq = {
            let n = s.win_seq.entry(h).or_insert(0);
            *n += 1;
            *n
        };
        let r = s.handle(w.id);
        let place = s.comms.get(&h).and_then(|c| Some(crate::rma::WinPlace { clique: c.clique.clone()?, rank: c.rank, seq, flags }));
        if let Some(p) = &place {
            p.clique.rma().window_added(&w.cuda, p.rank, p.seq, buff.addr() as u64, size);
        }
        s.regs.insert(r, Reg { comm: h, ptr: buff.addr() as u64, len: size, window: true, win: place, refs: 1, uses: HashMap::new() });
        w.cuda.pin(buff.addr() as u64, r as u64, format!("NCCL window {r:#x} of communicator {h:#x} (ncclCommWindowRegister)"));
        // SAFETY: checked non-null out-pointer.
        unsafe { *win = h2p(r) };
        slow(w, &mut s, h)
    }
    fn ncclCommWindowDeregister = window_deregister(w, s, comm: ncclComm_t, win: ncclWindow_t) {
        let h = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        if win.is_null() {
            return ncclResult_t::ncclSuccess;
        }
        deregister(w, &mut s, CALL, h, p2h(win), true)
    }
}
