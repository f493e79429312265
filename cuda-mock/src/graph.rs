//! Stream capture and graphs: a captured stream records its ops instead of running them;
//! a launched graph enqueues them again on the launch stream, where they are stamped and
//! checked as if just enqueued (so memory freed since capture is caught at replay).

use crate::handle::{h2p, p2h};
use crate::macros::mock_fns;
use crate::queue::{capturing, enqueue_from, stream_ctx};
use cuda_sys::*;

mock_fns! {
    fn cuStreamBeginCapture = cu_stream_begin_capture(w, s, stream: CUstream, mode: CUstreamCaptureMode) [init] {
        let graph = s.handle(w.id);
        match s.streams.get_mut(&p2h(stream)) {
            Some(st) if st.capture.is_none() => {
                st.capture = Some(Vec::new());
                st.capture_mode = Some((mode, std::thread::current().id()));
                st.capture_graph = graph;
                CUresult::CUDA_SUCCESS
            }
            Some(_) => CUresult::CUDA_ERROR_ILLEGAL_STATE,
            // The legacy default stream cannot be captured.
            None => CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        }
    }
    fn cuStreamEndCapture = cu_stream_end_capture(w, s, stream: CUstream, graph: *mut CUgraph) [init] {
        if graph.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let (ops, invalid, h) = match s.streams.get_mut(&p2h(stream)) {
            Some(st) => match st.capture.take() {
                Some(ops) => {
                    st.capture_mode = None;
                    let h = std::mem::take(&mut st.capture_graph);
                    (ops, std::mem::take(&mut st.capture_invalid), h)
                }
                None => return CUresult::CUDA_ERROR_ILLEGAL_STATE,
            },
            None => return CUresult::CUDA_ERROR_INVALID_HANDLE,
        };
        // The capture is over, whether it yields a graph or failed: CUDA releases every
        // stream that joined it either way (a stream left joined would have its work
        // recorded by the origin's next capture).
        let origin = p2h(stream);
        for st in s.streams.values_mut().filter(|st| st.joined == Some(origin)) {
            st.joined = None;
        }
        if invalid {
            // No graph: the references retained on it go now.
            let due = s.release_graph_refs(h);
            drop(s);
            crate::destructor::run_destructors(due);
            return CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        }
        let _ = w;
        s.graphs.insert(h, ops);
        // SAFETY: checked non-null out-pointer.
        unsafe { *graph = h2p(h) };
        CUresult::CUDA_SUCCESS
    }
    fn cuStreamIsCapturing = cu_stream_is_capturing(w, s, stream: CUstream, status: *mut CUstreamCaptureStatus) [init] {
        if status.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        if let Err(e) = stream_ctx(w, &s, stream) {
            return e;
        }
        let capturing = capturing(&s, p2h(stream));
        // SAFETY: checked non-null out-pointer.
        unsafe {
            *status = if capturing {
                CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
            } else {
                CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
            }
        };
        CUresult::CUDA_SUCCESS
    }
    fn cuGraphInstantiateWithFlags = cu_graph_instantiate(w, s, exec: *mut CUgraphExec, graph: CUgraph, flags: u64) [init] {
        let _ = flags;
        if exec.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let Some(ops) = s.graphs.get(&p2h(graph)).cloned() else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        let h = s.handle(w.id);
        s.execs.insert(h, ops);
        s.copy_graph_refs(p2h(graph), h);
        // SAFETY: checked non-null out-pointer.
        unsafe { *exec = h2p(h) };
        CUresult::CUDA_SUCCESS
    }
    fn cuGraphLaunch = cu_graph_launch(w, s, exec: CUgraphExec, stream: CUstream) [init] {
        let Some(ops) = s.execs.get(&p2h(exec)).cloned() else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        let mut s = s;
        for op in ops {
            let rc = enqueue_from(w, s, stream, op, "cuGraphLaunch: ");
            if rc != CUresult::CUDA_SUCCESS {
                return rc;
            }
            s = w.lock();
        }
        CUresult::CUDA_SUCCESS
    }
    fn cuGraphExecDestroy = cu_graph_exec_destroy(w, s, exec: CUgraphExec) [init] {
        let _ = w;
        // Its launches ran when they were enqueued: its references go now.
        let known = s.execs.remove(&p2h(exec)).is_some();
        destroyed(s, known, p2h(exec))
    }
    fn cuGraphDestroy = cu_graph_destroy(w, s, graph: CUgraph) [init] {
        let _ = w;
        let known = s.graphs.remove(&p2h(graph)).is_some();
        destroyed(s, known, p2h(graph))
    }
}

/// The end of a graph or executable graph `h` (`known`: it existed): the user-object
/// references it owned go, and the destructors due run once the world's lock is let go.
fn destroyed(
    mut s: std::sync::MutexGuard<'_, crate::state::State>,
    known: bool,
    h: usize,
) -> CUresult {
    if !known {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let due = s.release_graph_refs(h);
    drop(s);
    crate::destructor::run_destructors(due);
    CUresult::CUDA_SUCCESS
}
