//! User objects (`cuUserObjectCreate`): a reference-counted pointer with a destructor,
//! whose references a graph can own (`cuGraphRetainUserObject`, also on the graph a
//! capture is recording, as `cuStreamGetCaptureInfo` names it). As CUDA documents: an
//! executable graph owns copies of its graph's references; a graph's or executable
//! graph's references go when it is destroyed (after its pending launches, which here run
//! at launch); the destructor runs when the last reference goes, on another thread than
//! the caller's, and must not call CUDA: a call from it is a sanitizer finding.

use std::ffi::c_void;

use crate::destructor::{Due, UserObj, run_destructors};
use crate::handle::{h2p, p2h};
use crate::macros::mock_fns;
use crate::queue::capture_origin;
use crate::state::State;
use cuda_sys::*;

impl State {
    /// Drops `count` references of user object `obj`; the destructor due if it was the last.
    fn release_user_object(&mut self, obj: usize, count: u64) -> Option<Due> {
        let o = self.user_objects.get_mut(&obj)?;
        o.refs = o.refs.saturating_sub(count);
        if o.refs > 0 {
            return None;
        }
        let o = self.user_objects.remove(&obj)?;
        Some(Due(o.destroy, o.ptr))
    }

    /// The references graph (or executable graph) `h` owns go with it.
    pub(crate) fn release_graph_refs(&mut self, h: usize) -> Vec<Due> {
        let refs = self.graph_refs.remove(&h).unwrap_or_default();
        refs.into_iter()
            .filter_map(|(obj, count)| self.release_user_object(obj, count))
            .collect()
    }

    /// An executable graph `exec` instantiated from graph `graph` owns copies of its
    /// references.
    pub(crate) fn copy_graph_refs(&mut self, graph: usize, exec: usize) {
        let refs = self.graph_refs.get(&graph).cloned().unwrap_or_default();
        for (obj, count) in &refs {
            if let Some(o) = self.user_objects.get_mut(obj) {
                o.refs += count;
            }
        }
        if !refs.is_empty() {
            self.graph_refs.insert(exec, refs);
        }
    }

    /// The graph handle of a running capture, where a capture records (a graph a
    /// reference can be retained on before it exists as `cuStreamEndCapture`'s).
    fn capturing_graph(&self, graph: usize) -> bool {
        self.streams
            .values()
            .any(|st| st.capture.is_some() && st.capture_graph == graph)
    }
}

mock_fns! {
    fn cuUserObjectCreate = cu_user_object_create(w, s, out: *mut CUuserObject, ptr: *mut c_void, destroy: CUhostFn, initial: std::ffi::c_uint, flags: std::ffi::c_uint) [init] {
        let Some(destroy) = destroy else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        if out.is_null()
            || initial == 0
            || initial > i32::MAX as u32
            || flags != CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0
        {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let h = s.handle(w.id);
        s.user_objects.insert(h, UserObj { ptr: ptr.expose_provenance(), destroy, refs: initial.into() });
        // SAFETY: checked non-null out-pointer.
        unsafe { *out = h2p(h) };
        CUresult::CUDA_SUCCESS
    }
    fn cuUserObjectRelease = cu_user_object_release(w, s, obj: CUuserObject, count: std::ffi::c_uint) [init] {
        let _ = w;
        let h = p2h(obj);
        match s.user_objects.get(&h) {
            Some(o) if count > 0 && u64::from(count) <= o.refs => {}
            _ => return CUresult::CUDA_ERROR_INVALID_VALUE,
        }
        let due = s.release_user_object(h, count.into());
        drop(s);
        run_destructors(due.into_iter().collect());
        CUresult::CUDA_SUCCESS
    }
    fn cuGraphRetainUserObject = cu_graph_retain_user_object(w, s, graph: CUgraph, obj: CUuserObject, count: std::ffi::c_uint, flags: std::ffi::c_uint) [init] {
        let _ = w;
        let (g, h) = (p2h(graph), p2h(obj));
        let known = s.graphs.contains_key(&g) || s.capturing_graph(g);
        let moving = flags == CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0;
        let refs = s.user_objects.get(&h).map_or(0, |o| o.refs);
        if !known
            || refs == 0
            || count == 0
            || !(flags == 0 || moving)
            || (moving && u64::from(count) > refs)
        {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        if !moving && let Some(o) = s.user_objects.get_mut(&h) {
            o.refs += u64::from(count);
        }
        s.graph_refs.entry(g).or_default().push((h, count.into()));
        CUresult::CUDA_SUCCESS
    }
    fn cuStreamGetCaptureInfo = cu_stream_get_capture_info(w, s, stream: CUstream, status: *mut CUstreamCaptureStatus, id: *mut cuuint64_t, graph: *mut CUgraph, deps: *mut *const CUgraphNode, ndeps: *mut usize) [init] {
        if status.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let key = match crate::queue::stream_key(w, &s, stream) {
            Ok((k, _)) => k,
            Err(e) => return e,
        };
        let recording = capture_origin(&s, key)
            .and_then(|o| s.streams.get(&o))
            .map(|st| st.capture_graph);
        // SAFETY: checked non-null out-pointer; the optional ones are written when given.
        unsafe {
            *status = match recording {
                Some(_) => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
                None => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
            };
            if let Some(g) = recording {
                if !id.is_null() {
                    *id = g as cuuint64_t;
                }
                if !graph.is_null() {
                    *graph = h2p(g);
                }
                if !deps.is_null() {
                    *deps = std::ptr::null();
                }
                if !ndeps.is_null() {
                    *ndeps = 0;
                }
            }
        }
        CUresult::CUDA_SUCCESS
    }
}
