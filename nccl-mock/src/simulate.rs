//! `ncclGroupSimulateEnd` (2.22): the end of a group that predicts its time instead of
//! launching it; above the groups (it ends one as `ncclGroupEnd` does).
//!
//! As NCCL's `ncclGroupEndInternal(simInfo)`: a NULL `simInfo` is a plain group end; a
//! nested one only closes a level; the outermost checks the struct's magic
//! (`NCCL_SIM_INFO_INITIALIZER`; else the group ends running nothing, with
//! `ncclInvalidArgument`), runs the group's inits and splits, launches none of its
//! collectives and send/recv of blocking communicators (each rank's part is withdrawn, so
//! a peer that really launched its part fails rather than waits, as it would hang on
//! NCCL), and writes `estimatedTime` in microseconds (NCCL's tuning model's unit). A group
//! with work of non-blocking communicators is launched in the background and answers
//! `ncclInProgress` without an estimate, as NCCL's non-blocking group path ignores
//! `simInfo`.
//!
//! The simulated model: each call costs [`LATENCY_US`] plus its largest buffer at
//! [`BYTES_PER_US`]; a group costs the sum of its calls.

use crate::group::{finish, is_blocking};
use crate::macros::mock_fns;
use crate::state::fail;
use crate::thread_groups::{Deferred, leave};
use crate::world::NWorld;
use nccl_sys::{ncclResult_t, ncclSimInfo_t};

/// The simulated latency of one call, in microseconds.
pub const LATENCY_US: f32 = 10.0;
/// The simulated bandwidth, in bytes per microsecond (100 GB/s).
pub const BYTES_PER_US: f32 = 100_000.0;

/// `NCCL_SIM_INFO_INITIALIZER`'s magic.
const MAGIC: u32 = 0x7468_5283;

/// The simulated time of one call moving `bytes` (its largest buffer), in microseconds.
pub(crate) fn predict(bytes: usize) -> f32 {
    LATENCY_US + bytes as f32 / BYTES_PER_US
}

fn simulate_end(w: &NWorld, sim: *mut ncclSimInfo_t) -> ncclResult_t {
    if sim.is_null() {
        return crate::group::group_end_plain(w);
    }
    let Some((work, error)) = leave(w.id) else {
        return fail(
            &mut w.lock(),
            ncclResult_t::ncclInvalidUsage,
            "ncclGroupEnd: not in a group call.".into(),
        );
    };
    if crate::thread_groups::in_group(w.id) {
        // A nested level: only closed, as NCCL does before reading simInfo.
        return ncclResult_t::ncclSuccess;
    }
    // NCCL reads min(size, sizeof) bytes of the caller's struct.
    // SAFETY: non-NULL; the caller's struct, of at least its `size` field.
    let given = unsafe { sim.cast::<usize>().read_unaligned() };
    let size = given.min(size_of::<ncclSimInfo_t>());
    let mut info = nccl_sys::NCCL_SIM_INFO_INITIALIZER;
    info.magic = 0;
    // SAFETY: `size` bytes of the caller's struct into ours, which holds at least as many.
    unsafe { std::ptr::copy_nonoverlapping(sim.cast::<u8>(), (&raw mut info).cast::<u8>(), size) };
    if info.magic != MAGIC {
        let rc = ncclResult_t::ncclInvalidArgument;
        w.lock()
            .error("ncclSimInfo_t argument not initialized via NCCL_SIM_INFO_INITIALIZER".into());
        return finish(w, work, Some(rc));
    }
    if error.is_some() {
        return finish(w, work, error);
    }
    if work.is_empty() {
        // Nothing to launch: NCCL leaves simInfo as it was.
        return ncclResult_t::ncclSuccess;
    }
    if work
        .iter()
        .any(|d| matches!(d, Deferred::Work(x) if !is_blocking(w, x.comm())))
    {
        // NCCL's non-blocking group path launches for real and ignores simInfo.
        return finish(w, work, None);
    }
    let mut time = 0.0f32;
    let mut rest = Vec::new();
    for d in work {
        match d {
            Deferred::Work(x) => {
                time += predict(x.touches.iter().map(|t| t.len).max().unwrap_or(0));
                x.cancel();
            }
            other => rest.push(other),
        }
    }
    let rc = if rest.is_empty() {
        ncclResult_t::ncclSuccess
    } else {
        finish(w, rest, None)
    };
    if rc == ncclResult_t::ncclSuccess {
        info.estimatedTime = time;
        // SAFETY: `size` bytes back into the caller's struct, as NCCL copies them.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const info).cast::<u8>(), sim.cast::<u8>(), size)
        };
    }
    rc
}

mock_fns! {
    fn ncclGroupSimulateEnd = group_simulate_end(w, s, sim: *mut ncclSimInfo_t) {
        drop(s);
        simulate_end(w, sim)
    }
}
