//! Streams: creation, destruction, synchronisation, event waits and host functions (the
//! `cuStream*` calls); the work on them runs in [`crate::queue`].

use std::ffi::{c_int, c_uint, c_void};

use crate::current::current;
use crate::handle::{check_ptr, h2p, ok, p2h};
use crate::macros::mock_fns;
use crate::op::{Op, OpKind};
use crate::queue::{
    capture_origin, capturing, enqueue, forbidding_capture, stream_ctx, stream_key,
};
use crate::sanitizer::Clock;
use crate::state::{State, StreamInfo};
use crate::world::World;
use cuda_sys::*;

fn create_stream(w: &World, s: &mut State, out: *mut CUstream, flags: c_uint) -> CUresult {
    let ctx = match current(w, s) {
        Ok(c) => c,
        Err(e) => return e,
    };
    if out.is_null() || flags > 1 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let h = s.handle(w.id);
    s.streams.insert(
        h,
        StreamInfo {
            ctx,
            capture: None,
            capture_invalid: false,
            capture_mode: None,
            capture_graph: 0,
            joined: None,
            non_blocking: flags & CUstream_flags::CU_STREAM_NON_BLOCKING.0 != 0,
            clock: Clock::default(),
        },
    );
    // SAFETY: checked non-null out-pointer.
    unsafe { *out = h2p(h) };
    CUresult::CUDA_SUCCESS
}

mock_fns! {
    fn cuStreamCreate = cu_stream_create(w, s, out: *mut CUstream, flags: c_uint) [init] {
        create_stream(w, &mut s, out, flags)
    }
    fn cuStreamCreateWithPriority = cu_stream_create_with_priority(w, s, out: *mut CUstream, flags: c_uint, priority: c_int) [init] {
        let _ = priority;
        create_stream(w, &mut s, out, flags)
    }
    fn cuStreamDestroy = cu_stream_destroy(w, s, stream: CUstream) [init] {
        let _ = w;
        match s.streams.remove(&p2h(stream)) {
            Some(_) => CUresult::CUDA_SUCCESS,
            None => CUresult::CUDA_ERROR_INVALID_HANDLE,
        }
    }
    fn cuStreamSynchronize = cu_stream_synchronize(w, s, stream: CUstream) [init] {
        let (key, ctx) = match stream_key(w, &s, stream) {
            Ok(k) => k,
            Err(e) => return e,
        };
        // As on a real device: synchronising a capturing stream fails and spoils the
        // capture; so does any host synchronisation a running capture forbids this thread.
        if let Some(origin) = capture_origin(&s, key).or_else(|| forbidding_capture(&s))
            && let Some(st) = s.streams.get_mut(&origin)
        {
            st.capture_invalid = true;
            return CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        s.host_sync_stream(key, ctx);
        CUresult::CUDA_SUCCESS
    }
    fn cuStreamQuery = cu_stream_query(w, s, stream: CUstream) [init] {
        match stream_key(w, &s, stream) {
            Ok((key, ctx)) => {
                // Work runs at enqueue, so the stream is always idle: the host is now
                // ordered after it.
                s.host_sync_stream(key, ctx);
                CUresult::CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
    fn cuStreamWaitEvent = cu_stream_wait_event(w, s, stream: CUstream, event: CUevent, flags: c_uint) [init] {
        let _ = flags;
        let key = match stream_key(w, &s, stream) {
            Ok((key, _)) => key,
            Err(e) => return e,
        };
        let Some((clock, joins)) = s.events.get(&p2h(event)).map(|e| (e.clock.clone(), e.capture)) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        // Waiting for an event recorded in a running capture joins that capture.
        if let Some(origin) = joins
            && origin != key
            && !capturing(&s, key)
            && capturing(&s, origin)
            && let Some(st) = s.streams.get_mut(&key)
        {
            st.joined = Some(origin);
        }
        // Nothing is stamped while capturing (a captured wait orders nothing at replay:
        // the graph runs on one stream).
        if !capturing(&s, key) {
            s.stream_join(key, &clock);
        }
        CUresult::CUDA_SUCCESS
    }
    fn cuStreamGetCtx = cu_stream_get_ctx(w, s, stream: CUstream, pctx: *mut CUcontext) [init] {
        ok(stream_ctx(w, &s, stream).and_then(|c| {
            check_ptr(pctx)?;
            // SAFETY: checked non-null out-pointer.
            unsafe { *pctx = h2p(c) };
            Ok(())
        }))
    }
    fn cuStreamGetDevice = cu_stream_get_device(w, s, stream: CUstream, dev: *mut CUdevice) [init] {
        ok(stream_ctx(w, &s, stream).and_then(|c| {
            check_ptr(dev)?;
            let d = s.contexts.get(&c).map(|x| x.device).unwrap_or(0);
            // SAFETY: checked non-null out-pointer.
            unsafe { *dev = d };
            Ok(())
        }))
    }
    fn cuLaunchHostFunc = cu_launch_host_func(w, s, stream: CUstream, f: CUhostFn, data: *mut c_void) [init] {
        match f {
            Some(f) => enqueue(w, s, stream, Op::new("cuLaunchHostFunc", OpKind::HostFn { f, data: p2h(data) })),
            None => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }
}
