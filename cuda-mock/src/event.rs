//! Events: records in stream order (carrying the recording stream's clock, so waits and
//! synchronisations order later work for the sanitizer), timing, waits.

use std::ffi::c_uint;
use std::time::Instant;

use crate::current::current;
use crate::handle::{h2p, p2h};
use crate::macros::mock_fns;
use crate::op::{Op, OpKind};
use crate::queue::{capture_origin, enqueue, stream_ctx};
use crate::sanitizer::Clock;
use crate::state::EventInfo;
use cuda_sys::*;

mock_fns! {
    fn cuEventCreate = cu_event_create(w, s, out: *mut CUevent, flags: c_uint) [init] {
        let ctx = match current(w, &s) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if out.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let timing = flags & CUevent_flags::CU_EVENT_DISABLE_TIMING.0 == 0;
        let h = s.handle(w.id);
        s.events.insert(h, EventInfo { ctx, timing, recorded: None, clock: Clock::default(), capture: None });
        // SAFETY: checked non-null out-pointer.
        unsafe { *out = h2p(h) };
        CUresult::CUDA_SUCCESS
    }
    fn cuEventDestroy = cu_event_destroy(w, s, event: CUevent) [init] {
        let _ = w;
        match s.events.remove(&p2h(event)) {
            Some(_) => CUresult::CUDA_SUCCESS,
            None => CUresult::CUDA_ERROR_INVALID_HANDLE,
        }
    }
    fn cuEventRecord = cu_event_record(w, s, event: CUevent, stream: CUstream) [init] {
        let h = p2h(event);
        let Some(ev_ctx) = s.events.get(&h).map(|e| e.ctx) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        match stream_ctx(w, &s, stream) {
            Ok(c) if c == ev_ctx => {
                let origin = capture_origin(&s, p2h(stream));
                if let Some(e) = s.events.get_mut(&h) {
                    e.capture = origin;
                }
                enqueue(w, s, stream, Op::new("cuEventRecord", OpKind::Record { event: h }))
            }
            Ok(_) => CUresult::CUDA_ERROR_INVALID_HANDLE,
            Err(e) => e,
        }
    }
    fn cuEventSynchronize = cu_event_synchronize(w, s, event: CUevent) [init] {
        let _ = w;
        event_complete(&mut s, event)
    }
    fn cuEventQuery = cu_event_query(w, s, event: CUevent) [init] {
        let _ = w;
        event_complete(&mut s, event)
    }
    fn cuEventElapsedTime = cu_event_elapsed_time(w, s, ms: *mut f32, start: CUevent, end: CUevent) [init] {
        let _ = w;
        if ms.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let (Some(a), Some(b)) = (s.events.get(&p2h(start)), s.events.get(&p2h(end))) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        if !a.timing || !b.timing {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        }
        let (Some(ta), Some(tb)) = (a.recorded, b.recorded) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        let d = if tb >= ta { (tb - ta).as_secs_f32() } else { -(ta - tb).as_secs_f32() };
        // SAFETY: checked non-null out-pointer.
        unsafe { *ms = d * 1000.0 };
        CUresult::CUDA_SUCCESS
    }
    fn cuCtxRecordEvent = cu_ctx_record_event(w, s, ctx: CUcontext, event: CUevent) [init] {
        let _ = w;
        let h = p2h(event);
        // Captures all work of the context; over-approximated to all work of the world.
        let all = s.all_work();
        match s.events.get_mut(&h) {
            Some(e) if e.ctx == p2h(ctx) => {
                e.recorded = Some(Instant::now());
                e.clock = all;
                CUresult::CUDA_SUCCESS
            }
            _ => CUresult::CUDA_ERROR_INVALID_HANDLE,
        }
    }
    fn cuCtxWaitEvent = cu_ctx_wait_event(w, s, ctx: CUcontext, event: CUevent) [init] {
        let _ = w;
        let c = p2h(ctx);
        if s.contexts.contains_key(&c) && let Some(clock) = s.events.get(&p2h(event)).map(|e| e.clock.clone()) {
            // Every stream of the context (its legacy stream too) waits for the event.
            let keys: Vec<usize> = s.streams.iter().filter(|(_, st)| st.ctx == c).map(|(k, _)| *k).chain([c]).collect();
            for k in keys {
                s.stream_join(k, &clock);
            }
            CUresult::CUDA_SUCCESS
        } else {
            CUresult::CUDA_ERROR_INVALID_HANDLE
        }
    }
}

/// A recorded event is complete (work runs at enqueue): the host is now ordered after
/// what it captured. For cuEventSynchronize and cuEventQuery alike.
fn event_complete(s: &mut crate::state::State, event: CUevent) -> CUresult {
    match s.events.get(&p2h(event)).map(|e| e.clock.clone()) {
        Some(clock) => {
            s.host_join(&clock);
            CUresult::CUDA_SUCCESS
        }
        None => CUresult::CUDA_ERROR_INVALID_HANDLE,
    }
}
