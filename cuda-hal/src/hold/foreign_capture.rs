//! Work this crate enqueues on a stream that another library is capturing is recorded
//! into that library's graph, which may launch it for as long as the graph or an
//! instance of it lives, which nothing here sees. What the work uses is kept by a CUDA
//! user object whose one reference the capturing graph owns: CUDA calls its destructor
//! once the graph, every executable graph made from it and their pending launches are
//! gone, and the destructor (which may not call CUDA) hands the hold to this crate's
//! release queue, which lets it go at the crate's next release.

use std::any::Any;
use std::ffi::c_void;

use cuda_sys::{
    CUgraph, CUstream, CUstreamCaptureStatus, CUuserObject, CUuserObject_flags,
    CUuserObjectRetain_flags,
};

use crate::{Context, Error, Result};

/// What a graph keeps: the holds of the work it recorded (a `KeepAlive`), opaque here.
type Hold = Box<dyn Any + Send>;

/// Gives `hold` to the graph that is recording `stream`'s work (a stream of `ctx`), for as
/// long as that graph and its instances live. `Ok(false)`: the stream is not being
/// captured, and `hold` goes. On `Err` the hold is leaked (it may belong to CUDA already):
/// work may be recorded that uses what it keeps.
pub(crate) fn give_to_capturing_graph(ctx: &Context, stream: CUstream, hold: Hold) -> Result<bool> {
    let r = give(ctx, stream, hold);
    if let Err((e, Some(hold))) = r {
        std::mem::forget(hold);
        return Err(e);
    }
    r.map_err(|(e, _)| e)
}

/// [`give_to_capturing_graph`], the hold back with the error while it is still ours.
fn give(
    ctx: &Context,
    stream: CUstream,
    hold: Hold,
) -> std::result::Result<bool, (Error, Option<Hold>)> {
    let cuda = ctx.cuda();
    let _g = match ctx.bind() {
        Ok(g) => g,
        Err(e) => return Err((e, Some(hold))),
    };
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: a live stream; valid out-pointers; the id and dependency outputs are
    // optional (null: not asked for).
    let rc = unsafe {
        (cuda.fns().cuStreamGetCaptureInfo)(
            stream,
            &mut status,
            std::ptr::null_mut(),
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if let Err(e) = cuda.check(rc, "cuStreamGetCaptureInfo") {
        return Err((e, Some(hold)));
    }
    if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Ok(false);
    }
    if graph.is_null() {
        let e = Error::InvalidArgument {
            what: "cuStreamGetCaptureInfo",
            problem: "an active capture without a graph".into(),
        };
        return Err((e, Some(hold)));
    }
    let hold = Box::into_raw(Box::new(hold));
    let mut object: CUuserObject = std::ptr::null_mut();
    // SAFETY: `hold` is a live box that the destructor takes back exactly once (CUDA calls
    // it once, when the last reference goes); the one reference is ours until moved.
    let rc = unsafe {
        (cuda.fns().cuUserObjectCreate)(
            &mut object,
            hold.cast::<c_void>(),
            Some(release_hold),
            1,
            CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0,
        )
    };
    if let Err(e) = cuda.check(rc, "cuUserObjectCreate") {
        // SAFETY: not given to CUDA (the call failed): still ours, taken back once.
        let hold = *unsafe { Box::from_raw(hold) };
        return Err((e, Some(hold)));
    }
    // SAFETY: `graph` is the graph of the capture recording this stream, which lives while
    // that capture runs. The capture is another library's: this crate cannot keep it from
    // ending, but the callers of `Stream::from_owner` and `Stream::from_cudarc` (both
    // `unsafe` for this) promise that it is not ended on another thread while work is
    // being enqueued on its stream through this crate. Our one reference is moved to the
    // graph.
    let rc = unsafe {
        (cuda.fns().cuGraphRetainUserObject)(
            graph,
            object,
            1,
            CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0,
        )
    };
    // On failure the reference is still ours, and releasing it would run the destructor,
    // which releases the hold while the work may be captured: it is never released (the
    // hold, and with it what the work uses, leak whole).
    cuda.check(rc, "cuGraphRetainUserObject")
        .map(|()| true)
        .map_err(|e| (e, None))
}

/// The user object's destructor: CUDA calls it on an internal thread, where no CUDA call
/// is allowed; the hold goes to the release queue.
unsafe extern "C" fn release_hold(ptr: *mut c_void) {
    let taken = std::panic::catch_unwind(|| {
        // SAFETY: the box `give` made, handed to this destructor once.
        let hold = unsafe { Box::from_raw(ptr.cast::<Hold>()) };
        crate::hold::queued::queue_only(*hold);
    });
    // Never unwind into the driver.
    let _ = taken;
}
