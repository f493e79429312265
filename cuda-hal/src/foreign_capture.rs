//! Work this crate enqueues on a stream that another library is capturing is recorded
//! into that library's graph, which may launch it for as long as the graph or an
//! instance of it lives, which nothing here sees. What the work uses is kept by a CUDA
//! user object whose one reference the capturing graph owns: CUDA calls its destructor
//! once the graph, every executable graph made from it and their pending launches are
//! gone, and the destructor (which may not call CUDA) hands the hold to this crate's
//! release queue, which lets it go at the crate's next release.

use std::ffi::c_void;

use cuda_sys::{
    CUgraph, CUstreamCaptureStatus, CUuserObject, CUuserObject_flags, CUuserObjectRetain_flags,
};

use crate::tracking::KeepAlive;
use crate::{Error, Result, Stream};

/// Gives `what` to the graph that is recording `stream`'s work, for as long as that graph
/// and its instances live. `Ok(false)`: the stream is not being captured (nothing to
/// keep). On `Err` the hold may already belong to CUDA, or not: the caller leaks it.
pub(crate) fn give_to_capturing_graph(stream: &Stream, what: &KeepAlive) -> Result<bool> {
    let cuda = stream.context().cuda();
    let _g = stream.context().bind()?;
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: a live stream; valid out-pointers; the id and dependency outputs are
    // optional (null: not asked for).
    let rc = unsafe {
        (cuda.fns().cuStreamGetCaptureInfo)(
            stream.as_raw(),
            &mut status,
            std::ptr::null_mut(),
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    cuda.check(rc, "cuStreamGetCaptureInfo")?;
    if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Ok(false);
    }
    if graph.is_null() {
        return Err(Error::InvalidArgument {
            what: "cuStreamGetCaptureInfo",
            problem: "an active capture without a graph".into(),
        });
    }
    let hold = Box::into_raw(Box::new(what.clone()));
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
        drop(unsafe { Box::from_raw(hold) });
        return Err(e);
    }
    // SAFETY: `graph` is the graph of the capture recording this stream, which lives while
    // that capture runs. The capture is another library's: this crate cannot keep it from
    // ending, but the caller of `Stream::from_owner` (or the library behind
    // `Stream::from_cudarc`) does not end it on another thread while work is being
    // enqueued on its stream through this crate (the documented contract of a shared
    // stream). Our one reference is moved to the graph.
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
    cuda.check(rc, "cuGraphRetainUserObject").map(|()| true)
}

/// The user object's destructor: CUDA calls it on an internal thread, where no CUDA call
/// is allowed; the hold goes to the release queue.
unsafe extern "C" fn release_hold(ptr: *mut c_void) {
    let taken = std::panic::catch_unwind(|| {
        // SAFETY: the box `give_to_capturing_graph` made, handed to this destructor once.
        let hold = unsafe { Box::from_raw(ptr.cast::<KeepAlive>()) };
        crate::queued::queue_only(hold);
    });
    // Never unwind into the driver.
    let _ = taken;
}
